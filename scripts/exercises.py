#!/usr/bin/env python3
"""Code exercises cut from the real trainers, and the grader that checks them.

    make exercise                 list the exercises, one a line, with their goal
    make exercise E=NAME          write exercises/NAME/<file>: the real file with one region
                                  (between `// begin exercise: NAME` and `// end exercise: NAME`)
                                  replaced by a TODO that states the goal and gives hints
    make check E=NAME             build exercises/NAME/<file> into its own binary and grade it

Because the regions are cut from the files the tests check, an exercise can never drift from the
code. The grader is the project's own equality contract (README "Exactly the same model"): the
learner's trainer must train the same model as the real one — every step's loss and gradient norm
and the saved model, bit for bit — hold the same bytes in every memory category, send the same
elements in the same collectives, and move the same bytes between host and device, on several
world sizes and accumulation counts. The verdict names what differs first and gives a hint about
the likely mistake. `python3 scripts/exercises.py selftest` (run by `make test`) grades each
reference solution (it must pass) and known wrong solutions (each must fail, with its hint).
"""
import json
import os
import re
import shutil
import signal
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUILD = os.path.join(ROOT, "build")
WORK = os.path.join(BUILD, "exercises")       # grader builds and runs
LEARNER = os.path.join(ROOT, "exercises")     # learners' copies (git-ignored)
FLAGS = ("--preset tiny --seq 32 --batch 2 --steps 4 --lr 3e-3 --warmup 2 --clip 0.5 "
         "--eval-every 0 --eval-windows 4 --quiet")
# (ranks, accum, extra flags): 3 ranks pad every unit; accum 3 makes accumulation matter; 2 ranks
# with accum 2 a second shape. stage3 also runs without prefetch (one gathered unit at a time).
CONFIGS = [(3, 1, ""), (3, 3, ""), (2, 2, "")]
STAGE3_CONFIGS = CONFIGS + [(3, 1, "--prefetch 0")]

BEGIN = re.compile(r"^(\s*)// begin exercise: (\S+)\s*$")
END = re.compile(r"^\s*// end exercise: (\S+)\s*$")


class Exercise:
    def __init__(self, name, path, stage, goal, todo, wrong=(), bug=None):
        self.name = name
        self.path = path        # the real file, relative to the repository
        self.stage = stage      # the trainer the grader runs
        self.goal = goal        # one line
        self.todo = todo        # what to write, and hints (lines of the TODO comment)
        # [(what the mistake is, the wrong region, expected hint)]; the wrong region is either its
        # whole text, or a list of (old, new) edits of the real region's text
        self.wrong = wrong
        self.bug = bug          # find-the-bug: (makefile, variable) holding the sed that breaks it

    @property
    def file(self):
        return os.path.basename(self.path)


EXERCISES = [
    Exercise(
        "stage1_reduce_scatter", "stage1/train.cpp", "stage1",
        "stage1: on the last micro-step, send each unit's gradient to the rank that owns each slice",
        ["The unit's gradient G(u) is complete on this rank (summed over the micro-steps).",
         "Sum it over the ranks so that each rank receives only the slice it owns, my_G(u), then",
         "turn the sum into the mean over ranks and micro-steps.",
         "Hints: comm.reduce_scatter(full, out_shard, shard_elems, dtype); owned(u) elements are",
         "yours; average_grads(dtype, grads, n, run.grad_average_scale())."],
        wrong=[("forgets to average",
                "comm.reduce_scatter(G(u), my_G(u), owned(u), dt);", "average"),
               ("all-reduces the whole unit instead",
                "comm.all_reduce(G(u), numel(u), dt);\n"
                "average_grads(dt, my_G(u), owned(u), run.grad_average_scale());", "all-reduce"),
               ("receives the sum into slice 0 instead of its own slice",
                "comm.reduce_scatter(G(u), G(u), owned(u), dt);\n"
                "average_grads(dt, my_G(u), owned(u), run.grad_average_scale());", "slice")]),
    Exercise(
        "stage1_update_and_gather", "stage1/train.cpp", "stage1",
        "stage1: update only the slice I own, then give every rank the updated parameters",
        ["AdamW has moments only for this rank's slice of unit u: update my_P(u) from my_G(u).",
         "Then every rank needs every other rank's updated slice to run the next forward.",
         "Hints: adam.step(u, params_slice, grads_slice, run.lr(), scale, run.adam_step());",
         "comm.all_gather(shard, out_full, shard_elems, dtype); P(u) is the whole unit."],
        wrong=[("never all-gathers",
                "adam.step(u, my_P(u), my_G(u), run.lr(), scale, run.adam_step());", "all-gather"),
               ("gathers before the update",
                "comm.all_gather(my_P(u), P(u), owned(u), dt);\n"
                "adam.step(u, my_P(u), my_G(u), run.lr(), scale, run.adam_step());", "update"),
               ("updates slice 0 of the unit with slice 0 of the gradient",
                "adam.step(u, P(u), G(u), run.lr(), scale, run.adam_step());\n"
                "comm.all_gather(my_P(u), P(u), owned(u), dt);", "update")]),
    Exercise(
        "stage2_reduce_scatter", "stage2/train.cpp", "stage2",
        "stage2: inside the backward, every micro-step, reduce-scatter the unit and keep my slice",
        ["model.backward just wrote unit u's full gradient into the bucket. Reduce-scatter it so",
         "that this rank receives the sum over ranks of the slice it owns, and add that slice,",
         "averaged, into my_G(u): the first micro-step writes, later ones add.",
         "Hints: L.shard(u, rank).begin is where my slice starts in the bucket (elem_ptr(bucket,",
         "index, e)); comm.reduce_scatter(full, out_shard, owned(u), dt); accumulate_grads(dt,",
         "dst, src, n, run.grad_average_scale(), first)."],
        wrong=[("forgets to average",
                "void* mine = elem_ptr(bucket, L.shard(u, rank).begin, e);\n"
                "comm.reduce_scatter(bucket.data(), mine, owned(u), dt);\n"
                "accumulate_grads(dt, my_G(u), mine, owned(u), 1.0f, k == 0);", "average"),
               ("overwrites instead of accumulating",
                "void* mine = elem_ptr(bucket, L.shard(u, rank).begin, e);\n"
                "comm.reduce_scatter(bucket.data(), mine, owned(u), dt);\n"
                "accumulate_grads(dt, my_G(u), mine, owned(u), run.grad_average_scale(), true);",
                "micro-step"),
               ("reduces only on the last micro-step, as stage1 does",
                "if (k == run.args.accum - 1) {\n"
                "  void* mine = elem_ptr(bucket, L.shard(u, rank).begin, e);\n"
                "  comm.reduce_scatter(bucket.data(), mine, owned(u), dt);\n"
                "  accumulate_grads(dt, my_G(u), mine, owned(u), run.grad_average_scale(), true);\n"
                "}", "reduce_scatter"),
               ("points at the next rank's slice (past the bucket's end on the last rank)",
                "void* mine = elem_ptr(bucket, L.shard(u, rank + 1).begin, e);\n"
                "comm.reduce_scatter(bucket.data(), mine, owned(u), dt);\n"
                "accumulate_grads(dt, my_G(u), mine, owned(u), run.grad_average_scale(), k == 0);",
                "past the end"),
               ("all-reduces the bucket",
                "comm.all_reduce(bucket.data(), L.units[u].padded, dt);\n"
                "void* mine = elem_ptr(bucket, L.shard(u, rank).begin, e);\n"
                "accumulate_grads(dt, my_G(u), mine, owned(u), run.grad_average_scale(), k == 0);",
                "all-reduce")]),
    Exercise(
        "stage3_gather_release", "stage3/train.cpp", "stage3",
        "stage3: gather a unit's parameters just before use, and release them right after",
        ["Define the three helpers the training loop calls:",
         "  gather_unit(u) -> const void*: unit u's full parameters, ready to use (all-gathered",
         "      into a fresh Buffer of Category::Gathered, unit.padded * e bytes, unless a prefetch",
         "      already started it: then wait for that one);",
         "  prefetch(u): when run.args.prefetch is set, START unit u's all-gather without waiting;",
         "  release_unit(u): free unit u's gathered buffer (only my slice my_P(u) stays).",
         "Hints: gathered[u] and in_flight[u] are declared above; comm.all_gather_start(shard,",
         "out_full, shard_elems, dt) returns a CommRequest; comm.wait(request); Buffer::release()."],
        wrong=[("never releases", [("{ gathered[u].release(); }", "{}")], "release"),
               ("prefetches even with --prefetch 0",
                [("if (run.args.prefetch) gather_start(u);", "gather_start(u);")], "prefetch"),
               ("books the gathered units as parameters",
                [("Category::Gathered", "Category::Params")], "Category::Gathered")]),
    Exercise(
        "stage3_backward", "stage3/train.cpp", "stage3",
        "stage3: the backward of one unit — gather it again, prefetch the next, release, reduce-scatter",
        ["For unit u of the backward (units in reverse order): get its parameters (the embedding's",
         "backward needs none: pass nullptr), start the next unit's gather early, run",
         "model.backward(u, params, bucket.data()), release the unit, then reduce-scatter the",
         "bucket and add my averaged slice into my_G(u) (the first micro-step writes).",
         "Hints: gather_unit(u), prefetch(u - 1) (not past block 1: the embedding needs no gather),",
         "release_unit(u), comm.reduce_scatter, accumulate_grads(..., run.grad_average_scale(), k == 0)."],
        wrong=[("gathers the embedding for its backward",
                [("u == EMBED ? nullptr : gather_unit(u)", "gather_unit(u)")], "all_gather"),
               ("never releases", [("release_unit(u);", "")], "release"),
               ("forgets to average", [("run.grad_average_scale()", "1.0f")], "average")]),
    Exercise(
        "offload_optimizer", "offload/train.cpp", "offload",
        "offload: run AdamW on the host for my slice, then send the updated slice up",
        ["My gradient slice my_G(u) is in host memory. Run the host AdamW on it, writing my",
         "updated parameters (storage type) into outbox(u), then copy them up into my slice of",
         "the device's parameters, my_P(u) (the all-gather that follows sends them to the others).",
         "Hints: host_adam.step(u, grads_slice, params_out, run.lr(), scale, run.adam_step());",
         "to_device(dst, src, elems)."],
        wrong=[("never copies the update up",
                "host_adam.step(u, my_G(u), outbox(u), run.lr(), scale, run.adam_step());", "up"),
               ("copies the update to slice 0 of the unit",
                "host_adam.step(u, my_G(u), outbox(u), run.lr(), scale, run.adam_step());\n"
                "to_device(P(u), outbox(u), owned(u));", "update"),
               ("ignores the clipping scale",
                "host_adam.step(u, my_G(u), outbox(u), run.lr(), 1.0f, run.adam_step());\n"
                "to_device(my_P(u), outbox(u), owned(u));", "update")]),
    Exercise(
        "comm_rank_ordered_sum", "common/comm.cpp", "stage2",
        "the collective layer: add the N ranks' contributions to my slice, in rank order",
        ["After the all-to-all, slice r of `full` (elements [r * shard, (r + 1) * shard)) holds",
         "rank r's contribution to my slice. Write out[i] = c_0[i] + c_1[i] + ... + c_{N-1}[i],",
         "added left to right in acc_t<T> (fp32 for bf16 data), stored once with store<T>.",
         "Why the order matters: floating-point addition is not associative, and every stage",
         "must get the same bits as stage0_ddp. Hints: load(x) reads an element as acc_t<T>."],
        wrong=[("adds in reverse rank order",
                "acc_t<T> acc = load(full[size_t(n_ranks - 1) * shard + i]);\n"
                "for (int r = n_ranks - 2; r >= 0; r--) acc += load(full[size_t(r) * shard + i]);\n"
                "out[i] = store<T>(acc);", "rank order"),
               ("keeps only rank 0's contribution",
                "out[i] = full[i];", "sum"),
               ("strides by one element instead of one slice",
                "acc_t<T> acc = load(full[i]);\n"
                "for (int r = 1; r < n_ranks; r++) acc += load(full[size_t(r) + i]);\n"
                "out[i] = store<T>(acc);", "slice")]),
]
# Find the bug: the deliberately broken trainers of the tests (tests/mutants.mk,
# tests/stage3_mutants.mk), handed out whole. Names do not give the bug away.
for i, (mk, var) in enumerate([("tests/mutants.mk", "STAGE2_MUTANT_SED_no_average"),
                               ("tests/mutants.mk", "STAGE2_MUTANT_SED_wrong_slice"),
                               ("tests/mutants.mk", "STAGE2_MUTANT_SED_last_microbatch_only")]):
    EXERCISES.append(Exercise(
        f"bug_stage2_{'abc'[i]}", "stage2/train.cpp", "stage2",
        "find the bug: this stage2 trains, but not the same model as the real one; fix one line",
        [], bug=(mk, var)))
for i, (mk, var) in enumerate([("tests/stage3_mutants.mk", "STAGE3_MUTANT_SED_prefetch_across_steps"),
                               ("tests/stage3_mutants.mk", "STAGE3_MUTANT_SED_keep_gathered")]):
    EXERCISES.append(Exercise(
        f"bug_stage3_{'ab'[i]}", "stage3/train.cpp", "stage3",
        "find the bug: this stage3 runs, but differs from the real one; fix it",
        [], bug=(mk, var)))
BY_NAME = {e.name: e for e in EXERCISES}


def die(msg, code=2):
    print(msg, file=sys.stderr)
    sys.exit(code)


def find(name):
    if not name:
        die("which exercise? `make exercise` lists them; then `make exercise E=NAME`")
    if name not in BY_NAME:
        die(f"unknown exercise {name!r}; `make exercise` lists the {len(EXERCISES)} exercises")
    return BY_NAME[name]


# ---- cutting ----

def region(lines, name):
    """(first, last) line indices of the markers of exercise `name` (inclusive)."""
    begin = [i for i, l in enumerate(lines) if BEGIN.match(l) and BEGIN.match(l).group(2) == name]
    end = [i for i, l in enumerate(lines) if END.match(l) and END.match(l).group(1) == name]
    if len(begin) != 1 or len(end) != 1 or end[0] <= begin[0]:
        die(f"internal: exercise {name}: expected one `// begin exercise: {name}` and one matching end marker")
    return begin[0], end[0]


def with_region(text, name, body_lines, indent=None):
    """The file with the region's content replaced by body_lines (markers kept)."""
    lines = text.split("\n")
    a, b = region(lines, name)
    ind = BEGIN.match(lines[a]).group(1) if indent is None else indent
    return "\n".join(lines[:a + 1] + [ind + l if l else l for l in body_lines] + lines[b:])


def strip_other_markers(text):
    return "\n".join(l for l in text.split("\n") if not (BEGIN.match(l) or END.match(l)))


def broken_copy(ex):
    """Find-the-bug: the real file with the mutant's sed applied (the same sed the tests use)."""
    mk, var = ex.bug
    with open(os.path.join(ROOT, mk)) as f:
        text = f.read().replace("\\\n", " ")
    m = re.search(r"^" + re.escape(var) + r"\s*:=\s*(.*)$", text, re.M)
    if not m:
        die(f"internal: {var} not found in {mk}")
    args = m.group(1).strip().replace("$$", "$")
    cmd = f"sed {args}" if args.startswith("-e") else f"sed -e '{args}'"
    out = subprocess.run(cmd + " " + os.path.join(ROOT, ex.path), shell=True, capture_output=True, text=True)
    if out.returncode != 0:
        die(f"internal: {cmd} failed: {out.stderr}")
    return out.stdout


def learner_text(ex):
    with open(os.path.join(ROOT, ex.path)) as f:
        text = f.read()
    if ex.bug:
        return strip_other_markers(broken_copy(ex))
    todo = [f"// TODO(exercise {ex.name}): {ex.goal}"] + ["//   " + l for l in ex.todo] + [
        f"// Check your solution with: make check E={ex.name}"]
    return strip_other_markers(with_region(text, ex.name, todo))


def cmd_list():
    print("exercises (make exercise E=NAME writes exercises/NAME/; make check E=NAME grades it):")
    for e in EXERCISES:
        print(f"  {e.name:26} {e.goal}")


def cmd_make(name):
    ex = find(name)
    d = os.path.join(LEARNER, ex.name)
    dst = os.path.join(d, ex.file)
    if os.path.exists(dst) and not os.environ.get("FORCE"):
        die(f"{os.path.relpath(dst, ROOT)} already exists (your work?): edit it and run `make check E={ex.name}`, "
            f"or start over with `FORCE=1 make exercise E={ex.name}`")
    os.makedirs(d, exist_ok=True)
    with open(dst + ".tmp", "w") as f:
        f.write(learner_text(ex))
    os.replace(dst + ".tmp", dst)
    print(f"wrote {os.path.relpath(dst, ROOT)} — {ex.goal}")
    if ex.bug:
        print(f"it is {ex.path} with one thing broken; `diff {ex.path} {os.path.relpath(dst, ROOT)}` would "
              f"give it away: read the code instead.")
    else:
        print(f"look for TODO(exercise {ex.name}); then: make check E={ex.name}")


# ---- building ----

def build_flags():
    out = subprocess.run(["make", "-s", "--no-print-directory", "print-build-flags"], cwd=ROOT,
                         capture_output=True, text=True)
    if out.returncode != 0:
        die("could not read the build flags from the Makefile:\n" + out.stderr)
    flags = {}
    for line in out.stdout.splitlines():
        k, _, v = line.partition("=")
        flags[k.strip()] = v.strip()
    return flags


def compile_learner(ex, source, out_dir):
    """Builds the learner's trainer; returns (binary, None) or (None, compiler errors)."""
    f = build_flags()
    os.makedirs(out_dir, exist_ok=True)
    # -O0: the trainer file only drives the loops (the numbers are computed by the library, built
    # as usual), so its optimisation level does not change a bit, and it compiles in seconds.
    cxxflags = re.sub(r"-O\d", "-O0", f["CXXFLAGS"]).replace("-MMD -MP", "")
    obj = os.path.join(out_dir, "learner.o")
    binary = os.path.join(out_dir, ex.stage)
    c = subprocess.run(f"{f['CXX']} {cxxflags} -c {source} -o {obj}", shell=True, cwd=ROOT,
                       capture_output=True, text=True)
    if c.returncode != 0:
        return None, c.stderr
    if ex.path.startswith("common/"):  # the collective layer: the real trainer, the learner's comm.o first
        objs = f"{os.path.join(BUILD, 'obj', ex.stage, 'train.o')} {obj}"
    else:
        objs = obj
    c = subprocess.run(f"{f['CXX']} {f['LDFLAGS']} {objs} {f['LIB']} {f['LDLIBS']} -o {binary}", shell=True,
                       cwd=ROOT, capture_output=True, text=True)
    if c.returncode != 0:
        return None, c.stderr
    return binary, None


# ---- running and comparing ----

def run(binary, n, accum, extra, tag):
    os.makedirs(WORK, exist_ok=True)
    base = os.path.join(WORK, tag)
    for p in (base + ".json", base + ".model"):
        if os.path.exists(p):
            os.remove(p)
    cmd = (f"mpirun -np {n} {binary} {FLAGS} --accum {accum} {extra} --log-json {base}.json "
           f"--save-model {base}.model")
    try:
        p = subprocess.run(cmd, shell=True, cwd=ROOT, capture_output=True, text=True, timeout=120)
        out, rc = p.stdout + p.stderr, p.returncode
    except subprocess.TimeoutExpired as t:
        subprocess.run(f"pkill -f {binary}", shell=True)
        return {"hung": True, "output": (t.stdout or b"").decode(errors="replace") if isinstance(t.stdout, bytes) else ""}
    res = {"rc": rc, "output": out}
    if rc == 0:
        with open(base + ".json") as f:
            res["report"] = json.load(f)
        with open(base + ".model", "rb") as f:
            res["model"] = f.read()
    return res


def reference_run(stage, n, accum, extra):
    """The real trainer's run, cached until the binary changes."""
    binary = os.path.join(BUILD, "bin", stage)
    tag = f"ref_{stage}_{n}_{accum}_{extra.replace(' ', '').replace('-', '')}"
    base = os.path.join(WORK, tag)
    if (os.path.exists(base + ".json") and os.path.exists(base + ".model")
            and os.path.getmtime(base + ".json") > os.path.getmtime(binary)):
        with open(base + ".json") as f, open(base + ".model", "rb") as g:
            return {"rc": 0, "report": json.load(f), "model": g.read(), "output": ""}
    r = run(binary, n, accum, extra, tag)
    if r.get("rc") != 0:
        die(f"internal: the real {stage} failed:\n{r.get('output', '')}")
    return r


def crash_message(res):
    out = res.get("output", "")
    if res.get("hung"):
        return ("your trainer did not finish within 2 minutes: a collective that not every rank reaches, "
                "or a wait that never ends?")
    m = re.search(r"internal error at [^:]+:\d+: (.*)", out)
    if m:
        return f"your trainer stopped: {m.group(1).strip()}"
    m = re.search(r"signal (\d+)", out) or re.search(r"EXIT CODE: (\d+)", out)
    if m:
        sig = int(m.group(1))
        sig = sig - 128 if sig > 128 else sig
        try:
            name = signal.Signals(sig).name
        except ValueError:
            name = f"signal {sig}"
        hint = (" — a pointer past the end of a buffer? Check the offsets and sizes of the slices you use"
                if name == "SIGSEGV" else "")
        return f"your trainer crashed ({name}){hint}"
    lines = [l for l in out.splitlines() if l.strip()]
    return "your trainer failed (exit code %s): %s" % (res.get("rc"), lines[-1] if lines else "no output")


CATS = ["params", "grads", "master", "adam_m", "adam_v", "comm_buffers", "gathered", "activations", "scratch"]
OPS = ["all_reduce", "reduce_scatter", "all_gather", "broadcast"]


def compare(ref, got):
    """Everything that differs, as (kind, message, data) in the order a learner should read it."""
    R, G = ref["report"], got["report"]
    diffs = []
    rl, gl = R["steps_log"], G["steps_log"]
    steps = []  # the first step whose loss differs, and the first whose gradient norm does: earliest first
    for i, (a, b) in enumerate(zip(rl, gl)):
        if a["loss"] != b["loss"]:
            steps.append((i, 1, ("loss", f"step {i + 1}: loss {b['loss']:.9g}, expected {a['loss']:.9g}", i)))
            break
    for i, (a, b) in enumerate(zip(rl, gl)):  # (the norm is computed after the step's loss)
        if a["grad_norm"] != b["grad_norm"]:
            steps.append((i, 0, ("norm", f"step {i + 1}: gradient norm {b['grad_norm']:.9g}, expected "
                                         f"{a['grad_norm']:.9g}",
                                 (i, b["grad_norm"] / a["grad_norm"] if a["grad_norm"] else float("inf")))))
            break
    diffs += [d for _, _, d in sorted(steps, key=lambda x: (x[0], x[1]))]
    if ref["model"] != got["model"]:
        diffs.append(("model", "the saved model's bytes differ from the real trainer's", None))
    for rr, gr in zip(R["ranks"], G["ranks"]):
        for loc in ("device", "host", "disk"):
            for c in CATS:
                a = rr["ledger"][loc]["peak"].get(c, 0)
                b = gr["ledger"][loc]["peak"].get(c, 0)
                if a != b:
                    diffs.append(("memory", f"rank {rr['rank']}: {c} on the {loc} peaked at {b:,} bytes, "
                                            f"expected {a:,}", (c, a, b)))
        for op in OPS:
            a, b = rr["comm"][op], gr["comm"][op]
            if a["calls"] != b["calls"] or a["elems_sent"] != b["elems_sent"]:
                diffs.append(("comm", f"rank {rr['rank']}: {op} sent {b['elems_sent']:,} elements in {b['calls']} "
                                      f"calls, expected {a['elems_sent']:,} in {a['calls']}",
                              (op, a["calls"], b["calls"])))
    for i, (a, b) in enumerate(zip(rl, gl)):
        for k in ("to_host_elems", "to_device_elems"):
            if a.get(k, 0) != b.get(k, 0):
                diffs.append(("link", f"step {i + 1}: {k.replace('_elems', '').replace('_', ' ')} "
                                      f"{b.get(k, 0):,} elements, expected {a.get(k, 0):,}", k))
                break
    return diffs


def hints(ex, n, accum, diffs, passed_configs):
    """What the differences most likely mean."""
    kinds = {d[0] for d in diffs}
    out = []
    for kind, _, data in diffs:
        if kind == "comm":
            op, want, got = data
            if op == "all_reduce" and got > want:
                out.append("an all-reduce leaves the whole sum on every rank; here each rank should receive "
                           "only its slice (reduce_scatter)")
            elif op == "all_gather" and got < want and ex.stage == "stage3":
                out.append("fewer all-gathers than expected: every use of a unit (forward, LM head, backward) "
                           "gathers it afresh; a buffer kept from an earlier use can hold parameters from "
                           "before the optimizer step")
            elif op == "all_gather" and got < want:
                out.append("every rank needs every other rank's updated slice: all-gather after the update")
            elif op == "all_gather" and got > want:
                out.append("more all_gather calls than needed: is a unit gathered that needs no parameters, "
                           "or gathered again while its prefetch is in flight?")
            elif op == "reduce_scatter":
                out.append(f"expected one reduce_scatter per unit {'per micro-step' if ex.stage != 'stage1' else 'per step'}"
                           f" ({want} calls on this run), got {got}")
        if kind == "memory":
            cat, want, got = data
            if cat == "gathered" and got > want:
                out.append("gathered units stay alive too long: release each unit right after use, "
                           "and prefetch only when --prefetch is on")
            elif cat == "gathered" and got < want:
                out.append("the gathered parameters must be booked as Category::Gathered")
            elif cat == "grads" and got > want:
                out.append("the gradient kept is larger than the slice this rank owns")
        if kind == "link":
            out.append("the updated slice must go up to the device once per unit per step (to_device)")
    numeric = kinds & {"loss", "norm", "model"}
    if numeric:
        norm = next((d for d in diffs if d[0] == "norm"), None)
        loss = next((d for d in diffs if d[0] == "loss"), None)
        if norm and norm[2][0] == 0:
            ratio = norm[2][1]
            if any(abs(ratio - m) < 1e-3 * m for m in {n * accum, n, accum} if m > 1):
                out.append(f"the gradient is {ratio:.3g} times too large: the sum over ranks and micro-steps "
                           f"must be averaged (run.grad_average_scale() = 1/(N * accum))")
            elif accum > 1 and any(c[1] == 1 for c in passed_configs):
                out.append("right with --accum 1 but not with accumulation: every micro-step must reduce, "
                           "and add its slice (the first micro-step writes, the others add)")
            elif ex.path == "common/comm.cpp" and 0.999 < ratio < 1.001:
                out.append("almost right: the same numbers added in another order. Add in rank order "
                           "0, 1, ..., N-1, starting from rank 0's value")
            elif ex.path == "common/comm.cpp":
                out.append("each output must be the sum of all N ranks' contributions, read from slice r "
                           "of `full` at r * shard + i")
            else:
                out.append("the gradient the optimizer reads is wrong: is the reduced sum in the slice you own "
                           "(L.shard(u, rank), my_G(u))?")
        elif loss and loss[2] == 0:
            out.append("the very first forward differs: the parameters it reads are not the full, current ones")
        elif (not norm or norm[2][0] > 0) and ex.stage == "stage3":
            out.append("the first step's gradient is right but a later forward sees other parameters: a unit "
                       "gathered before the optimizer step (kept, or prefetched across it) is stale")
        elif not norm or norm[2][0] > 0:
            out.append("the gradient is right but the update is not: update the slice you own with its own "
                       "gradient and scale, then bring every rank every updated slice")
    seen, unique = set(), []
    for h in out:
        if h not in seen:
            seen.add(h)
            unique.append(h)
    return unique


def grade(ex, source, quiet=False, tag=None):
    """Returns (passed, verdict text). tag: a private name for the build and the runs."""
    say = [] if quiet else None
    lines = []

    def p(s=""):
        lines.append(s)
        if say is None:
            print(s, flush=True)

    tag = tag or ex.name
    out_dir = os.path.join(WORK, tag)
    binary, errors = compile_learner(ex, source, out_dir)
    if not binary:
        p(f"FAIL {ex.name}: your code does not compile:")
        for l in errors.splitlines()[:25]:
            p("  " + l)
        return False, "\n".join(lines)
    configs = STAGE3_CONFIGS if ex.stage == "stage3" else CONFIGS
    passed = []
    for n, accum, extra in configs:
        what = f"{n} ranks, --accum {accum}{' ' + extra if extra else ''}"
        ref = reference_run(ex.stage, n, accum, extra)
        got = run(binary, n, accum, extra, f"learner_{tag}")
        if got.get("rc") != 0:
            p(f"FAIL {ex.name} ({what}): {crash_message(got)}")
            return False, "\n".join(lines)
        diffs = compare(ref, got)
        if not diffs:
            passed.append((n, accum, extra))
            p(f"  ok   {what}: the same model, memory and communication as the real {ex.stage}")
            continue
        p(f"FAIL {ex.name} ({what}), compared with the real {ex.stage}:")
        for _, msg, _ in diffs[:6]:
            p("  - " + msg)
        if len(diffs) > 6:
            p(f"  - ... and {len(diffs) - 6} more differences")
        for h in hints(ex, n, accum, diffs, passed):
            p("  hint: " + h)
        return False, "\n".join(lines)
    p(f"PASS {ex.name}: bit for bit the real {ex.stage} on {len(configs)} configurations "
      f"(losses, gradient norms, saved model, memory by category, collectives, host<->device traffic)")
    return True, "\n".join(lines)


def cmd_check(name, source=None):
    ex = find(name)
    source = source or os.path.join(LEARNER, ex.name, ex.file)
    if not os.path.exists(source):
        die(f"{os.path.relpath(source, ROOT)} does not exist: `make exercise E={ex.name}` writes it")
    ok, _ = grade(ex, source)
    sys.exit(0 if ok else 1)


def cmd_selftest():
    """For make test: each reference solution passes; each known wrong solution fails with its hint.
    Two grades run at a time (each is mostly compiling and starting MPI jobs)."""
    from concurrent.futures import ThreadPoolExecutor
    tmp = os.path.join(WORK, "selftest")
    os.makedirs(tmp, exist_ok=True)
    jobs = []  # (exercise, what, source file, expected hint or None for "must pass")
    for ex in EXERCISES:
        with open(os.path.join(ROOT, ex.path)) as f:
            real = f.read()
        if ex.bug:  # (the real file passing is the reference solutions' test)
            candidates = [("the handed-out copy", learner_text(ex), "")]
        else:
            a, b = region(real.split("\n"), ex.name)
            body = [l.strip() for l in real.split("\n")[a + 1:b]]
            candidates = [("the reference solution", with_region(real, ex.name, body), None)]
            for what, wrong, hint in ex.wrong:
                if isinstance(wrong, list):  # edits of the real region
                    text = "\n".join(body)
                    for old, new in wrong:
                        if old not in text:
                            die(f"internal: exercise {ex.name}, wrong solution {what!r}: {old!r} is not in the region")
                        text = text.replace(old, new)
                    wrong = text
                candidates.append((what, with_region(real, ex.name, wrong.split("\n")), hint))
        for what, text, want_hint in candidates:
            src = os.path.join(tmp, f"{ex.name}_{len(jobs)}_{ex.file}")
            with open(src, "w") as f:
                f.write(text)
            jobs.append((ex, what, src, want_hint))
    for ex in EXERCISES:  # the real trainers' runs, once, before the grades share them
        for n, accum, extra in (STAGE3_CONFIGS if ex.stage == "stage3" else CONFIGS):
            reference_run(ex.stage, n, accum, extra)

    def one(i):
        ex, what, src, want_hint = jobs[i]
        ok, verdict = grade(ex, src, quiet=True, tag=f"selftest_{i}")
        if want_hint is None:
            good, why = ok, "" if ok else verdict
        else:
            good = not ok and want_hint.lower() in verdict.lower()
            why = "" if good else ("it PASSED" if ok else f"no hint containing {want_hint!r}: {verdict}")
        label = f"exercise.{ex.name}." + ("accepts_" if want_hint is None else "rejects_") + \
            re.sub(r"\W+", "_", what).strip("_")
        lines = [f"NZRESULT {'PASS' if good else 'FAIL'} {label}" + ("" if good else " " + why.replace("\n", " | "))]
        if want_hint is not None and not ok:  # what the learner would read
            said = [l.strip() for l in verdict.splitlines() if "hint:" in l] or \
                   [l.strip() for l in verdict.splitlines() if l.strip().startswith(("FAIL", "-"))][:2]
            lines.append(f"  {ex.name}, {what}: {' / '.join(said[:2])}")
        return good, "\n".join(lines)

    with ThreadPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(one, range(len(jobs))))
    for _, text in results:
        print(text, flush=True)
    return all(good for good, _ in results)


def main(argv):
    if len(argv) < 2 or argv[1] == "list":
        return cmd_list()
    cmd = argv[1]
    name = argv[2] if len(argv) > 2 else ""
    if cmd == "make":
        return cmd_list() if not name else cmd_make(name)
    if cmd == "check":
        return cmd_check(name, argv[3] if len(argv) > 3 else None)
    if cmd == "selftest":
        sys.exit(0 if cmd_selftest() else 1)
    die(f"unknown command {cmd!r}; use list, make NAME, check NAME [FILE], selftest")


if __name__ == "__main__":
    main(sys.argv)
