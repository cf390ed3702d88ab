"""The student edition: `make student-pack OUT=DIR [E="NAME ..."]` (scripts/exercises.py pack DIR).

A copy of the tree (the files git tracks, as they are now; no .git) in which:
  - the region of every exercise handed out (E; default every code exercise) holds its TODO instead
    of the real lines (the markers stay, so that `make exercise` and `make check` work there as here);
  - every other line of any file that repeats one of those lines (the ladder's later rungs repeat the
    earlier ones: stage2's update is stage1's, infinity's gathers are stage3's) is cut too, in the
    sources that are compiled, handed-out trainers included (there the learner writes it back, as in
    their solution of the exercise it comes from); any other file that quotes one (a doc, a test's
    recipe) is left out. STUDENT_EDITION.md lists what was cut and what was left out;
  - the compiled files whose text changed are carried as the instructor's objects of the real files
    (reference/obj/, machine code without debug information or source text), which the pack's
    Makefile copies into place instead of compiling the cut sources: the pack builds and runs as
    this tree does, and `make check` grades against the same real trainers;
  - an exercise that shares its file with another one handed out is graded against the real file with
    the other's region cut (reference/obj/<stage>/train@<exercise>.o), since the learner's copy has
    that region cut too; stage3_backward builds on the learner's own stage3_gather_release;
  - the catalogue of wrong and right solutions, the find-the-bug answers, the hidden grading runs
    and the grader's own tests are left out; the notebooks lose their folded answers and the
    answer variants in their metadata.
"""
import ast
import json
import os
import re
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import exercise_grader as grader  # noqa: E402

ROOT = grader.ROOT
# never in a pack: answers, the catalogue's tests, the hidden runs
LEFT_OUT = {"scripts/exercise_bugs.dat": "the find-the-bug answers",
            "scripts/exercise_hidden.py": "the hidden grading runs",
            "tests/teaching/exercise_selftest.py": "the grader's own tests (they grade the catalogue)",
            "tests/teaching/exercises_check.sh": "the grader's own tests",
            "tests/teaching/student_pack_check.sh": "the pack's own test (it needs the real tree)",
            "tests/teaching/grade_check.sh": "the hidden grading's test",
            "tests/teaching/notebooks_check.sh": "runs the notebooks with their answers, which the pack has not",
            "tests/teaching/workshop_check.sh": "checks the workshop plan's find-the-bug exercises, left out here"}
COMPILED = (".cpp", ".cu")
CUT = "// (cut from the student edition: a line of exercise {})"
# in a handed-out file, the learner's copy is built from it: the line must be written back
CUT_HANDED_OUT = ("// TODO(a line of exercise {}, cut from the student edition): write it here as in your "
                  "solution of {}")


def norm(s):
    return re.sub(r"\s+", " ", s).strip()


def code_of(line):
    """A line without its // comment, whitespace collapsed, without a trailing semicolon."""
    return norm(line.split("//")[0]).rstrip(";").strip()


def tracked_files():
    out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit("make student-pack: the tree is not a git checkout (its file list comes from git ls-files)")
    return [f for f in out.stdout.split("\0") if f and os.path.isfile(os.path.join(ROOT, f))]


def answer_lines(exercises):
    """{normalized code line: exercise name}: every line of every code exercise's real region that
    says something of its own. A line is not an answer when the exercise's TODO gives it (a helper to
    call, `release_unit(u)`), or when a file of the library, the tools or the tests that is not a
    trainer and holds no exercise has it too (`template <class T>`, `return bad`, a loop header)."""
    import exercises as X  # (the module beside this file: its exercises and their regions)
    files = tracked_files()
    owners = {ex.path for ex in X.EXERCISES if not ex.bug}
    # a rung's folder is trainer code, its train.cpp and the files beside it (tensor/pipe3d.cpp repeats
    # tensor/train.cpp's update): none of it makes a line generic
    with open(os.path.join(ROOT, "stages.txt")) as h:
        rungs = tuple(l.split()[0].lstrip("+") + "/" for l in h if l[:1].isalpha() or l.startswith("+"))
    generic_src = [f for f in files if f.endswith((".cpp", ".h")) and f not in owners and not f.startswith(rungs)
                   and not f.startswith(("scripts/", "docs/", "notebooks/"))]
    generic = set()
    for f in generic_src:
        with open(os.path.join(ROOT, f), errors="replace") as h:
            generic.update(code_of(l) for l in h)
    lines = {}
    for ex in exercises:
        if ex.bug:
            continue
        with open(os.path.join(ROOT, ex.path)) as h:
            real = h.read()
        given = norm(" ".join(X.todo_lines(ex)))
        # what the handed-out file itself shows outside the exercise's regions (GPipe's forwards, in
        # the file of 1F1B's) is given too
        shown = "\n".join(code_of(l) for l in X.with_region(real, ex.name, [X.PART] * (len(X.regions(real.split("\n"), ex.name)) - 1)).split("\n"))
        for l in X.region_body(real, ex.name):
            c = code_of(l)
            if len(c) >= 16 and c not in generic and c not in given and c not in shown:
                lines.setdefault(c, ex.name)
    return lines


def mentions(text, lines):
    """The answer lines a text quotes anywhere (in prose or a recipe too), on collapsed whitespace."""
    flat = norm(text)
    return sorted({c for c in lines if c in flat})


def holds(text, lines):
    """The answer lines this text's code holds (comments, whitespace and semicolons aside)."""
    return sorted({a for c in map(code_of, text.split("\n")) for a in lines if a in c})


def strip_catalogue(src):
    """exercises.py without the catalogue: every Exercise(...)'s wrong= and right= emptied."""
    tree = ast.parse(src)
    spans = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "Exercise":
            for kw in node.keywords:
                if kw.arg in ("wrong", "right"):
                    spans.append((kw.value.lineno, kw.value.col_offset, kw.value.end_lineno, kw.value.end_col_offset))
    lines = src.split("\n")
    for a, ac, b, bc in sorted(spans, reverse=True):
        first, last = lines[a - 1], lines[b - 1]
        lines[a - 1:b] = [first[:ac] + "()" + last[bc:]]
    return "\n".join(lines)


def strip_notebook(text):
    """A notebook without its folded answers and without the answers its metadata lists."""
    nb = json.loads(text)
    for c in nb.get("cells", []):
        src = "".join(c.get("source", []))
        if c.get("cell_type") == "markdown" and "<details>" in src:
            src = re.sub(r"<details>.*?</details>\s*", "(The answer is given by your instructor.)\n", src, flags=re.S)
            c["source"] = src.splitlines(True)
        meta = c.get("metadata", {}).get("nanozero")
        if meta:
            for k in ("accept", "wrong"):
                meta.pop(k, None)
    return json.dumps(nb, indent=1, ensure_ascii=False) + "\n"


def makefile_for_pack(text, host_arch, cuda):
    """The pack's Makefile: the CUDA setting and the CPU the reference objects were compiled for, and
    the rule that puts the reference objects where the build expects the objects of the cut files."""
    # (a comment on its own line: after a value, make keeps the spaces before it in the value)
    text = re.sub(r"^CUDA       \?= .*$", f"# the student edition: as reference/obj was built\nCUDA       := {cuda}",
                  text, flags=re.M)
    text = re.sub(r"^HOST_ARCH  \?= native$", f"# the student edition: the CPU of reference/obj\nHOST_ARCH  ?= {host_arch}",
                  text, flags=re.M)
    return text + """
# ---- the student edition (STUDENT_EDITION.md): the cut files' objects are the instructor's ----
REFERENCE_OBJ := $(patsubst reference/obj/%,$(BUILD)/obj/%,$(filter-out %@%,$(shell find reference/obj -name '*.o')))
$(REFERENCE_OBJ): $(BUILD)/obj/%.o: reference/obj/%.o
\t@mkdir -p $(dir $@)
\tcp $< $@
# a cut CUDA file's resource report (OBJ.ptxas, which `all` builds beside each CUDA object): the instructor's too
REFERENCE_PTXAS := $(patsubst reference/obj/%,$(BUILD)/obj/%,$(shell find reference/obj -name '*.ptxas'))
$(REFERENCE_PTXAS): $(BUILD)/obj/%.ptxas: reference/obj/%.ptxas
\t@mkdir -p $(dir $@)
\tcp $< $@
"""


def build(out, exercises_mod, only=None):
    """only: the exercises the pack hands out (names; default every code exercise)."""
    X = exercises_mod
    code = [ex for ex in X.EXERCISES if not ex.bug]
    if only:
        chosen = [X.find(n) for n in only.split()]
        bugs = [e.name for e in chosen if e.bug]
        if bugs:
            X.die(f"make student-pack: {bugs[0]} is a find-the-bug exercise, which the student edition leaves out; "
                  f"expected code exercises in E= (make exercise lists them)")
        code = [e for e in code if e in chosen]
    if os.path.exists(out) and (not os.path.isdir(out) or os.listdir(out)):
        X.die(f"make student-pack: {out} exists and is not empty; expected a new or empty directory "
              f"(nothing was written): choose another OUT")
    flags = grader.build_flags()
    arch = re.search(r"-m(?:arch|cpu)=(\S+)", flags["CXXFLAGS"])
    host_arch = arch.group(1) if arch else "native"
    cuda = 1 if "-DNZ_HAVE_CUDA" in flags["CXXFLAGS"] else 0
    lines = answer_lines(code)
    by_file = {}
    for ex in code:
        by_file.setdefault(ex.path, []).append(ex)
    texts, left_out, cut_files, cut_handed = {}, dict(), {}, {}
    for f in tracked_files():
        if f in LEFT_OUT:
            left_out[f] = LEFT_OUT[f]
            continue
        p = os.path.join(ROOT, f)
        try:
            with open(p, encoding="utf-8") as h:
                t = h.read()
        except UnicodeDecodeError:
            texts[f] = None  # binary: copied as it is (checked below like the rest)
            continue
        for ex in by_file.get(f, []):
            t = X.with_region(t, ex.name, X.todo_lines(ex))
        if f == "scripts/exercises.py":
            t = strip_catalogue(t)
        if f.endswith(".ipynb"):
            t = strip_notebook(t)
        if f.endswith(".mk") and any(x in t for x in ("train.cpp", "train.o", "COMMON_SRC", "train_mutants",
                                                      "tests/lib/mutants.mk") + tuple(by_file)):
            left_out[f] = "builds from sources the pack cuts (the tests' deliberately broken trainers, the CUDA emulator)"
            continue
        found = holds(t, lines) if f.endswith(COMPILED) else mentions(t, lines)
        if found and f.endswith(COMPILED):
            # a handed-out trainer repeats the rungs below it (stage2's update is stage1's): those
            # lines are cut too, and the learner writes them back in their copy
            cut = CUT_HANDED_OUT if f in by_file else CUT
            kept = []
            for l in t.split("\n"):
                hit = next((a for a in found if a in code_of(l)), None)
                if hit:
                    kept.append(re.match(r"\s*", l).group(0) + cut.format(lines[hit], lines[hit]))
                else:
                    kept.append(l)
            t = "\n".join(kept)
            cut_files[f] = found
            if f in by_file:
                cut_handed[f] = found
        elif found:
            left_out[f] = "holds the lines of " + ", ".join(sorted({lines[c] for c in found}))
            continue
        if f in by_file:
            cut_files.setdefault(f, [])
        if f == "Makefile":
            t = makefile_for_pack(t, host_arch, cuda)
        texts[f] = t
    # the objects of the cut files: this build's, of the real files
    objs = {f: os.path.join(grader.BUILD, "obj", os.path.splitext(f)[0] + ".o") for f in cut_files
            if cuda or not f.endswith(".cu")}
    # a CUDA file's object comes with its resource report (OBJ.ptxas, the Makefile's nvcc rule): carried too
    reports = {f: os.path.splitext(o)[0] + ".ptxas" for f, o in objs.items() if f.endswith(".cu")}
    c = subprocess.run(["make", "-s", "--no-print-directory"] +
                       [os.path.relpath(o, ROOT) for o in list(objs.values()) + list(reports.values())],
                       cwd=ROOT, capture_output=True, text=True)
    if c.returncode != 0:
        X.die("make student-pack: could not build the real objects: " + c.stderr.strip()[-500:])
    os.makedirs(out, exist_ok=True)
    for f, t in texts.items():
        dst = os.path.join(out, f)
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        if t is None:
            shutil.copy2(os.path.join(ROOT, f), dst)
        else:
            with open(dst, "w") as h:
                h.write(t)
            shutil.copymode(os.path.join(ROOT, f), dst)
    for f, o in objs.items():
        dst = os.path.join(out, "reference", "obj", os.path.splitext(f)[0] + ".o")
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        subprocess.run(["objcopy", "--strip-debug", o, dst], check=True)
        if f in reports:
            shutil.copy2(reports[f], os.path.splitext(dst)[0] + ".ptxas")
    # the exercises that share a file: the real file with the others' regions cut, compiled
    os.makedirs(os.path.join(out, "reference", "obj"), exist_ok=True)
    for f, exs in by_file.items():
        if len(exs) < 2:
            continue
        for ex in exs:
            if ex.name in X.BUILDS_ON:
                continue
            with open(os.path.join(ROOT, f)) as h:
                t = h.read()
            for other in exs:
                if other is not ex:
                    t = X.with_region(t, other.name, X.todo_lines(other))
            src = os.path.join(grader.WORK, "pack", f"{ex.name}.cpp")
            os.makedirs(os.path.dirname(src), exist_ok=True)
            with open(src, "w") as h:
                h.write(t)
            dst = os.path.join(out, "reference", "obj", os.path.dirname(f), f"train@{ex.name}.o")
            cxx = re.sub(r"-O\d", "-O0", flags["CXXFLAGS"]).replace("-MMD -MP", "")
            c = subprocess.run(f"{flags['CXX']} {cxx} -c {src} -o {dst}", shell=True, cwd=ROOT,
                               capture_output=True, text=True)
            if c.returncode != 0:
                X.die(f"make student-pack: could not compile {f} for {ex.name}: " + c.stderr.strip()[-500:])
    with open(os.path.join(out, "reference", "exercises.txt"), "w") as h:
        h.write("".join(e.name + "\n" for e in code))
    with open(os.path.join(out, "STUDENT_EDITION.md"), "w") as h:
        h.write(manifest(code, cut_files, left_out, flags, lines, cut_handed))
    size = sum(os.path.getsize(os.path.join(d, n)) for d, _, ns in os.walk(out) for n in ns)
    print(f"wrote the student edition to {out}: {sum(1 for _ in texts)} files, {size / 1e6:.1f} MB; "
          f"{len(code)} exercises cut, {len(cut_files)} sources carried as objects, {len(left_out)} files left out "
          f"(STUDENT_EDITION.md)")


def lines_of(v):
    return f"{len(v)} line" + ("s" if len(v) != 1 else "")


def manifest(code, cut_files, left_out, flags, lines, cut_handed):
    out = ["# The student edition", "", "Exercises handed out: " + ", ".join(e.name for e in code) + ".", "",
           "Every code exercise's region holds its TODO (`make exercise` lists them; `make check E=NAME` grades",
           "your copy against the real trainers, on the public grading runs). The real lines are not in this",
           "tree: the files below that were cut are built from the instructor's objects of the real files",
           "(reference/obj/: machine code without debug information), which the Makefile copies into build/",
           "instead of compiling the cut sources, so that every program runs as the real one does.", "",
           f"Built with: {flags['CXX']} {flags['CXXFLAGS']}", "",
           "Exercises that share a file: your copy of one has the other's region cut, and it is graded",
           "against the real file cut the same way (reference/obj/<stage>/train@<exercise>.o).",
           "stage3_backward builds on your stage3_gather_release (the backward calls its helpers):",
           "`make exercise E=stage3_backward` starts from your copy of it.", "",
           "## Sources carried as objects", ""]
    handed = {e.path for e in code}
    out += [f"- `{f}`" + (": its exercise regions" if f in handed else "")
            + (f"{',' if f in handed else ':'} {lines_of(v)} of other exercises cut" if v else "")
            for f, v in sorted(cut_files.items())]
    out += ["", "## Left out", ""] + [f"- `{f}`: {why}" for f, why in sorted(left_out.items())]
    out += ["", "## Lines of other exercises cut from the files handed out", "",
            "A trainer repeats the rungs below it (stage2's update is stage1's). Those lines are cut from it",
            "too, each marked `TODO(a line of exercise NAME, cut from the student edition)`: your copy of its",
            "exercise runs as the real trainer only once you write them back, as in your solution of NAME",
            "(`make check` grades the whole file against the real trainer).", ""]
    out += [f"- `{f}`: {lines_of(v)} of " + ", ".join(sorted({lines[c] for c in v}))
            for f, v in sorted(cut_handed.items())] or ["- none"]
    return "\n".join(out) + "\n"
