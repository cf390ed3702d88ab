#!/usr/bin/env bash
# The notebooks and `make plots` work: every notebook in notebooks/ is committed without outputs and
# runs headlessly twice (nbclient, from .venv): once with the reference answers filled in, where every
# exercise's self-check must pass (and so must the equivalent answers a learner may write, and the
# answer as committed must say "not answered yet"), and once with known wrong or incomplete answers,
# where every self-check must fail; no other cell may fail in either run. Then the checker itself
# (nzplots.check_answer) against a table of answers, and scripts/plots.py writes its figures (ten, and
# the pipeline's two when it is built).
# Prints NZRESULT lines for tests/run_all.sh. Trainers that are not built yet are skipped by the
# notebooks, and the skip is printed here. Binaries: $NZ_BIN_DIR, else build/bin. Runs go to a fresh
# directory shared by all notebooks and both runs of each (a run is made once, then read from there).
cd "$(dirname "$0")/../.."
py=.venv/bin/python
if ! "$py" -c 'import nbclient, nbformat, matplotlib' 2>/dev/null; then
  echo "NZRESULT FAIL notebooks (no .venv with nbclient, nbformat, matplotlib: run make deps)"
  exit 0
fi
NZ_RUNS_DIR=$(mktemp -d /tmp/nanozero-notebooks.XXXXXX)
export NZ_RUNS_DIR
trap 'rm -rf "$NZ_RUNS_DIR"' EXIT

"$py" - notebooks/*.ipynb <<'EOF'
# Every notebook runs twice, each time from top to bottom in a fresh kernel, with its exercises
# rewritten (the notebook on disk is never changed):
#   reference: each answer cell holds the reference answer (the ```python block in the folded
#     answer above it), and after its self-check come more answer/self-check pairs: the answer as
#     committed (None: "not answered yet", no error) and the equivalent answers listed in the answer
#     cell's metadata (nanozero.accept). Every one of these self-checks must say ✓, and no cell may fail.
#   wrong: each answer cell holds a known wrong or incomplete answer (nanozero.wrong), each of the
#     others in a pair of its own. Every one of these self-checks must fail (AssertionError), and no
#     other cell may.
# An exercise is a code cell tagged "answer" followed by a cell that calls nz.check_answer.
import copy, re, sys, time
import nbformat
from nbclient import NotebookClient

FENCE = re.compile(r"<details>.*?```python\n(.*?)```.*?</details>", re.S)
COLOURS = re.compile(r"\x1b\[[0-9;]*m")  # terminal colours in tracebacks


def exercises(nb):
    """[(answer cell index, name, reference source, accepted sources, wrong sources)], or raise."""
    out = []
    for i, c in enumerate(nb.cells):
        if "answer" not in c.metadata.get("tags", []):
            continue
        meta = c.metadata.get("nanozero", {})
        name = meta.get("exercise", f"cell {i}")
        check = nb.cells[i + 1] if i + 1 < len(nb.cells) else None
        assert check is not None and check.cell_type == "code" and "check_answer" in check.source, \
            f"exercise {name}: the cell after the answer cell must call nz.check_answer"
        md = [m for m in nb.cells[:i] if m.cell_type == "markdown"]
        refs = FENCE.findall(md[-1].source) if md else []
        assert refs, f"exercise {name}: the markdown above has no folded ```python reference answer"
        assert meta.get("wrong"), f"exercise {name}: no known wrong answers (metadata nanozero.wrong)"
        out.append((i, name, refs[-1].strip(), meta.get("accept", []), meta["wrong"]))
    return out


def variant(nb, exs, mode):
    """A copy of nb with the exercises rewritten; each self-check's metadata says what it must do."""
    nb = copy.deepcopy(nb)
    for i, name, ref, accept, wrong in reversed(exs):  # from the end: indices stay valid
        answer_cell, check_cell = nb.cells[i], nb.cells[i + 1]
        if mode == "reference":
            tries = [(ref, "right"), (answer_cell.source, "unanswered")] + [(a, "right") for a in accept]
        else:
            tries = [(w, "wrong") for w in wrong]
        cells = []
        for src, expect in tries:
            a = nbformat.v4.new_code_cell(src)
            c = nbformat.v4.new_code_cell(check_cell.source)
            c.metadata["nz_expect"] = [name, expect, src.splitlines()[0] if src else ""]
            cells += [a, c]
        nb.cells[i:i + 2] = cells
    return nb


def text(cell):
    return "".join(o.get("text", "") for o in cell.get("outputs", []) if o.get("output_type") == "stream")


def error(cell):
    errs = [o for o in cell.get("outputs", []) if o.get("output_type") == "error"]
    return COLOURS.sub("", f"{errs[0]['ename']}: {errs[0]['evalue']}") if errs else None


total = 0
for path in sys.argv[1:]:
    name = path.split("/")[-1].removesuffix(".ipynb")
    nb = nbformat.read(path, as_version=4)
    # Committed without outputs: the diff of a notebook is its text, not yesterday's figures.
    dirty = [i for i, c in enumerate(nb.cells)
             if c.cell_type == "code" and (c.get("outputs") or c.get("execution_count") is not None)]
    print(f"NZRESULT {'FAIL' if dirty else 'PASS'} notebooks.{name}.committed_without_outputs"
          + (f" (cells {dirty} have outputs; clear them before committing)" if dirty else ""))
    try:
        exs = exercises(nb)
    except AssertionError as e:
        print(f"NZRESULT FAIL notebooks.{name}.exercises_well_formed ({e})")
        continue
    total += len(exs)
    for mode in ("reference", "wrong"):
        run = variant(nb, exs, mode)
        t0 = time.time()
        try:
            NotebookClient(run, timeout=300, kernel_name="python3", allow_errors=True,
                           resources={"metadata": {"path": "notebooks"}}).execute()
        except Exception as e:  # kernel died, timeout, ...
            print(f"NZRESULT FAIL notebooks.{name}.{mode}_answers ({type(e).__name__}: {str(e)[:200]})")
            continue
        bad, checked = [], 0
        for i, c in enumerate(run.cells):
            if c.cell_type != "code":
                continue
            err = error(c)
            if "nz_expect" not in c.metadata:
                if err:
                    bad.append(f"cell {i} raised {err[:300]}")
                continue
            ex, expect, src = c.metadata["nz_expect"]
            checked += 1
            out = text(c).strip()
            if expect == "right" and (err or "✓" not in out):
                bad.append(f"exercise {ex}: `{src}` should pass: {err or out or 'no verdict printed'}")
            elif expect == "unanswered" and (err or "not answered yet" not in out):
                bad.append(f"exercise {ex}: the committed `{src}` should say 'not answered yet': {err or out}")
            elif expect == "wrong" and not (err or "").startswith("AssertionError"):
                bad.append(f"exercise {ex}: the wrong `{src}` should fail: {err or out or 'it passed'}")
        for line in bad:
            print("  " + line)
        skipped = {line for c in run.cells for line in text(c).splitlines() if line.startswith("not built yet")}
        for line in sorted(skipped):  # make the skipped trainers visible here too
            print(f"  {name}: {line}")
        verdict = "every self-check passes" if mode == "reference" else "every self-check fails"
        print(f"NZRESULT {'FAIL' if bad else 'PASS'} notebooks.{name}.{mode}_answers "
              f"({len(exs)} exercises, {checked} self-checks: {'see above' if bad else verdict}; "
              f"{time.time() - t0:.1f} s)")
ok = 12 <= total <= 45  # 17 on the ladder and inference, 3 pipeline, 1 infinity, 4 ZeRO++, 4 compression, 1 FAQ, 3 tensor, 3 Ulysses, 2 Muon
print(f"NZRESULT {'PASS' if ok else 'FAIL'} notebooks.exercise_count ({total} exercises in all, 12 to 45 wanted)")
EOF

# The checker itself (nzplots.check_answer): not answered yet passes quietly; a right answer passes,
# also rounded within the stated tolerance, as 5.0 for 5, "gradients" for "grads", "stage0" for
# "stage0_ddp", and a set given as a list or with a group name; a wrong answer, one outside the
# tolerance, a dict missing a key or with a key left at None or an unknown key, a list for a dict, an
# incomplete or overfull set, a bool for a number and a tuple of the wrong length fail.
"$py" - <<'EOF'
import contextlib, io, sys
sys.path.insert(0, "scripts")
import nzplots as nz
truth = {"stage0_ddp": 2.0, "stage1": 2.0, "stage2": 5.0, "stage3": 12.0, "offload": 5.0}
host = {"grads", "master", "adam_m", "adam_v"}
accept = [(None, truth, 0), (dict.fromkeys(truth), truth, 0), ((None, None), ("grads", 7), 0),
          ({"stage0_ddp": 2, "stage1": 2, "stage2": 5, "stage3": 12, "offload": 5}, truth, 0),
          ({"stage0": 2, "ZeRO-1": 2.0, "Stage 2": 5, "stage3": 12, "offload": 5}, truth, 0),
          (4, 4.0, 0), (2.0, 2, 0), (21.5, 21.5625, 0.02), (21.6, 21.5625, 0.02), (1.56e6, 1561152, 0.01),
          ("grads", "grads", 0), ("gradients", "grads", 0), ("Gradient", "grads", 0), ("DDP", "stage0_ddp", 0),
          (["gradients", "optimizer state"], host, 0), ({"grads", "master", "m", "v"}, host, 0),
          (("Gradients", 1561152), ("grads", 1561152), 0.01), ({"to host": 8, "h2d": 2}, {"down": 8, "up": 2}, 0)]
reject = [({"stage0_ddp": 2, "stage1": 2, "stage2": 5, "stage3": 12}, truth, 0),
          ({"stage0_ddp": 2, "stage1": 2, "stage2": 5, "stage3": 12, "offload": None}, truth, 0),
          ({"stage0_ddp": 8, "stage1": 8, "stage2": 5, "stage3": 12, "offload": 5}, truth, 0),
          ({"stage0_ddp": 2, "stage1": 2, "stage2": 5, "stage3": 12, "offload": 5, "stage4": 0}, truth, 0),
          ([2, 2, 5, 12, 5], truth, 0), (5, truth, 0), (3, 4.0, 0), (22, 21.5625, 0.02), (35.6, 21.5625, 0.02),
          ("21.6", 21.5625, 0.02), (True, 1, 0), ("params", "grads", 0), ("grads", 3, 0),
          ({"master", "adam_m", "adam_v"}, host, 0), ({"params", "grads", "master", "adam_m", "adam_v"}, host, 0),
          ("grads", host, 0), (("grads",), ("grads", 7), 0), (("grads", None), ("grads", 7), 0),
          (("params", 7), ("grads", 7), 0), ({"down": 2, "up": 8}, {"down": 8, "up": 2}, 0)]
bad = []
for answer, t, rel in accept:
    try:
        with contextlib.redirect_stdout(io.StringIO()):  # its messages are for the notebook reader
            nz.check_answer(answer, t, "self-check", rel=rel)
    except AssertionError as e:
        bad.append(f"rejected {answer!r} for {t!r}: {e}")
for answer, t, rel in reject:
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            nz.check_answer(answer, t, "self-check", rel=rel)
        bad.append(f"accepted {answer!r} for {t!r}")
    except AssertionError:
        pass
for line in bad:
    print("  " + line)
print(f"NZRESULT {'FAIL' if bad else 'PASS'} notebooks.self_check_rejects_wrong_and_incomplete_answers")
EOF

# make plots, on the runs the notebooks left behind.
out=$(mktemp -d /tmp/nanozero-plots.XXXXXX)
ok=1
log=$("$py" scripts/plots.py --out "$out" 2>&1) || ok=0
figs="memory_by_category memory_checkpointing largest_model memory_vs_ranks memory_timeline comm_per_step comm_vs_accum"
figs+=" zeropp_network zeropp_loss_vs_block compression"  # formulas and committed tables: no runs
[ -x "${NZ_BIN_DIR:-build/bin}/pipeline" ] && figs+=" pipeline_diagram pipeline_bubble"  # beside the ladder
for f in $figs; do [ -s "$out/$f.png" ] || ok=0; done
n=$(wc -w <<<"$figs")
if [ $ok = 1 ]; then
  echo "NZRESULT PASS plots.script_writes_its_figures ($n)"
else
  echo "$log"
  echo "NZRESULT FAIL plots.script_writes_its_figures (of $n; see the output above)"
fi
rm -rf "$out"
