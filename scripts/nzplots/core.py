"""core.py — what every notebook shares: the repository's paths and the rungs, running the tools
(zero_estimate, the trainers) with their reports cached, reading a report, and the exercises'
self-check (check_answer)."""
import hashlib
import json
import os
import subprocess
from pathlib import Path

import matplotlib
import numpy as np

REPO = Path(__file__).resolve().parent.parent.parent  # scripts/nzplots/core.py
STAGES = [l.split()[0] for l in (REPO / "stages.txt").read_text().splitlines()
          if l[:1].isalpha()]  # the rungs, in order (stages.txt: a line's first word)
# What each stage shards, as the paper names it.
STAGE_LABEL = {"stage0_ddp": "stage0 (DDP)", "stage1": "stage1 (P_os)", "stage2": "stage2 (P_os+g)",
               "stage3": "stage3 (P_os+g+p)", "offload": "offload (stage2 + host)",
               "infinity": "infinity (stage3 + host)"}
STAGE_COLOR = {"stage0_ddp": "#444444", "stage1": "#1f77b4", "stage2": "#2ca02c", "stage3": "#d62728",
               "offload": "#9467bd", "infinity": "#ff7f0e"}
# Ledger categories, bottom to top in the stacked figures.
CATEGORIES = ["params", "grads", "master", "adam_m", "adam_v", "comm_buffers", "gathered", "activations"]
MODEL_STATE = CATEGORIES[:-1]  # everything but the activations
CAT_COLOR = {"params": "#1f77b4", "grads": "#ff7f0e", "master": "#2ca02c", "adam_m": "#d62728",
             "adam_v": "#9467bd", "comm_buffers": "#8c564b", "gathered": "#e377c2", "activations": "#bcbd22"}
# The measured runs: the small preset (5 blocks, so a unit is a fifth of the model and stage3's two
# gathered units stay below stage2's full parameters), two steps, bf16 mixed precision like the paper.
# A run takes about a second, mostly mpirun's start-up; the tiny preset is no faster.
MEASURED = dict(preset="small", seq=32, batch=2, steps=2, precision="bf16")
# Two-sided 5 % points of Student's t with n - 1 degrees of freedom, for n seeds (the confidence
# intervals of the ZeRO++ and compression studies).
T_CRIT_5PCT = {2: 12.71, 3: 4.303, 4: 3.182, 5: 2.776, 6: 2.571, 7: 2.447, 8: 2.365, 9: 2.306, 10: 2.262,
               11: 2.228, 12: 2.201, 16: 2.131, 20: 2.093}

matplotlib.rcParams.update({"font.size": 11, "axes.titlesize": 12, "axes.labelsize": 11,
                            "legend.fontsize": 9, "figure.dpi": 100, "savefig.dpi": 130})


# ---------------------------------------------------------------------------------------------
# Running the tools
# ---------------------------------------------------------------------------------------------

def bin_dir():
    return Path(os.environ.get("NZ_BIN_DIR") or REPO / "build" / "bin")


def runs_dir():
    return Path(os.environ.get("NZ_RUNS_DIR") or REPO / "runs" / "reports")


def built_stages():
    """(stages whose trainer is built, stages that are not), in ladder order."""
    have = [s for s in STAGES if (bin_dir() / s).is_file()]
    return have, [s for s in STAGES if s not in have]


def estimate(worlds=(1,), stage="all", precision="bf16", preset=None, params=None, batch=None, seq=None, accum=1,
             extra=()):
    """zero_estimate --json: per-rank bytes by category for every (world, stage), exact, and the
    elements each rank sends per optimizer step of `accum` micro-steps. extra: more flags, such as
    ("--layers", "32", "--dim", "4096", "--heads", "32") to reshape the preset."""
    cmd = [str(bin_dir() / "zero_estimate"), "--json", "--stage", stage, "--precision", precision,
           "--world", ",".join(str(n) for n in worlds), "--accum", str(accum)]
    cmd += ["--params", str(params)] if params is not None else ["--preset", preset or "small"]
    if batch is not None:
        cmd += ["--batch", str(batch)]
    if seq is not None:
        cmd += ["--seq", str(seq)]
    cmd += [str(x) for x in extra]
    return json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)


def paper_table():
    """The text of `zero_estimate --paper-table` (the ZeRO paper's Table 1)."""
    cmd = [str(bin_dir() / "zero_estimate"), "--paper-table"]
    return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout


def paper_cells(model=0):
    """The cells of --paper-table for one model (0: 7.5B, 1: 128B, 2: 1T), as printed:
    {N: {stage: "text"}}, stages stage0_ddp..stage3 (baseline, P_os, P_os+g, P_os+g+p)."""
    cells = {}
    for line in paper_table().splitlines():
        parts = [p.split() for p in line.split("|")]
        if len(parts) == 4 and parts[0] and parts[0][0].isdigit():
            cells[int(parts[0][0])] = dict(zip(STAGES[:4], parts[1 + model]))
    return cells


def run(stage, world, preset=MEASURED["preset"], seq=MEASURED["seq"], batch=MEASURED["batch"],
        steps=MEASURED["steps"], precision=MEASURED["precision"], device="cpu", extra=()):
    """mpirun -np world <stage> ... --log-json; returns the report (cached, see the module doc)."""
    exe = bin_dir() / stage
    flags = ["--preset", preset, "--seq", str(seq), "--batch", str(batch), "--steps", str(steps),
             "--precision", precision, "--device", device, "--eval-every", "0", "--eval-windows", "4",
             "--quiet", *extra]
    st = exe.stat()
    key = hashlib.sha1(json.dumps([str(exe), st.st_mtime_ns, st.st_size, world, flags]).encode()).hexdigest()[:12]
    out = runs_dir() / f"{stage}_N{world}_{key}.json"
    if not out.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        cmd = ["mpirun", "-np", str(world), str(exe), *flags, "--log-json", str(out)]
        p = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO)
        if p.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed (exit {p.returncode}):\n{p.stdout}{p.stderr}")
    return json.loads(out.read_text())


def run_stages(worlds=(1, 2, 3, 4), stages=None, verbose=True, **kw):
    """Every built stage at every world size: {(stage, N): report}. Says which stages are missing."""
    have, missing = built_stages()
    stages = [s for s in (stages or STAGES) if s in have]
    if verbose and missing:
        print(f"skipped (not built yet in {bin_dir()}): {', '.join(missing)}")
    reports = {}
    for s in stages:
        for n in worlds:
            reports[(s, n)] = run(s, n, **kw)
    if verbose:
        print(f"{len(reports)} runs: {', '.join(stages)} at N = {', '.join(map(str, worlds))}")
    return reports


def run_pipeline(segments=4, accum=8, schedule="1f1b", steps=3, **kw):
    """build/bin/pipeline on P ranks, P segments (one replica): the report, with each rank's events of
    the last step (report["pipeline"]["ranks"][r]["events"]: [op, micro-batch, compute|wait, from ms, to ms])."""
    extra = ("--pipeline", str(segments), "--schedule", schedule, "--accum", str(accum), *kw.pop("extra", ()))
    return run("pipeline", segments, steps=steps, extra=extra, **kw)


# ---------------------------------------------------------------------------------------------
# Reading a report
# ---------------------------------------------------------------------------------------------

def measured(report, rank=0):
    """{category: peak bytes} of one rank's ledger, summed over device, host and disk."""
    led = report["ranks"][rank]["ledger"]
    return {c: sum(led[loc]["peak"][c] for loc in ("device", "host", "disk")) for c in CATEGORIES}


def measured_at(report, location, rank=0):
    """{category: peak bytes} of one rank's ledger at one location."""
    return {c: report["ranks"][rank]["ledger"][location]["peak"][c] for c in CATEGORIES}


def formula_for(report):
    """zero_estimate's record for the run's stage, world, shape, precision and accumulation."""
    cfg = report["config"]
    assert report["preset"] in ("tiny", "small", "gpt2"), report["preset"]
    est = estimate(worlds=[report["world"]], stage=report["stage"], precision=report["precision"],
                   preset=report["preset"], batch=report["batch"], seq=report["seq"], accum=report["accum"])
    assert est["config"]["layers"] == cfg["layers"] and est["config"]["dim"] == cfg["dim"], "preset overridden"
    return est["estimates"][0]


def read_study_table(path):
    """A committed study's table (docs/data/*.tsv): its '#' lines (the command that made it), and
    its rows, each a {column: text} dict."""
    lines = Path(path).read_text().splitlines()
    command = [l[1:].strip() for l in lines if l.startswith("#")]
    rows = [l.split("\t") for l in lines if l and not l.startswith("#")]
    return command, [dict(zip(rows[0], r)) for r in rows[1:]]


def _kb(x):
    return x / 1e3


# ---------------------------------------------------------------------------------------------
# Notebook exercises
# ---------------------------------------------------------------------------------------------

# Every answer is compared with its truth after normalising names: a learner may write a category,
# a stage or a direction the way people say it ("gradients", "ZeRO-3", "down"). Group names
# ("optimizer state") stand for several categories, and are accepted where the answer is a set.
NAME_ALIAS = {
    "params": ["param", "params", "parameter", "parameters", "weights", "p"],
    "grads": ["grad", "grads", "gradient", "gradients", "g"],
    "master": ["master", "masters", "master_copy", "master_weights", "master_params", "fp32_master",
               "fp32_master_copy", "fp32_params"],
    "adam_m": ["adam_m", "m", "momentum", "first_moment", "exp_avg"],
    "adam_v": ["adam_v", "v", "variance", "second_moment", "exp_avg_sq"],
    "comm_buffers": ["comm_buffers", "comm_buffer", "bucket", "buckets", "grad_bucket", "gradient_bucket"],
    "gathered": ["gathered", "gathered_params", "gathered_units", "gathered_unit"],
    "activations": ["activations", "activation", "acts"],
    "stage0_ddp": ["stage0_ddp", "stage0", "ddp", "zero0", "zero_0", "baseline", "0"],
    "stage1": ["stage1", "zero1", "zero_1", "p_os", "pos", "1"],
    "stage2": ["stage2", "zero2", "zero_2", "p_os+g", "pos+g", "2"],
    "stage3": ["stage3", "zero3", "zero_3", "p_os+g+p", "pos+g+p", "fsdp", "3"],
    "offload": ["offload", "zero_offload", "stage2_offload"],
    "down": ["down", "to_host", "device_to_host", "d2h", "gpu_to_cpu"],
    "up": ["up", "to_device", "host_to_device", "h2d", "cpu_to_gpu"],
}
NAME_GROUP = {"optimizer": ["master", "adam_m", "adam_v"], "optimizer_state": ["master", "adam_m", "adam_v"],
              "optimizer_states": ["master", "adam_m", "adam_v"], "adam": ["adam_m", "adam_v"],
              "adam_m_v": ["adam_m", "adam_v"], "adam_state": ["adam_m", "adam_v"],
              "model_state": ["params", "grads", "master", "adam_m", "adam_v"]}
_CANON = {alias: name for name, aliases in NAME_ALIAS.items() for alias in aliases}
_CANON.update({alias.replace("_", ""): name for alias, name in list(_CANON.items())})  # "stage 2" = "stage2"
_NUMBER = (int, float, np.integer, np.floating)


def _norm(x):
    """A name as the tables above spell it: lower case, spaces and dashes as underscores."""
    s = str(x).strip().lower().replace("-", "_").replace(" ", "_").replace("&", "+")
    while "__" in s:
        s = s.replace("__", "_")
    s = s.strip("_.")
    return _CANON.get(s, _CANON.get(s.replace("_", ""), s))


def _is_number(x):
    return isinstance(x, _NUMBER) and not isinstance(x, bool)


def _names(answer):
    """A set answer's names, normalised, groups expanded."""
    items = [answer] if isinstance(answer, str) else list(answer)
    out = set()
    for a in items:
        n = _norm(a)
        out.update(NAME_GROUP.get(n, [n]))
    return out


def _mismatch(answer, truth, rel):
    """None if answer is truth (numbers within the relative tolerance rel, names after _norm, sets
    as sets, dicts key by key), else a short reason that does not give the truth away."""
    if isinstance(truth, dict):
        if not isinstance(answer, dict):
            return f"expected a dict with the keys {', '.join(map(str, truth))}"
        given = {_norm(k): v for k, v in answer.items()}
        missing = [k for k in truth if given.get(_norm(k)) is None]
        unknown = [str(k) for k in given if k not in {_norm(t) for t in truth}]
        if missing:
            return f"no answer for {', '.join(map(str, missing))}: give one for every key"
        if unknown:
            return f"{', '.join(unknown)} is not one of the keys {', '.join(map(str, truth))}"
        wrong = [k for k in truth if _mismatch(given[_norm(k)], truth[k], rel)]
        return f"not right for {', '.join(map(str, wrong))}" if wrong else None
    if isinstance(truth, (set, frozenset)):
        if not isinstance(answer, (set, frozenset, list, tuple, str)):
            return "expected a set of names, like {\"params\", \"grads\"}"
        got, want = _names(answer), {_norm(t) for t in truth}
        if got < want:
            return f"incomplete: {len(want - got)} missing"
        return None if got == want else "not the right set (something in it does not belong)"
    if _is_number(truth):
        if not _is_number(answer):
            return f"expected a number, got {type(answer).__name__} {answer!r}"
        ok = abs(answer - truth) <= rel * abs(truth) + 1e-12
        return None if ok else "not right" + (f" (within {rel:.3g} relative)" if rel else " (exactly)")
    if isinstance(truth, str):
        if not isinstance(answer, (str, int)) or isinstance(answer, bool):
            return f"expected a name, got {type(answer).__name__} {answer!r}"
        return None if _norm(answer) == _norm(truth) else "not right"
    return None if answer == truth else "not right"


def _unanswered(answer):
    if answer is None or (isinstance(answer, str) and not answer.strip()):
        return True
    if isinstance(answer, dict):
        return bool(answer) and all(_unanswered(v) for v in answer.values())
    if isinstance(answer, (tuple, list)) and answer and not isinstance(answer, str):
        return all(_unanswered(v) for v in answer)
    return False


def check_answer(answer, truth, what, rel=0.02):
    """Self-check of a notebook exercise. The question states the unit and the tolerance.
    - None (or a dict/tuple whose values are all None): not answered yet; prints a line, no error.
    - numbers: right within the relative tolerance rel (default 2 %, so rounding to the digits a
      question asks for passes; rel=0 for exact counts); 5 and 5.0 are the same.
    - names: "gradients", "grads", "Gradient" are the same category; "stage0", "DDP" the same stage.
    - a set truth wants the same set of names (a group like "optimizer state" counts as its parts).
    - a dict truth wants an answer for every key and no other key; a tuple truth, one per element.
    A wrong or incomplete answer raises AssertionError saying what is wrong, not what is right.
    Prints "✓ ..." when right."""
    if _unanswered(answer):
        print(f"… {what}: not answered yet. Put your answer in the cell above and run both cells again.")
        return
    if isinstance(truth, tuple):
        assert isinstance(answer, (tuple, list)) and len(answer) == len(truth), (
            f"✗ {what}: expected {len(truth)} answers, as (…, …)")
        reasons = [_mismatch(a, t, rel) for a, t in zip(answer, truth)]
        bad = [f"answer {i + 1}: {r}" for i, r in enumerate(reasons) if r]
        assert not bad, f"✗ {what}: " + "; ".join(bad) + ". Look again, or open the hidden answer."
    else:
        reason = _mismatch(answer, truth, rel)
        assert reason is None, f"✗ {what}: {reason}. Look again, or open the hidden answer."
    print(f"✓ {what}: {answer!r} is right.")
