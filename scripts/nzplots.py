"""nzplots — nanoZeRO's memory and communication figures, shared by scripts/plots.py and notebooks/.

Nothing here re-implements a formula: the formula lines come from `zero_estimate --json` (which
calls common/zero_formulas.h), the measured points from the trainers' JSON reports (--log-json:
the memory ledger of every rank, its timeline, and the elements each step sent), and for inference
from build/bin/generate's --bench table and `stats:` line.

    import nzplots as nz
    reports = nz.run_stages(worlds=[1, 2, 3, 4])   # {(stage, N): report}, small-preset runs
    nz.fig_categories(reports, world=4).savefig("memory_by_category.png")
    nz.fig_comm_vs_accum(world=4).savefig("comm_vs_accum.png")  # formulas only, no runs needed

Binaries are found in $NZ_BIN_DIR, else build/bin; reports are cached in $NZ_RUNS_DIR, else
runs/reports (a report is reused only if the command and the trainer binary are unchanged).
"""
import hashlib
import json
import os
import subprocess
from pathlib import Path

import matplotlib
import numpy as np
from matplotlib.figure import Figure  # figures without pyplot: no global state, any backend
from matplotlib.patches import Patch
from matplotlib.ticker import FuncFormatter, MaxNLocator

REPO = Path(__file__).resolve().parent.parent
STAGES = [l.strip() for l in (Path(__file__).resolve().parent.parent / "stages.txt").read_text().splitlines()
          if l[:1].isalpha()]  # the rungs, in order (stages.txt)
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


def run_pipeline(stages=4, accum=8, schedule="1f1b", steps=3, **kw):
    """build/bin/pipeline on P ranks (one replica): the report, with each rank's events of the last
    step (report["pipeline"]["ranks"][r]["events"]: [op, micro-batch, compute|wait, from ms, to ms])."""
    extra = ("--pipeline", str(stages), "--schedule", schedule, "--accum", str(accum), *kw.pop("extra", ()))
    return run("pipeline", stages, steps=steps, extra=extra, **kw)


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


def _kb(x):
    return x / 1e3


# ---------------------------------------------------------------------------------------------
# Figure 1: per-rank memory by category, measured beside the formula
# ---------------------------------------------------------------------------------------------

def _category_bars(ax, reports, stages, world, cats):
    """One measured/formula pair of stacked bars per stage, categories cats bottom to top."""
    width = 0.38
    for i, s in enumerate(stages):
        rep = reports[(s, world)]
        f = formula_for(rep)
        host_meas = measured_at(rep, "host")
        for j, (label, vals) in enumerate((("measured", measured(rep)), ("formula", f["bytes"]))):
            x = i + (j - 0.5) * width
            bottom = 0
            for c in cats:
                v = vals[c] / 1e6
                on_host = (host_meas[c] > 0) if label == "measured" else f["location"][c] == "host"
                ax.bar(x, v, width * 0.95, bottom=bottom, color=CAT_COLOR[c], edgecolor="white",
                       hatch="//" if on_host else None, label=c if (i == 0 and j == 0) else None)
                bottom += v
            ax.text(x, bottom, f"{'ledger' if j == 0 else 'formula'}\n{bottom:.2f}", ha="center", va="bottom",
                    fontsize=7.5)
    ax.set_xticks(range(len(stages)), [STAGE_LABEL[s].replace(" (", "\n(") for s in stages])
    ax.set_ylim(0, ax.get_ylim()[1] * 1.12)
    ax.grid(True, axis="y", alpha=0.3)


def fig_categories(reports, world=4):
    """Per-rank peak bytes by category for each stage at N = world, the ledger of rank 0 (left bar of
    each pair) beside zero_estimate's formula (right bar). Left panel: the model states only, on
    their own scale, so every rung of the ladder shows; right panel: the same with the activations on
    top, which ZeRO does not shard. Hatched: bytes on the host (offload)."""
    stages = [s for s in STAGES if (s, world) in reports]
    fig = Figure(figsize=(16, 6), layout="constrained")
    ax, bx = fig.subplots(1, 2, sharey=False)
    _category_bars(ax, reports, stages, world, MODEL_STATE)
    _category_bars(bx, reports, stages, world, CATEGORIES)
    rep0 = reports[(stages[0], world)]
    ax.set_ylabel("peak bytes per rank (MB = 10⁶ bytes)")
    ax.set_title("Model states only: what ZeRO shards\n(params, grads, master, Adam m, v, bucket, gathered units)")
    bx.set_title("The same with the activations on top\n(the same in every stage: ZeRO does not shard them)")
    handles, labels = bx.get_legend_handles_labels()
    handles.append(Patch(facecolor="white", edgecolor="gray", hatch="//"))
    labels.append("on the host")
    bx.legend(handles, labels, loc="upper right", ncols=3, fontsize=8)
    fig.suptitle(f"Per-rank memory by category, N = {world} ranks: ledger of rank 0 (left bar of each pair) "
                 f"beside the formula (right bar)\n{rep0['preset']} preset, Ψ = {rep0['num_params']:,} "
                 f"parameters, {rep0['precision']} mixed precision, micro-batch {rep0['batch']} × "
                 f"{rep0['seq']} tokens")
    return fig


# ---------------------------------------------------------------------------------------------
# Figure 1b: activation checkpointing, at a realistic scale and measured
# ---------------------------------------------------------------------------------------------

# A 7B-like shape on the gpt2 preset (context 1024): 32 blocks, width 4096, 32 heads.
BIG_SHAPE = ("--layers", "32", "--dim", "4096", "--heads", "32")


def run_checkpointed(world=4, stages=None, **kw):
    """Every built stage at N = world with --activation-checkpointing: {(stage, N): report}."""
    have, _ = built_stages()
    return {(s, world): run(s, world, extra=("--activation-checkpointing",), **kw) for s in (stages or have)}


def checkpointing_estimate(world=64, batch=4, seq=1024, precision="bf16", extra=BIG_SHAPE):
    """zero_estimate --json for the 7B-like shape: its records carry both activation figures
    (activations_plain, activations_checkpointed at the top level)."""
    return estimate(worlds=[world], precision=precision, preset="gpt2", batch=batch, seq=seq, extra=extra)


def _stacked(ax, x, vals, cats, width, hatch_host=None, label_first=False, scale=1e9):
    bottom = 0
    for c in cats:
        v = vals[c] / scale
        ax.bar(x, v, width * 0.95, bottom=bottom, color=CAT_COLOR[c], edgecolor="white",
               hatch="//" if hatch_host and hatch_host.get(c) else None, label=c if label_first else None)
        bottom += v
    return bottom


def fig_checkpointing(world=64, batch=4, seq=1024, capacity_gb=80, reports=None, ckpt_reports=None, small_world=4):
    """Per-rank memory by category for every stage, without (left bar of each pair) and with
    activation checkpointing (right bar). Left panel: the 7B-like shape (BIG_SHAPE) at N = world,
    bf16, micro-batch batch x seq, from zero_estimate, with a device line at capacity_gb; right
    panel (when reports and ckpt_reports are given, {(stage, N): report}): the small runs at
    N = small_world, rank 0's ledger. Hatched: on the host (offload)."""
    est = checkpointing_estimate(world=world, batch=batch, seq=seq)
    panels = 2 if reports and ckpt_reports else 1
    fig = Figure(figsize=(8 * panels, 6.2), layout="constrained")
    axes = fig.subplots(1, panels, squeeze=False)[0]
    ax = axes[0]
    width = 0.38
    stages = [e["stage"] for e in est["estimates"]]
    for i, e in enumerate(est["estimates"]):
        host = {c: e["location"][c] == "host" for c in CATEGORIES}
        for j, acts in enumerate((est["activations_plain"], est["activations_checkpointed"])):
            vals = dict(e["bytes"], activations=acts)
            x = i + (j - 0.5) * width
            top = _stacked(ax, x, vals, CATEGORIES, width, host, label_first=(i == 0 and j == 0))
            ax.text(x, top, f"{'plain' if j == 0 else 'ckpt'}\n{top:.1f}", ha="center", va="bottom", fontsize=7.5)
    ax.axhline(capacity_gb, color="gray", ls="--", lw=1)
    ax.text(len(stages) - 0.5, capacity_gb, f"{capacity_gb:g} GB device", ha="right", va="bottom", fontsize=8,
            color="gray")
    ax.set_xticks(range(len(stages)), [STAGE_LABEL[s].replace(" (", "\n(") for s in stages])
    ax.set_ylabel("bytes per rank (GB = 10⁹ bytes)")
    ax.set_ylim(0, ax.get_ylim()[1] * 1.1)
    ax.grid(True, axis="y", alpha=0.3)
    c = est["config"]
    ax.set_title(f"Formula: {c['layers']} blocks, width {c['dim']}, Ψ = {est['num_params'] / 1e9:.2f}B, "
                 f"N = {world}, {est['precision']},\nmicro-batch {batch} × {seq}: without checkpointing (left), "
                 "with it (right)")
    handles, labels = ax.get_legend_handles_labels()
    handles.append(Patch(facecolor="white", edgecolor="gray", hatch="//"))
    labels.append("on the host")
    ax.legend(handles, labels, loc="upper right", ncols=2, fontsize=8)
    if panels == 2:
        bx = axes[1]
        small = [s for s in STAGES if (s, small_world) in reports and (s, small_world) in ckpt_reports]
        for i, s in enumerate(small):
            for j, rep in enumerate((reports[(s, small_world)], ckpt_reports[(s, small_world)])):
                host = {k: v > 0 for k, v in measured_at(rep, "host").items()}
                x = i + (j - 0.5) * width
                top = _stacked(bx, x, measured(rep), CATEGORIES, width, host, scale=1e6)
                bx.text(x, top, f"{'plain' if j == 0 else 'ckpt'}\n{top:.2f}", ha="center", va="bottom", fontsize=7.5)
        rep0 = reports[(small[0], small_world)]
        bx.set_xticks(range(len(small)), [STAGE_LABEL[s].replace(" (", "\n(") for s in small])
        bx.set_ylabel("peak bytes per rank (MB = 10⁶ bytes)")
        bx.set_ylim(0, bx.get_ylim()[1] * 1.12)
        bx.grid(True, axis="y", alpha=0.3)
        bx.set_title(f"Measured: the ledger of rank 0, {rep0['preset']} preset, N = {small_world}, "
                     f"{rep0['precision']},\nmicro-batch {rep0['batch']} × {rep0['seq']}: without (left), "
                     "with --activation-checkpointing (right)")
    fig.suptitle("Activations are what ZeRO leaves: activation checkpointing keeps each block's input and recomputes "
                 "the rest in the backward")
    return fig


# ---------------------------------------------------------------------------------------------
# Figure 1c: the largest model that fits one device, per rung (ZeRO-Infinity's question)
# ---------------------------------------------------------------------------------------------

# The rungs whose device memory the figure compares: the ladder, then infinity (stages.txt).
FIT_RUNGS = STAGES + ["infinity"]
FIT_VOCAB = 50257  # GPT-2's vocabulary: the embedding is a large unit at small widths


def fit_shape(k):
    """The family the largest model is found in: k blocks of width 128k with k heads of 128 (GPT-3's
    proportions: 175B is k = 96), GPT-2's vocabulary."""
    return ("--layers", str(k), "--dim", str(128 * k), "--heads", str(k), "--vocab", str(FIT_VOCAB))


def largest_fitting_models(capacity_gb=24, worlds=(1, 64), batch=1, seq=1024, precision="bf16", k_max=256):
    """{(rung, N, checkpointing): (Ψ, k)}: the largest model of the fit_shape family whose device peak
    (zero_estimate's `device`: model states on the device, buffers, gathered units, activations of a
    micro-batch batch x seq) fits capacity_gb GB, per rank; (0, 0) when not even k = 2 fits."""
    cache = {}

    def device(k, ckpt):
        if (k, ckpt) not in cache:
            extra = fit_shape(k) + (("--activation-checkpointing",) if ckpt else ())
            est = estimate(worlds=worlds, preset="gpt2", precision=precision, batch=batch, seq=seq, extra=extra)
            cache[(k, ckpt)] = (est["num_params"], {(e["stage"], e["world"]): e["device"] for e in est["estimates"]})
        return cache[(k, ckpt)]

    out = {}
    for ckpt in (False, True):
        for s in FIT_RUNGS:
            for n in worlds:
                fits = lambda k: device(k, ckpt)[1][(s, n)] <= capacity_gb * 1e9  # noqa: E731
                lo, hi = 1, k_max + 1  # fits(lo) (k = 1 stands for "nothing"), not fits(hi)
                if not fits(2):
                    out[(s, n, ckpt)] = (0, 0)
                    continue
                lo = 2
                if fits(k_max):
                    lo = hi = k_max
                while hi - lo > 1:  # the device peak grows with k
                    mid = (lo + hi) // 2
                    lo, hi = (mid, hi) if fits(mid) else (lo, mid)
                out[(s, n, ckpt)] = (device(lo, ckpt)[0], lo)
    return out


def device_peak_check(worlds=(1, 4)):
    """The small runs that stand for the family: every rung at N in worlds, without and with
    --activation-checkpointing; {(rung, N, checkpointing): (ledger, formula)}: rank 0's device peak
    (the ledger's device categories, each at its peak) and zero_estimate's `device` for the same run.
    Raises when one differs: the prediction is only as good as this equality."""
    have = [s for s in FIT_RUNGS if (bin_dir() / s).is_file()]
    out = {}
    for ckpt in (False, True):
        flag = ("--activation-checkpointing",) if ckpt else ()
        for n in worlds:
            est = estimate(worlds=[n], preset=MEASURED["preset"], precision=MEASURED["precision"],
                           batch=MEASURED["batch"], seq=MEASURED["seq"], extra=flag)
            formula = {e["stage"]: e["device"] for e in est["estimates"]}
            for s in have:
                rep = run(s, n, extra=flag)
                ledger = sum(measured_at(rep, "device").values())
                if ledger != formula[s]:
                    raise RuntimeError(f"{s}, N = {n}{', checkpointing' if ckpt else ''}: the ledger's device "
                                       f"peak is {ledger:,} bytes, the formula {formula[s]:,}")
                out[(s, n, ckpt)] = (ledger, formula[s])
    return out


def _psi(x):
    return f"{x / 1e12:.3g}T" if x >= 1e12 else f"{x / 1e9:.3g}B" if x >= 1e9 else f"{x / 1e6:.3g}M"


def fig_largest_model(capacity_gb=24, worlds=(1, 64), batch=1, seq=1024, measured_worlds=(1, 4), fits=None,
                      checks=None):
    """Left: the largest model (parameters, log scale) whose per-rank device peak fits capacity_gb, per
    rung, at N = worlds, without (solid) and with (hatched) activation checkpointing: predicted from
    the formulas over the fit_shape family, bf16, micro-batch batch x seq. Right: why the prediction
    holds: the small preset's device peak, the ledger of a real run (bars) and the formula (marks)
    equal to the byte, per rung at N = measured_worlds (device_peak_check)."""
    fits = fits or largest_fitting_models(capacity_gb, worlds, batch, seq)
    checks = checks if checks is not None else device_peak_check(measured_worlds)
    fig = Figure(figsize=(15, 6.2), layout="constrained")
    ax, bx = fig.subplots(1, 2, width_ratios=[1.5, 1])
    width = 0.8 / (2 * len(worlds))
    shades = {worlds[0]: 0.55, worlds[-1]: 1.0}
    for i, s in enumerate(FIT_RUNGS):
        j = 0
        for n in worlds:
            for ckpt in (False, True):
                psi, k = fits[(s, n, ckpt)]
                x = i - 0.4 + (j + 0.5) * width
                ax.bar(x, max(psi, 1), width, color=STAGE_COLOR[s], alpha=shades.get(n, 0.8),
                       hatch="//" if ckpt else None, edgecolor="white" if ckpt else None)
                ax.text(x, max(psi, 1) * 1.15, _psi(psi) if psi else "none", ha="center", va="bottom",
                        fontsize=6.5, rotation=90)
                j += 1
    ax.set_yscale("log")
    ax.set_ylim(1e8, ax.get_ylim()[1] * 8)
    ax.set_xticks(range(len(FIT_RUNGS)), [STAGE_LABEL[s].replace(" (", "\n(") for s in FIT_RUNGS])
    ax.set_ylabel("parameters Ψ of the largest model that fits")
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend([Patch(facecolor="gray", alpha=shades.get(n, 0.8)) for n in worlds]
              + [Patch(facecolor="white", edgecolor="gray", hatch="//")],
              [f"N = {n}" for n in worlds] + ["with activation checkpointing"], loc="upper left", fontsize=8)
    ax.set_title(f"Formula: the largest of k blocks of width 128k (k heads; GPT-2 vocabulary) whose device peak "
                 f"fits\n{capacity_gb:g} GB per rank, bf16, micro-batch {batch} × {seq}; bars for each N: without, "
                 f"with checkpointing")
    rungs = [s for s in FIT_RUNGS if any(key[0] == s for key in checks)]
    width = 0.8 / (2 * len(measured_worlds))
    for i, s in enumerate(rungs):
        j = 0
        for n in measured_worlds:
            for ckpt in (False, True):
                if (s, n, ckpt) in checks:
                    ledger, formula = checks[(s, n, ckpt)]
                    x = i - 0.4 + (j + 0.5) * width
                    bx.bar(x, ledger / 1e6, width, color=STAGE_COLOR[s], alpha=0.55 if n == measured_worlds[0] else 1,
                           hatch="//" if ckpt else None, edgecolor="white" if ckpt else None)
                    bx.plot(x, formula / 1e6, "k_", ms=9)
                j += 1
    bx.set_xticks(range(len(rungs)), [s.replace("_", "\n") for s in rungs])
    bx.set_ylabel("device peak per rank (MB = 10⁶ bytes)")
    bx.grid(True, axis="y", alpha=0.3)
    bx.set_title(f"Measured: {MEASURED['preset']} preset, {MEASURED['precision']}, micro-batch {MEASURED['batch']} × "
                 f"{MEASURED['seq']}, N = {', '.join(map(str, measured_worlds))}:\nrank 0's ledger (bars) = the "
                 "formula (black marks), to the byte\n(N = 64 is the formula only: 64 processes do not fit this laptop)")
    fig.suptitle("How large a model fits one device, per rung: sharding shrinks the model states by N, offload moves "
                 "the optimizer off the device, infinity the parameters too")
    return fig


def ledger_side_by_side(world=4, pipeline_accum=4):
    """The per-rank ledger of every trainer (the ladder, pipeline with P = world stages and
    pipeline_accum micro-batches, infinity in host memory and on disk) on the measured small runs at N = world, as a markdown
    table: one row per category and location that any rung uses, peak bytes of rank 0, and of the
    last rank where it differs (pipeline: the first and last stage). docs/infinity.md shows it."""
    rungs = [s for s in STAGES + ["pipeline", "infinity"] if (bin_dir() / s).is_file()]
    reps = {s: run_pipeline(stages=world, accum=pipeline_accum, steps=MEASURED["steps"]) if s == "pipeline"
            else run(s, world) for s in rungs}
    if "infinity" in rungs:  # and its disk tier (the files' directory: the reports', which stays)
        rungs.append("infinity (disk)")
        reps[rungs[-1]] = run("infinity", world, extra=("--offload-param", "disk", "--offload-dir", str(runs_dir())))
    cats = CATEGORIES + ["scratch"]
    rows = []
    for loc in ("device", "host", "disk"):
        for c in cats:
            cells = []
            for s in rungs:
                first, last = (reps[s]["ranks"][r]["ledger"][loc]["peak"].get(c, 0) for r in (0, -1))
                cells.append(f"{first:,}" if first == last else f"{first:,} / {last:,}")
            if any(x != "0" for x in cells):
                rows.append(f"| {c} ({loc}) | " + " | ".join(cells) + " |")
        tot = [tuple(sum(reps[s]["ranks"][r]["ledger"][loc]["peak"].get(c, 0) for c in cats) for r in (0, -1))
               for s in rungs]
        if any(a or b for a, b in tot):
            rows.append(f"| **{loc}, all categories** | " + " | ".join(
                f"**{a:,}**" if a == b else f"**{a:,} / {b:,}**" for a, b in tot) + " |")
    head = (f"| peak bytes, rank 0 (a / b: rank 0 / rank {world - 1}) | " + " | ".join(rungs) + " |\n|---|"
            + "---|" * len(rungs))
    return head + "\n" + "\n".join(rows)


# ---------------------------------------------------------------------------------------------
# Figure 2: model-state memory per rank against the number of ranks
# ---------------------------------------------------------------------------------------------

def fig_scaling(reports, params="7.5B", capacity_gb=80, max_world=1024):
    """Left: the formula for a big model (raw Ψ, bf16 mixed), N = 1..max_world, with a device
    capacity line, and for 7.5B the ZeRO paper's Table 1 written on the curves. Right: the measured runs (markers) on their own formula (lines), as bytes per
    parameter, so the two panels share a y meaning."""
    worlds = [2 ** k for k in range(max_world.bit_length()) if 2 ** k <= max_world]
    big = estimate(worlds=worlds, params=params, precision="bf16")
    fig = Figure(figsize=(15, 5.5), layout="constrained")
    ax, bx = fig.subplots(1, 2, width_ratios=[1.25, 1])

    for s in STAGES:
        rec = [e for e in big["estimates"] if e["stage"] == s]
        n = [e["world"] for e in rec]
        if s == "offload":
            ax.plot(n, [e["device"] / 1e9 for e in rec], "-", color=STAGE_COLOR[s], lw=2, label=f"{s}: device")
            ax.plot(n, [e["host"] / 1e9 for e in rec], "--", color=STAGE_COLOR[s], lw=2, label=f"{s}: host")
        else:
            ax.plot(n, [e["model_state"] / 1e9 for e in rec], "-o", ms=3, color=STAGE_COLOR[s], lw=2,
                    label=STAGE_LABEL[s])
    if params == "7.5B":  # the paper's own example: write its Table 1 on the curves
        for n, row in paper_cells(0).items():
            shown = set()
            for s, text in row.items():
                if text in shown or (s == "stage0_ddp" and n > 1):  # 120 once, at N = 1
                    continue
                shown.add(text)
                y = float(text)
                ax.plot(n, y, "o", color="black", ms=4, zorder=4)
                right = n == max(worlds)  # the last column's labels go left of the point
                ax.annotate(text, (n, y), xytext=(-4 if right else 4, 4), textcoords="offset points", fontsize=8,
                            ha="right" if right else "left",
                            color="black" if n == 1 else STAGE_COLOR[s],
                            bbox=dict(boxstyle="round,pad=0.15", fc="white", ec="none", alpha=0.8), zorder=5)
    ax.axhline(capacity_gb, color="black", ls=":", lw=1.5)
    ax.text(worlds[-1], capacity_gb * 0.92, f"device capacity {capacity_gb:g} GB", ha="right", va="top")
    ax.set_xscale("log", base=2)
    ax.set_xticks(worlds, [str(n) for n in worlds])
    ax.set_yscale("log")
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.set_xlabel("number of ranks N (data-parallel devices)")
    ax.set_ylabel("model-state memory per rank (GB = 1e9 bytes)")
    ax.set_title(f"Formula (zero_estimate --json): Ψ = {params} parameters, bf16 mixed\n"
                 "params + grads + fp32 master + Adam m, v: (2 + 2 + 12)Ψ at N = 1" +
                 ("\nnumbers: the ZeRO paper's Table 1 cells (zero_estimate --paper-table)" if params == "7.5B" else ""))
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(loc="lower left")

    # right: the measured runs as bytes per parameter
    measured_worlds = sorted({n for (_, n) in reports})
    for s in STAGES:
        ns = [n for n in measured_worlds if (s, n) in reports]
        if not ns:
            continue
        rep = reports[(s, ns[0])]
        psi = rep["num_params"]
        line = estimate(worlds=ns, stage=s, precision=rep["precision"], preset=rep["preset"],
                        batch=rep["batch"], seq=rep["seq"])["estimates"]
        meas = [measured(reports[(s, n)]) for n in ns]
        host = [measured_at(reports[(s, n)], "host") for n in ns]
        if s == "offload":
            dev_f = [(e["model_state"] - e["host"]) / psi for e in line]
            bx.plot(ns, dev_f, "-", color=STAGE_COLOR[s], lw=2, label=f"{s}: device (formula)")
            bx.plot(ns, [e["host"] / psi for e in line], "--", color=STAGE_COLOR[s], lw=2, label=f"{s}: host (formula)")
            bx.plot(ns, [sum(m[c] - h[c] for c in MODEL_STATE) / psi for m, h in zip(meas, host)], "s",
                    color=STAGE_COLOR[s], ms=9, mfc="none", mew=2, label=f"{s}: device (ledger)")
            bx.plot(ns, [sum(h[c] for c in MODEL_STATE) / psi for h in host], "^", color=STAGE_COLOR[s], ms=9,
                    mfc="none", mew=2, label=f"{s}: host (ledger)")
        else:
            bx.plot(ns, [e["model_state"] / psi for e in line], "-", color=STAGE_COLOR[s], lw=2)
            bx.plot(ns, [sum(m[c] for c in MODEL_STATE) / psi for m in meas], "o", color=STAGE_COLOR[s], ms=9,
                    mfc="none", mew=2, label=f"{STAGE_LABEL[s]}")
    rep0 = next(iter(reports.values()))
    bx.set_xticks(measured_worlds)
    bx.set_xlabel("number of ranks N (MPI processes)")
    bx.set_ylabel("model-state bytes per rank / Ψ  (bytes per parameter)")
    bx.set_title(f"Measured: {rep0['preset']} preset, Ψ = {rep0['num_params']:,}, {rep0['precision']}\n"
                 "markers: memory ledger; lines: formula (with the one-unit buffers)")
    bx.set_ylim(bottom=0)
    bx.grid(True, alpha=0.3)
    bx.legend(loc="center left", bbox_to_anchor=(1.01, 0.5))
    return fig


# ---------------------------------------------------------------------------------------------
# Figure 3: memory through set-up and the first training steps, from the ledger timeline
# ---------------------------------------------------------------------------------------------

PHASE_COLOR = {"setup": "#e6e6e6", "forward": "#dceaf7", "backward": "#fbe3cc", "optimizer": "#dcefd6"}


def _short_unit(name):
    """'gathered block3' -> 'b3', 'gathered embed' -> 'emb', 'gathered lnf' -> 'lnf'."""
    n = name.removeprefix("gathered ").strip()
    return "b" + n[5:] if n.startswith("block") else {"embed": "emb"}.get(n, n)


def fig_timeline(reports, world=4):
    """One panel per stage: model-state bytes on rank 0's device after every allocation or free,
    stacked by category, on an x-axis of phases: set-up, then forward, backward and optimizer of each
    step (the ledger tags every event with its step and phase; within a phase the events are evenly
    spaced). stage3's gathers are labelled with their unit. Offload's host bytes: a dashed line.
    The activations are left out: one block allocated at set-up, the same in every stage."""
    stages = [s for s in STAGES if (s, world) in reports]
    order = MODEL_STATE
    timelines = {s: [e for e in reports[(s, world)]["ranks"][0]["ledger"]["timeline"] if e["category"] in order]
                 for s in stages}
    steps = reports[(stages[0], world)]["steps"]
    # The phases, in the order a step runs them; any other phase name the ledger uses goes at its end.
    segments = [("setup", -1)] + [(ph, st) for st in range(steps) for ph in ("forward", "backward", "optimizer")]
    for evs in timelines.values():
        for e in evs:
            if (e["phase"], e["step"]) not in segments:
                segments.append((e["phase"], e["step"]))
    # A segment's width: its most events in any stage (at least 2), so the panels share one x-axis.
    width = {seg: max(2, max(sum(1 for e in evs if (e["phase"], e["step"]) == seg) for evs in timelines.values()))
             for seg in segments}
    start, x = {}, 0.0
    for seg in segments:
        start[seg] = x
        x += width[seg] + 1
    x_end = x

    fig = Figure(figsize=(13, 2.5 * len(stages) + 1.0), layout="constrained")
    # each panel on its own scale, so that stage3's saw-tooth shows (fig_categories compares sizes)
    axes = fig.subplots(len(stages), 1, squeeze=False, sharex=True)[:, 0]
    for ax, s in zip(axes, stages):
        for seg in segments:
            ax.axvspan(start[seg], start[seg] + width[seg] + 1, color=PHASE_COLOR.get(seg[0], "#f4f4f4"), zorder=0)
        cur = {c: 0 for c in order}
        host = 0
        xs, ys, hs = [0.0], [[0] for _ in order], [0]
        seen = {seg: 0 for seg in segments}
        labels = []
        for e in timelines[s]:
            seg = (e["phase"], e["step"])
            seen[seg] += 1
            xe = start[seg] + seen[seg]
            if e["location"] == "device":
                cur[e["category"]] += e["delta"]
            else:
                host += e["delta"]
            xs.append(xe)
            for k, c in enumerate(order):
                ys[k].append(cur[c] / 1e6)
            hs.append(host / 1e6)
            if e["category"] == "gathered" and e["delta"] > 0:
                labels.append((xe, sum(cur.values()) / 1e6, _short_unit(e["name"])))
        xs.append(x_end)
        for y in ys:
            y.append(y[-1])
        hs.append(hs[-1])
        ax.stackplot(xs, ys, step="post", colors=[CAT_COLOR[c] for c in order], zorder=1,
                     labels=order if ax is axes[0] else ())
        if any(hs):
            ax.step(xs, hs, where="post", color="black", ls="--", lw=1.5, zorder=2, label="host (all categories)")
            ax.legend(loc="upper right", fontsize=8)
        for xe, ye, name in labels:
            ax.text(xe + 0.5, ye, name, rotation=90, ha="center", va="bottom", fontsize=7, zorder=3)
        ax.set_ylim(0, 1.3 * max(max(sum(y[i] for y in ys) for i in range(len(xs))), max(hs)))
        n_setup = sum(1 for e in timelines[s] if e["step"] < 0)
        n_steps = len(timelines[s]) - n_setup
        what = (f"{n_steps} during the steps: every gather (labelled with its unit) and release"
                if n_steps else "none during the steps")
        ax.set_title(f"{STAGE_LABEL[s]}: {n_setup} model-state allocations in set-up, {what}", loc="left", fontsize=10)
        ax.set_ylabel("MB")
    axes[0].legend(loc="upper left", ncols=4, fontsize=8)
    names = {"setup": "set-up", "forward": "forward", "backward": "backward", "optimizer": "optimizer"}
    axes[-1].set_xticks([start[seg] + (width[seg] + 1) / 2 for seg in segments],
                        [names.get(ph, ph) + (f"\nstep {st + 1}" if st >= 0 else "") for ph, st in segments],
                        fontsize=9)
    axes[-1].tick_params(axis="x", length=0)
    axes[-1].set_xlim(0, x_end)
    rep0 = reports[(stages[0], world)]
    acts = rep0["ranks"][0]["ledger"]["device"]["peak"]["activations"]
    fig.suptitle(f"Memory ledger timeline: model-state bytes on rank 0's device after each allocation or free\n"
                 f"N = {world} ranks, {rep0['preset']} preset, {rep0['precision']}, MB = 10⁶ bytes, each panel "
                 f"on its own scale; within a phase the events are evenly spaced\nnot drawn: the activations ({acts / 1e6:.2f} MB, allocated once "
                 f"at set-up in every stage)")
    return fig


# ---------------------------------------------------------------------------------------------
# Figure 4: elements communicated per step
# ---------------------------------------------------------------------------------------------

# One marker per stage; sizes shrink along the ladder so that markers at the same point nest.
COMM_MARKER = {"stage0_ddp": ("o", 15), "stage1": ("s", 11), "stage2": ("D", 7.5), "stage3": ("^", 10),
               "offload": ("v", 5)}


def fig_comm(reports, accum_reports=None):
    """Bytes each rank moves in one optimizer step, measured (markers, rank 0's last step) on their
    formula curves. Left: over the network, with accum K = 1, against the paper's 2Ψ(N−1)/N and
    3Ψ(N−1)/N elements times e bytes each. Right, on its own axis: offload's host↔device link, K·S
    elements down (the gradient slice of each micro-step) and S up (the updated parameter slice), with
    the runs at K > 1 from accum_reports ({(stage, K): report}, as run_accums returns) if given."""
    worlds = sorted({n for (_, n) in reports})
    fig = Figure(figsize=(15, 5.8), layout="constrained")
    ax, bx = fig.subplots(1, 2, width_ratios=[1.35, 1])
    rep0 = next(iter(reports.values()))
    psi = rep0["num_params"]
    last0 = rep0["steps_log"][-1]
    e = last0["comm_bytes"] / last0["comm_elems"] if last0["comm_elems"] else (2 if rep0["precision"] == "bf16" else 4)
    n = np.linspace(1, max(worlds), 200)
    ax.plot(n, 2 * psi * e * (n - 1) / n / 1e6, "-", color="gray", lw=2, zorder=1,
            label="2Ψ(N−1)/N elements: all-reduce = reduce-scatter + all-gather")
    ax.plot(n, 3 * psi * e * (n - 1) / n / 1e6, "-.", color="gray", lw=2, zorder=1,
            label="3Ψ(N−1)/N elements: stage3 gathers twice + reduce-scatter")
    for s in STAGES:
        ns = [w for w in worlds if (s, w) in reports]
        if not ns:
            continue
        # the paper's curves are for one micro-step per step; K > 1 is fig_comm_vs_accum's
        assert all(reports[(s, w)]["accum"] == 1 for w in ns), "the comparison is per step with accum K = 1"
        m, size = COMM_MARKER[s]
        ax.plot(ns, [reports[(s, w)]["steps_log"][-1]["comm_bytes"] / 1e6 for w in ns], m, color=STAGE_COLOR[s],
                ms=size, mfc="none", mew=2, zorder=2, label=f"{STAGE_LABEL[s]} (measured)")
    ax.set_xticks(worlds)
    ax.set_xlabel("number of ranks N")
    ax.set_ylabel("bytes sent per rank per step over the network (MB = 10⁶ bytes)")
    ax.set_title(f"Network: collectives, accum K = 1, e = {e:g} bytes per element\n"
                 "markers: comm ledger; nested markers at one point = stages that send the same")
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    ax.legend(loc="upper left", fontsize=8)

    # right: offload's host link, elements times the bytes the link moves per element
    runs = {(1, w): reports[("offload", w)] for w in worlds if ("offload", w) in reports}
    runs.update({(k, r["world"]): r for (st, k), r in (accum_reports or {}).items() if st == "offload"})
    if runs:
        tot = next(iter(runs.values()))["ranks"][0]["comm"]
        e_down = tot["to_host_bytes"] / tot["to_host_elems"]
        e_up = tot["to_device_bytes"] / tot["to_device_elems"]
        accums = sorted({k for k, _ in runs})
        for i, k in enumerate(accums):
            pts = sorted(((w, r) for (kk, w), r in runs.items() if kk == k), key=lambda p: p[0])
            bx.plot(n, k * psi * e_down / n / 1e6, "-", color=STAGE_COLOR["offload"], lw=2.5 - 0.5 * i,
                    alpha=1 - 0.25 * i, zorder=1, label=f"down, K = {k}: K·S elements (S = Ψ/N)")
            bx.plot([w for w, _ in pts], [r["steps_log"][-1]["to_host_elems"] * e_down / 1e6 for _, r in pts], "v",
                    color=STAGE_COLOR["offload"], ms=10, mfc="none", mew=2, zorder=2,
                    label=f"down, K = {k} (measured)")
        bx.plot(n, psi * e_up / n / 1e6, "--", color="black", lw=1.5, zorder=1, label="up, any K: S elements")
        pts = sorted(((w, r) for (_, w), r in runs.items()), key=lambda p: p[0])
        bx.plot([w for w, _ in pts], [r["steps_log"][-1]["to_device_elems"] * e_up / 1e6 for _, r in pts], "^",
                color="black", ms=6, mfc="none", mew=1.5, zorder=2, label="up (measured, every run)")
        bx.set_title(f"Host↔device link (offload only), {e_down:g} bytes per element\n"
                     "down: every micro-step's gradient slice; up: the updated slice")
        bx.set_ylim(bottom=0)
        bx.legend(loc="upper right", fontsize=8)
    else:
        bx.text(0.5, 0.5, "offload not built", ha="center", transform=bx.transAxes)
    bx.set_xticks(worlds)
    bx.set_xlabel("number of ranks N")
    bx.set_ylabel("bytes per rank per step over the host link (MB)")
    bx.grid(True, alpha=0.3)
    fig.suptitle(f"Bytes moved per optimizer step: {rep0['preset']} preset, Ψ = {psi:,}, {rep0['precision']} "
                 "(units padded to a multiple of N: a few elements above the curves)")
    return fig


# ---------------------------------------------------------------------------------------------
# Figure 5: elements communicated per step against gradient accumulation
# ---------------------------------------------------------------------------------------------

# How each stage's traffic grows with K, as common/zero_formulas.h writes it (labels only: the
# numbers come from zero_estimate).
SENT_FORMULA = {"stage0_ddp": "2(N−1)S", "stage1": "2(N−1)S", "stage2": "(K+1)(N−1)S",
                "stage3": "3K(N−1)S", "offload": "(K+1)(N−1)S"}


def comm_by_accum(world=4, accums=range(1, 9), preset=MEASURED["preset"], precision="bf16"):
    """Elements each rank sends per optimizer step of K micro-steps, from zero_estimate --accum K:
    {"world", "shard" (S), "accums", "sent": {stage: [elements for each K]}}."""
    accums = list(accums)
    sent = {s: [] for s in STAGES}
    for k in accums:
        est = estimate(worlds=[world], preset=preset, precision=precision, accum=k)
        assert est["accum"] == k
        for e in est["estimates"]:
            if e["stage"] in sent:  # the ladder (infinity sends stage3's elements, and more on the link)
                sent[e["stage"]].append(e["comm_elems_per_step"])
    shard = est["estimates"][0]["shard_params"]
    return {"world": world, "shard": shard, "accums": accums, "sent": sent, "preset": preset}


def comm_table(data):
    """comm_by_accum's numbers as text: one row per stage, one column per K, in units of (N−1)S."""
    unit = (data["world"] - 1) * data["shard"]
    head = f"{'(N−1)S x':<12}" + "".join(f"{'K=' + str(k):>7}" for k in data["accums"]) + "   formula"
    rows = [head]
    for s in STAGES:
        rows.append(f"{s:<12}" + "".join(f"{v / unit:>7g}" for v in data["sent"][s]) + f"   {SENT_FORMULA[s]}")
    return (f"elements each rank sends per optimizer step, N = {data['world']}, {data['preset']} preset: "
            f"(N−1)S = {unit:,} elements\n" + "\n".join(rows))


def run_accums(world=4, accums=(1, 2, 4), stages=None, **kw):
    """The built stages at N = world with --accum K for each K: {(stage, K): report} (K = 1 is the
    same cached run as run_stages's)."""
    have, _ = built_stages()
    return {(s, k): run(s, world, extra=() if k == 1 else ("--accum", str(k)), **kw)
            for s in (stages or STAGES) if s in have for k in accums}


def fig_comm_vs_accum(world=4, accums=range(1, 9), measured=None, preset=MEASURED["preset"]):
    """Elements each rank sends per optimizer step against the micro-steps K, per stage, in units of
    (N−1)S: lines from zero_estimate --accum K; markers, if given, the comm ledger of real runs
    ({(stage, K): report} at N = world, as run_accums returns)."""
    data = comm_by_accum(world, accums, preset=preset)
    unit = (world - 1) * data["shard"]
    fig = Figure(figsize=(12, 5.5), layout="constrained")
    ax = fig.add_subplot()
    # stage1 draws on stage0, offload on stage2: the dashes let the lower line show through
    style = {"stage0_ddp": dict(ls="-", lw=5, alpha=0.5), "stage1": dict(ls="--", lw=2),
             "stage2": dict(ls="-", lw=5, alpha=0.5), "stage3": dict(ls="-", lw=2),
             "offload": dict(ls="--", lw=2)}
    for s in STAGES:
        ax.plot(data["accums"], [v / unit for v in data["sent"][s]], color=STAGE_COLOR[s],
                label=f"{STAGE_LABEL[s]}: {SENT_FORMULA[s]}", **style[s])
    markers = {"stage0_ddp": "o", "stage1": "s", "stage2": "D", "stage3": "^", "offload": "v"}
    offsets = {s: (i - 2) * 0.05 for i, s in enumerate(STAGES)}  # side by side at each K
    for s in STAGES:
        pts = sorted((k, rep) for (st, k), rep in (measured or {}).items() if st == s)
        if not pts:
            continue
        for k, rep in pts:
            assert rep["world"] == world and rep["accum"] == k and rep["preset"] == preset, (s, k)
        ax.plot([k + offsets[s] for k, _ in pts], [rep["steps_log"][-1]["comm_elems"] / unit for _, rep in pts],
                markers[s], color=STAGE_COLOR[s], ms=9, mfc="none", mew=2, label=f"{STAGE_LABEL[s]} (measured)")
    ax.set_xticks(data["accums"])
    ax.set_xlabel("micro-steps per optimizer step K (--accum)" +
                  ("; markers spread sideways so that none hides another" if measured else ""))
    ax.set_ylabel("elements sent per rank per step / (N−1)S")
    ax.set_title(f"Communication per optimizer step against gradient accumulation, N = {world} ranks\n"
                 f"{preset} preset: (N−1)S = {unit:,} elements. Lines: zero_estimate --accum K"
                 f"{'; markers: comm ledger of real runs' if measured else ''}")
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    ax.legend(loc="center left", bbox_to_anchor=(1.01, 0.5))
    return fig


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


# ---------------------------------------------------------------------------------------------
# Inference: build/bin/generate, its --bench table and its statistics line
# ---------------------------------------------------------------------------------------------

PLACE_COLOR = {"device": "#444444", "host": "#1f77b4", "disk": "#9467bd", "sharded": "#d62728"}
PLACE_MARKER = {"device": "o", "host": "s", "disk": "D", "sharded": "^"}


def generate(world=1, args=()):
    """[mpirun -np world] generate ARGS: (stdout, stderr), cached like run()'s reports (the same
    command with the same binary is run once). OpenMP threads wait passively: decoding runs many
    small parallel regions, and on a shared machine a spinning thread steals its partner's core."""
    exe = bin_dir() / "generate"
    st = exe.stat()
    args = [str(a) for a in args]
    key = hashlib.sha1(json.dumps([str(exe), st.st_mtime_ns, st.st_size, world, args]).encode()).hexdigest()[:12]
    out = runs_dir() / f"generate_N{world}_{key}.json"
    if not out.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        cmd = ([] if world == 1 else ["mpirun", "-np", str(world)]) + [str(exe), *args]
        p = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, env={**os.environ, "OMP_WAIT_POLICY": "passive"})
        if p.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed (exit {p.returncode}):\n{p.stdout}{p.stderr}")
        out.write_text(json.dumps([p.stdout, p.stderr]))
    return tuple(json.loads(out.read_text()))


def generate_stats(world=1, args=()):
    """The numbers of generate's `stats:` line (steps, link_bytes, allgather_elems, kv_cache, ...)
    for one run: {name: int}."""
    _, err = generate(world, args)
    line = [l for l in err.splitlines() if l.startswith("stats:")][-1]
    return {k: int(v) for k, v in (kv.split("=") for kv in line.split()[1:])}


def bench_inference(preset="small", length=4, worlds=(1, 2)):
    """generate --preset P --bench --length L, on one rank (device, host, disk) and under mpirun for
    each other N in worlds (sharded): {"steps": L, "rows": {placement: {B: {"tokens_s", "ms_step",
    "link_bytes", "allgather_bytes"}}}, "text": the tables as printed}. Bytes are per generated
    token; placement "sharded" is named "sharded N=2" etc."""
    rows, text = {}, []
    for n in worlds:
        out, _ = generate(n, ["--preset", preset, "--bench", "--length", length])
        text.append(out.rstrip())
        for line in out.splitlines():
            f = line.split()
            if len(f) == 6 and f[0] in PLACE_COLOR and f[1].isdigit():
                place = f[0] if f[0] != "sharded" else f"sharded N={n}"
                rows.setdefault(place, {})[int(f[1])] = {
                    "tokens_s": float(f[2]), "ms_step": float(f[3]), "link_bytes": float(f[4]),
                    "allgather_bytes": float(f[5])}
    return {"steps": length, "preset": preset, "rows": rows, "text": "\n".join(text)}


def fig_inference(bench, formula=None):
    """Left: tokens/s against the batch B for each weight placement (bench_inference's runs).
    Right: bytes moved per generated token (host→device link, or all-gathered per rank), measured
    (markers) on formula lines if given ({placement: function of B giving bytes per token})."""
    fig = Figure(figsize=(14, 5.5), layout="constrained")
    ax, bx = fig.subplots(1, 2)
    for place, byb in bench["rows"].items():
        base = place.split()[0]
        bs = sorted(byb)
        ax.plot(bs, [byb[b]["tokens_s"] for b in bs], "-" + PLACE_MARKER[base], color=PLACE_COLOR[base], lw=2,
                ms=8, label=place)
        moved = [byb[b]["link_bytes"] + byb[b]["allgather_bytes"] for b in bs]
        if any(moved):
            bx.plot(bs, [m / 1e6 for m in moved], PLACE_MARKER[base], color=PLACE_COLOR[base], ms=11, mfc="none",
                    mew=2, label=f"{place} (measured)", zorder=2)
        if formula and place in formula and any(formula[place](b) for b in bs):
            x = np.geomspace(min(bs), max(bs), 60)
            bx.plot(x, [formula[place](b) / 1e6 for b in x], "-", color=PLACE_COLOR[base], lw=1.5, alpha=0.6,
                    label=f"{place} (formula)", zorder=1)
    for a in (ax, bx):
        a.set_xscale("log", base=2)
        a.set_xticks(sorted({b for byb in bench["rows"].values() for b in byb}))
        a.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        a.set_xlabel("sequences decoded together B (--batch)")
        a.grid(True, alpha=0.3)
    ax.set_yscale("log")
    ax.set_ylabel("tokens per second (all B sequences)")
    ax.set_title(f"Throughput, {bench['preset']} preset, KV cache, {bench['steps']} decode steps per run\n"
                 "(the fastest of 3 runs; a shared machine makes these noisy)")
    ax.legend()
    bx.set_yscale("log")
    lo, hi = bx.get_ylim()
    bx.set_yticks([t for t in (m * 10.0 ** k for k in range(-3, 3) for m in (1, 2, 5)) if lo <= t <= hi])
    bx.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    bx.yaxis.set_minor_formatter(FuncFormatter(lambda v, _: ""))
    bx.set_ylabel("bytes moved per generated token (MB)")
    bx.set_title("Weights moved per token: host→device link, or sent per rank by the all-gathers\n"
                 "(device: none). Each step moves the model once (sharded: (N−1)/N of it), whatever B")
    bx.legend(fontsize=8)
    return fig


# ---------------------------------------------------------------------------------------------
# The pipeline (pipeline/train.cpp, docs/pipeline.md)
# ---------------------------------------------------------------------------------------------

OP_COLOR = {"F": "#1f77b4", "B": "#ff7f0e"}


def _pipeline_rows(ax, report, title):
    """One row per stage, its last step as measured: a box per stretch of compute (F blue, B orange,
    the micro-batch written on the op's longest stretch), the waits left blank."""
    ranks = report["pipeline"]["ranks"]
    P = report["pipeline"]["stages"]
    longest = {}
    for r, rank in enumerate(ranks[:P]):  # replica 0: ranks 0..P-1 are its stages when D = 1
        for op, k, kind, t0, t1 in rank["events"]:
            if kind != "compute":
                continue
            ax.broken_barh([(t0, t1 - t0)], (r - 0.4, 0.8), facecolors=OP_COLOR[op], edgecolor="white", lw=0.3)
            if t1 - t0 > longest.get((r, op, k), (0, 0, 0))[0]:
                longest[(r, op, k)] = (t1 - t0, t0, t1)
    for (r, op, k), (_, t0, t1) in longest.items():
        ax.text((t0 + t1) / 2, r, str(k), ha="center", va="center", fontsize=7, color="white")
    ax.set_yticks(range(P))
    ax.set_yticklabels([f"stage {s}" for s in range(P)])
    ax.invert_yaxis()
    ax.set_xlabel("ms (the last step)")
    idle = [x["idle"] for x in ranks[:P]]
    ax.set_title(f"{title}: idle {min(idle):.2f}..{max(idle):.2f} per stage, (P-1)/(K+P-1) = "
                 f"{report['pipeline']['bubble_formula']:.2f}")


def fig_pipeline_diagram(stages=4, accum=8, **kw):
    """The classic pipeline diagram, GPipe above 1F1B, from real runs' events (K micro-batches, P stages)."""
    fig = Figure(figsize=(11, 5.5), layout="constrained")
    axes = fig.subplots(2, 1)
    for ax, schedule in zip(axes, ("gpipe", "1f1b")):
        _pipeline_rows(ax, run_pipeline(stages, accum, schedule, **kw), f"{schedule}, P = {stages}, K = {accum}")
    fig.legend(handles=[Patch(color=OP_COLOR["F"], label="forward"), Patch(color=OP_COLOR["B"], label="backward")],
               loc="outside lower center", ncols=2)
    return fig


def bubble_by_accum(stages=4, accums=(1, 2, 4, 8, 16), schedule="1f1b", **kw):
    """{K: (formula, mean idle over the stages, the least idle stage's)} measured on real runs."""
    out = {}
    for k in accums:
        pp = run_pipeline(stages, k, schedule, **kw)["pipeline"]
        idle = [x["idle"] for x in pp["ranks"]]
        out[k] = (pp["bubble_formula"], sum(idle) / len(idle), min(idle))
    return out


def fig_bubble_vs_accum(stages=4, accums=(1, 2, 4, 8, 16), **kw):
    """The bubble against K: the measured idle fraction beside (P-1)/(K+P-1)."""
    data = bubble_by_accum(stages, accums, **kw)
    fig = Figure(figsize=(7, 4.5), layout="constrained")
    ax = fig.subplots()
    ks = np.arange(1, max(accums) + 1)
    ax.plot(ks, (stages - 1) / (ks + stages - 1), color="#444444", label=f"(P-1)/(K+P-1), P = {stages}")
    ax.plot(list(data), [v[1] for v in data.values()], "o", color="#1f77b4", label="measured: mean over the stages")
    ax.plot(list(data), [v[2] for v in data.values()], "s", color="#ff7f0e", label="measured: the busiest stage")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("K, micro-batches per step")
    ax.set_ylabel("idle fraction")
    ax.set_ylim(0, 1)
    ax.legend()
    ax.set_title("the bubble against K (1F1B); on a shared CPU the stages are not equal")
    return fig


# ---------------------------------------------------------------------------------------------
# ZeRO++ (zeropp/train.cpp, docs/zeropp.md): bytes inside and across nodes, a time model, and
# whether it still learns
# ---------------------------------------------------------------------------------------------

ZEROPP_TECHNIQUES = ["stage3", "qwZ", "hpZ", "qgZ", "ZeRO++"]
ZEROPP_COLOR = {"stage3": STAGE_COLOR["stage3"], "ZeRO++": "#1f77b4", "qwZ": "#2ca02c", "qgZ": "#9467bd",
                "hpZ": "#ff7f0e"}
# The interconnects of docs/zeropp.md: inside a node 300 GB/s (NVLink-class); across nodes a fast
# 25 GB/s (200 Gbit/s InfiniBand) and a slow 3.125 GB/s (25 Gbit/s Ethernet), in GB = 10^9 bytes.
ZEROPP_INTRA_GBS = 300
ZEROPP_NETWORKS = {"fast": 25.0, "slow": 3.125}


def zeropp_estimate(worlds, node_size, preset="gpt2", precision="bf16", qw_block=256, qg_block=256, network=None,
                    compute_ms=None, extra=()):
    """zero_estimate --zeropp G --json: {(N, technique): record} with the bytes each rank sends per step
    (comm_bytes_per_step), of them across nodes (comm_bytes_across_nodes_per_step), inside a node
    (computed here as the difference: "inside"), the bytes it adds (state_bytes_added) and, with
    network = (INTRA, INTER) GB/s, the model's step_ms (compute_ms + inside/INTRA + across/INTER)."""
    cmd = [str(bin_dir() / "zero_estimate"), "--json", "--zeropp", str(node_size), "--preset", preset,
           "--precision", precision, "--world", ",".join(str(n) for n in worlds), "--qw-block", str(qw_block),
           "--qg-block", str(qg_block), *[str(x) for x in extra]]
    if network is not None:
        cmd += ["--network", f"{network[0]:g},{network[1]:g}"]
        if compute_ms is not None:
            cmd += ["--compute-ms", f"{compute_ms:g}"]
    out = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
    recs = {}
    for e in out["estimates"]:
        e = dict(e, inside=e["comm_bytes_per_step"] - e["comm_bytes_across_nodes_per_step"])
        recs[(e["world"], e["technique"])] = e
    return recs


ZEROPP_FIG_WORLDS = (8, 16, 32, 64, 128, 256, 512, 1024)


def zeropp_network_times(worlds=ZEROPP_FIG_WORLDS, node_size=8, compute_ms=100, block=2048, preset="gpt2",
                         precision="bf16"):
    """{network name: {(N, technique): record with step_ms}} for the fast and the slow interconnect."""
    return {name: zeropp_estimate(worlds, node_size, preset, precision, block, block, (ZEROPP_INTRA_GBS, inter),
                                  compute_ms)
            for name, inter in ZEROPP_NETWORKS.items()}


def fig_zeropp_network(worlds=ZEROPP_FIG_WORLDS, node_size=8, compute_ms=100, block=2048, preset="gpt2",
                       precision="bf16"):
    """Left: the communication time per step against N (the bytes over the links, nothing overlapped)
    for stage3 and ZeRO++ on a fast and a slow interconnect. Right: the time per step, compute
    included, and ZeRO++'s share of stage3's written at each point. All from zero_estimate --network."""
    times = zeropp_network_times(worlds, node_size, compute_ms, block, preset, precision)
    fig = Figure(figsize=(14, 5.5), layout="constrained")
    ax, bx = fig.subplots(1, 2)
    for name, recs in times.items():
        style = "-" if name == "slow" else "--"
        for t in ("stage3", "ZeRO++"):
            comm = [recs[(n, t)]["step_ms"] - compute_ms for n in worlds]
            step = [recs[(n, t)]["step_ms"] for n in worlds]
            label = f"{t}, {name} ({ZEROPP_NETWORKS[name]:g} GB/s across)"
            ax.plot(worlds, comm, style + "o", color=ZEROPP_COLOR[t], lw=2, ms=5, label=label)
            bx.plot(worlds, step, style + "o", color=ZEROPP_COLOR[t], lw=2, ms=5, label=label)
        for n in worlds[1:]:
            share = recs[(n, "ZeRO++")]["step_ms"] / recs[(n, "stage3")]["step_ms"]
            bx.annotate(f"{share:.2f}", (n, recs[(n, "ZeRO++")]["step_ms"]), textcoords="offset points",
                        xytext=(0, 7 if name == "slow" else -13), ha="center", fontsize=7.5,
                        color=ZEROPP_COLOR["ZeRO++"])
    bx.axhline(compute_ms, color="#888888", lw=1, ls=":", label=f"compute alone ({compute_ms:g} ms)")
    for a in (ax, bx):
        a.set_xscale("log", base=2)
        a.set_xticks(list(worlds))
        a.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        a.set_xlabel(f"ranks N (nodes of {node_size}; N = {node_size} is one node)")
        a.grid(True, alpha=0.3)
    ax.set_yscale("log")
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.set_ylabel("communication time per step (ms, log scale)")
    ax.set_title("Bytes per rank per step over the links: inside a node at "
                 f"{ZEROPP_INTRA_GBS} GB/s,\nacross nodes at the interconnect's rate, one after the other")
    ax.legend(fontsize=8)
    bx.set_ylabel("time per step (ms)")
    bx.set_ylim(0, None)
    bx.set_title(f"Time per step = {compute_ms:g} ms of compute + communication, nothing overlapped\n"
                 "(numbers: ZeRO++'s step as a share of stage3's)")
    bx.legend(fontsize=8, loc="upper left")
    fig.suptitle(f"When does ZeRO++ pay? {preset} shape, {precision}, blocks of {block} "
                 "(zero_estimate --zeropp --network). The model ignores latency, the overlap of prefetched "
                 "gathers with compute,\nlinks shared by a node's ranks, the collectives' algorithms and the "
                 "time spent quantizing: read it as an upper bound of the saving", fontsize=10)
    return fig


# The block-size study (scripts/zeropp_loss_study.sh --blocks): every run's final validation loss,
# committed as a table so that the figure needs no training.
ZEROPP_LOSS_TABLE = REPO / "docs" / "data" / "zeropp_loss_vs_block.tsv"
# two-sided 5 % points of Student's t with n - 1 degrees of freedom, for n seeds
T_CRIT_5PCT = {2: 12.71, 3: 4.303, 4: 3.182, 5: 2.776, 6: 2.571, 7: 2.447, 8: 2.365, 9: 2.306, 10: 2.262,
               11: 2.228, 12: 2.201, 16: 2.131, 20: 2.093}


def zeropp_loss_table(path=ZEROPP_LOSS_TABLE):
    """The block study's runs: {"command": the lines that made it, "runs": [{technique, bits, block,
    seed, val_loss}]}."""
    lines = Path(path).read_text().splitlines()
    command = [l[1:].strip() for l in lines if l.startswith("#")]
    rows = [l.split("\t") for l in lines if l and not l.startswith("#")]
    head, rows = rows[0], rows[1:]
    runs = []
    for r in rows:
        d = dict(zip(head, r))
        runs.append({"technique": d["technique"], "bits": None if d["bits"] == "-" else int(d["bits"]),
                     "block": None if d["block"] == "-" else int(d["block"]), "seed": int(d["seed"]),
                     "val_loss": float(d["val_loss"])})
    return {"command": command, "runs": runs}


def zeropp_loss_summary(table=None):
    """Per (technique, block): the paired difference to stage3 over the seeds — {"n", "mean", "sd",
    "t" = |mean| / (sd / √n), "signal": t beyond the two-sided 5 % point of Student's t} — and
    stage3's own spread over the seeds under the key ("stage3", None)."""
    table = table or zeropp_loss_table()
    base = {r["seed"]: r["val_loss"] for r in table["runs"] if r["technique"] == "stage3"}
    groups = {}
    for r in table["runs"]:
        if r["technique"] != "stage3":
            groups.setdefault((r["technique"], r["block"]), []).append(r["val_loss"] - base[r["seed"]])
    out = {("stage3", None): {"n": len(base), "mean": float(np.mean(list(base.values()))),
                              "sd": float(np.std(list(base.values()), ddof=1))}}
    for key, d in sorted(groups.items()):
        n, mean, sd = len(d), float(np.mean(d)), float(np.std(d, ddof=1))
        t = abs(mean) / (sd / np.sqrt(n)) if sd > 0 else float("inf")
        crit = T_CRIT_5PCT.get(n, 2.0)
        out[key] = {"n": n, "mean": mean, "sd": sd, "t": float(t), "signal": bool(t > crit), "t_crit": crit}
    return out


def fig_zeropp_loss_vs_block(table=None):
    """The final validation loss of ZeRO++ minus stage3's, paired by seed, against the block size:
    int8 weights (qwZ) and int4 gradients (qgZ) alone, mean ± sd over the seeds; filled markers where
    the mean is signal (t beyond Student's 5 % point), hollow where it is not; the grey band is ± one
    sd of stage3's own loss over the seeds (how far one run lands from another)."""
    table = table or zeropp_loss_table()
    summary = zeropp_loss_summary(table)
    fig = Figure(figsize=(8.5, 5.5), layout="constrained")
    ax = fig.subplots()
    noise = summary[("stage3", None)]
    ax.axhspan(-noise["sd"], noise["sd"], color="#dddddd", alpha=0.6,
               label=f"± sd of stage3's loss over the seeds ({noise['sd']:.3f})")
    ax.axhline(0, color="#444444", lw=1)
    for k, (tech, bits) in enumerate((("qwZ", 8), ("qgZ", 4))):
        keys = sorted(b for t, b in summary if t == tech)
        shift = 1.06 if k else 1 / 1.06  # side by side at each block size
        xs = [b * shift for b in keys]
        mean = [summary[(tech, b)]["mean"] for b in keys]
        sd = [summary[(tech, b)]["sd"] for b in keys]
        color = ZEROPP_COLOR[tech]
        ax.errorbar(xs, mean, yerr=sd, fmt="-", color=color, lw=1.5, capsize=4,
                    label=f"{tech}: int{bits} {'weights' if tech == 'qwZ' else 'gradients'}, mean ± sd")
        for x, b, m in zip(xs, keys, mean):
            sig = summary[(tech, b)]["signal"]
            ax.plot(x, m, "o", ms=8, color=color, mfc=color if sig else "white", mew=2)
    ax.plot([], [], "o", color="#444444", mfc="#444444", label="filled: signal (|mean| / (sd/√n) beyond t, 5 %)")
    ax.plot([], [], "o", color="#444444", mfc="white", mew=2, label="hollow: no signal")
    ax.set_xscale("log", base=2)
    blocks = sorted({b for t, b in summary if b})
    ax.set_xticks(blocks)
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.set_xlabel("values per fp32 scale (--qw-block, --qg-block); on tiny at N = 2, 8192 is one scale per "
                  "rank's slice of a unit")
    ax.set_ylabel("final validation loss minus stage3's (same seed)")
    n = noise["n"]
    cmd = next((c for c in table["command"] if "each run" in c), "")
    steps = cmd.split("--steps ")[1].split()[0] if "--steps " in cmd else "?"
    ax.set_title(f"Does ZeRO++ still learn? tiny, N = 2, {steps} steps, {n} seeds, paired by seed\n"
                 "(docs/data/zeropp_loss_vs_block.tsv, made by scripts/zeropp_loss_study.sh --blocks)")
    ax.legend(fontsize=8)
    ax.grid(True, alpha=0.3)
    return fig


# The compression study (scripts/compression_study.sh): every model's validation loss and the bytes
# of its format, committed as a table so that the figure needs no training.
COMPRESSION_TABLE = REPO / "docs" / "data" / "compression.tsv"
SMALL_SHAPE = {"vocab": 256, "ctx": 128, "layers": 5, "dim": 128}  # the `small` preset (common/layout.cpp)


def compression_table(path=COMPRESSION_TABLE):
    """The study's rows: {"command": the comment lines, "rows": [{format, block, sparsity, finetuned,
    seed, val_loss, bytes, how}]} (block and sparsity None where they do not apply)."""
    lines = Path(path).read_text().splitlines()
    command = [l[1:].strip() for l in lines if l.startswith("#")]
    rows = [l.split("\t") for l in lines if l and not l.startswith("#")]
    head, rows = rows[0], rows[1:]
    out = []
    for r in rows:
        d = dict(zip(head, r))
        out.append({"format": d["format"], "block": None if d["block"] == "-" else int(d["block"]),
                    "sparsity": None if d["sparsity"] == "-" else float(d["sparsity"]),
                    "finetuned": d["finetuned"] == "yes", "seed": int(d["seed"]),
                    "val_loss": float(d["val_loss"]), "bytes": int(d["bytes"]), "how": d["how"]})
    return {"command": command, "rows": out}


def compression_name(key):
    """A row's short name: "fp32", "int8 B=64", "int4 B=256", "pruned 0.5", with ", fine-tuned"
    after a fine-tuning (the dense one is "fp32, fine-tuned", int4's is quantization-aware)."""
    fmt, block, sparsity, finetuned = key
    name = fmt + (f" B={block}" if block else "") + (f" {sparsity:g}" if sparsity is not None else "")
    if finetuned:
        name += ", QAT fine-tuned" if fmt == "int4" else ", fine-tuned"
    return name


def _paired(d):
    n, mean = len(d), float(np.mean(d))
    sd = float(np.std(d, ddof=1)) if n > 1 else 0.0
    t = abs(mean) / (sd / np.sqrt(n)) if sd > 0 else (float("inf") if mean else 0.0)
    crit = T_CRIT_5PCT.get(n, 2.0)
    return {"mean": mean, "sd": sd, "t": float(t), "signal": bool(t > crit), "t_crit": crit}


def compression_summary(table=None):
    """Per (format, block, sparsity, finetuned), in the table's order: {"name", "bytes", "n", "mean",
    "sd" (the loss over the seeds), "vs_fp32": the paired difference to the trained fp32 model of the
    same seed ({"mean", "sd", "t" = |mean| / (sd/√n), "signal": t beyond Student's two-sided 5 %
    point}), and for the fine-tuned rows "vs_dense": the same against the dense model fine-tuned alike
    (the same seed, the same steps: what the format itself costs after fine-tuning)}."""
    table = table or compression_table()
    groups = {}
    for r in table["rows"]:
        key = (r["format"], r["block"], r["sparsity"], r["finetuned"])
        groups.setdefault(key, {})[r["seed"]] = r
    fp32 = groups[("fp32", None, None, False)]
    dense = groups.get(("fp32", None, None, True), {})
    out = {}
    for key, runs in groups.items():
        seeds = sorted(runs)
        loss = [runs[s]["val_loss"] for s in seeds]
        s = {"name": compression_name(key), "bytes": runs[seeds[0]]["bytes"], "n": len(seeds),
             "mean": float(np.mean(loss)), "sd": float(np.std(loss, ddof=1)) if len(loss) > 1 else 0.0}
        if key != ("fp32", None, None, False):
            s["vs_fp32"] = _paired([runs[k]["val_loss"] - fp32[k]["val_loss"] for k in seeds])
        if key[3] and key != ("fp32", None, None, True):
            s["vs_dense"] = _paired([runs[k]["val_loss"] - dense[k]["val_loss"] for k in seeds])
        out[key] = s
    return out


def compression_markdown(path=COMPRESSION_TABLE):
    """The summary as the markdown table docs/compression.md shows."""
    table = compression_table(path)
    summary = compression_summary(table)
    n = max(s["n"] for s in summary.values())
    crit = T_CRIT_5PCT.get(n, 2.0)

    def diff(d):
        if not d:
            return "—", "—"
        return f"{d['mean']:+.4f} ± {d['sd']:.4f}", f"{d['t']:.1f}" + (" **signal**" if d["signal"] else "")

    lines = [f"{n} seeds; loss: mean ± sd over the seeds; differences paired by seed, mean ± sd; "
             f"t = |mean| / (sd/√n), signal beyond Student's t at 5 % ({crit}, {n - 1} degrees of freedom)",
             "",
             "| format | bytes | val loss | vs fp32 | t | vs fp32 fine-tuned alike | t |",
             "|---|---|---|---|---|---|---|"]
    for key, s in summary.items():
        a, ta = diff(s.get("vs_fp32"))
        b, tb = diff(s.get("vs_dense"))
        lines.append(f"| {s['name']} | {s['bytes']:,} | {s['mean']:.4f} ± {s['sd']:.4f} | {a} | {ta} | {b} | {tb} |")
    return "\n".join(lines)


def compression_bytes(shape=SMALL_SHAPE, fmt="fp32", block=64, kept=None):
    """The bytes of each format, from the formulas of docs/compression.md (the tools report the same):
    fp32 4Ψ; int8 (every unit) and int4 (the embeddings unit kept in fp32) ⌈n·bits/8⌉ + 4⌈n/B⌉ per unit
    of n parameters; the pruned file 48 + ⌈Ψ/8⌉ + 4K + 4 for K kept weights."""
    V, T, C, L = shape["vocab"], shape["ctx"], shape["dim"], shape["layers"]
    embeddings, block_unit, final_ln = V * C + T * C, 12 * C * C + 13 * C, 2 * C
    units = [embeddings] + [block_unit] * L + [final_ln]
    psi = sum(units)
    if fmt == "fp32":
        return 4 * psi
    if fmt == "int8":
        return sum(n + 4 * -(-n // block) for n in units)
    if fmt == "int4":
        return 4 * embeddings + sum(-(-n // 2) + 4 * -(-n // block) for n in units[1:])
    if fmt == "pruned":
        return 48 + -(-psi // 8) + 4 * kept + 4
    raise ValueError(fmt)


COMPRESSION_COLOR = {"fp32": "#444444", "int8": "#1f77b4", "int4": "#2ca02c", "pruned": "#d62728"}


def fig_compression(table=None):
    """Left: the validation loss minus the trained fp32 model's (paired by seed, mean ± sd over the
    seeds) against the sparsity of per-matrix magnitude pruning, before and after fine-tuning with
    --prune-mask (at sparsity 0: the dense model, and the dense model fine-tuned alike). Right: every
    format's mean loss against its bytes; hollow markers where the difference to fp32 is not signal."""
    table = table or compression_table()
    summary = compression_summary(table)
    fig = Figure(figsize=(13, 5.5), layout="constrained")
    ax, bx = fig.subplots(1, 2)
    ax.axhline(0, color="#444444", lw=1)
    for finetuned, style, color, ref in ((False, "o-", COMPRESSION_COLOR["pruned"], None),
                                         (True, "s--", "#9467bd", ("fp32", None, None, True))):
        keys = sorted((k for k in summary if k[0] == "pruned" and k[3] == finetuned), key=lambda k: k[2])
        xs = [k[2] for k in keys]
        mean = [summary[k]["vs_fp32"]["mean"] for k in keys]
        sd = [summary[k]["vs_fp32"]["sd"] for k in keys]
        if ref in summary:
            xs, mean, sd = [0.0] + xs, [summary[ref]["vs_fp32"]["mean"]] + mean, [summary[ref]["vs_fp32"]["sd"]] + sd
        elif not finetuned:
            xs, mean, sd = [0.0] + xs, [0.0] + mean, [0.0] + sd
        ax.errorbar(xs, mean, yerr=sd, fmt=style, color=color, capsize=4, ms=7,
                    label="pruned, then fine-tuned with --prune-mask" if finetuned else "pruned, no training")
        for x, m in zip(xs, mean):
            ax.annotate(f"{m:+.3f}", (x, m), textcoords="offset points", xytext=(-14, 8), fontsize=7, color=color)
    ax.set_xticks([0, 0.25, 0.5, 0.75, 0.9])
    ax.set_xlabel("sparsity of each block matrix (prune --scope per-matrix; 0: dense)")
    ax.set_ylabel("validation loss minus the trained fp32 model's (same seed), nats")
    ax.set_title("Pruning by magnitude: the loss against the sparsity")
    ax.legend(fontsize=8, loc="upper left")
    ax.grid(True, alpha=0.3)
    for key, s in summary.items():
        color = COMPRESSION_COLOR[key[0]]
        sig = key == ("fp32", None, None, False) or s["vs_fp32"]["signal"]
        bx.plot(s["bytes"] / 1e6, s["mean"], "s" if key[3] else "o", color=color, mfc=color if sig else "white",
                mew=2, ms=8)
        bx.annotate(s["name"], (s["bytes"] / 1e6, s["mean"]), textcoords="offset points", xytext=(7, -3),
                    fontsize=7)
    for fmt, color in COMPRESSION_COLOR.items():
        bx.plot([], [], "o", color=color, label=fmt)
    bx.plot([], [], "s", color="#444444", mfc="white", mew=2, label="square: fine-tuned; hollow: not signal vs fp32")
    bx.set_xlim(0, 5.2)
    bx.set_xlabel("bytes of the weights, MB (generate; the pruned file)")
    bx.set_ylabel("validation loss (nats per byte), mean over the seeds")
    bx.set_title("Every format: loss against bytes")
    bx.legend(fontsize=8, loc="upper right")
    bx.grid(True, alpha=0.3)
    n = max(s["n"] for s in summary.values())
    cmd = next((c for c in table["command"] if c.startswith("train")), "")
    steps = cmd.split("--steps ")[1].split()[0] if "--steps " in cmd else "?"
    fig.suptitle(f"Making `small` smaller: trained {steps} steps, {n} seeds (docs/data/compression.tsv, "
                 "made by scripts/compression_study.sh)", fontsize=10)
    return fig
