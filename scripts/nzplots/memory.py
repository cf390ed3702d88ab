"""memory.py — notebook 01 (memory): per-rank memory by category, activation checkpointing, the
largest model that fits, and model-state memory against the number of ranks."""
from matplotlib.figure import Figure  # figures without pyplot: no global state, any backend
from matplotlib.patches import Patch
from matplotlib.ticker import FuncFormatter

from .core import (CATEGORIES, CAT_COLOR, MEASURED, MODEL_STATE, STAGES, STAGE_COLOR, STAGE_LABEL, bin_dir,
    built_stages, estimate, formula_for, measured, measured_at, paper_cells, run, run_pipeline, runs_dir)

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
    """The per-rank ledger of every trainer (the ladder, pipeline with P = world segments and
    pipeline_accum micro-batches, infinity in host memory and on disk) on the measured small runs at N = world, as a markdown
    table: one row per category and location that any rung uses, peak bytes of rank 0, and of the
    last rank where it differs (pipeline: the first and last segment). docs/infinity.md shows it."""
    rungs = [s for s in STAGES + ["pipeline", "infinity"] if (bin_dir() / s).is_file()]
    reps = {s: run_pipeline(segments=world, accum=pipeline_accum, steps=MEASURED["steps"]) if s == "pipeline"
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
