"""nzplots — nanoZeRO's memory and communication figures, shared by scripts/plots.py and notebooks/.

Nothing here re-implements a formula: the formula lines come from `zero_estimate --json` (which
calls common/zero_formulas.h), the measured points from the trainers' JSON reports (--log-json:
the memory ledger of every rank, its timeline, and the elements each step sent).

    import nzplots as nz
    reports = nz.run_stages(worlds=[1, 2, 3, 4])   # {(stage, N): report}, tiny runs
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
STAGES = ["stage0_ddp", "stage1", "stage2", "stage3", "offload"]
# What each stage shards, as the paper names it.
STAGE_LABEL = {"stage0_ddp": "stage0 (DDP)", "stage1": "stage1 (P_os)", "stage2": "stage2 (P_os+g)",
               "stage3": "stage3 (P_os+g+p)", "offload": "offload (stage2 + host)"}
STAGE_COLOR = {"stage0_ddp": "#444444", "stage1": "#1f77b4", "stage2": "#2ca02c", "stage3": "#d62728",
               "offload": "#9467bd"}
# Ledger categories, bottom to top in the stacked figures.
CATEGORIES = ["params", "grads", "master", "adam_m", "adam_v", "comm_buffers", "gathered", "activations"]
MODEL_STATE = CATEGORIES[:-1]  # everything but the activations
CAT_COLOR = {"params": "#1f77b4", "grads": "#ff7f0e", "master": "#2ca02c", "adam_m": "#d62728",
             "adam_v": "#9467bd", "comm_buffers": "#8c564b", "gathered": "#e377c2", "activations": "#bcbd22"}
# The measured runs: the tiny preset, a couple of steps, bf16 mixed precision like the paper.
TINY = dict(preset="tiny", seq=32, batch=2, steps=2, precision="bf16")

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


def estimate(worlds=(1,), stage="all", precision="bf16", preset=None, params=None, batch=None, seq=None, accum=1):
    """zero_estimate --json: per-rank bytes by category for every (world, stage), exact, and the
    elements each rank sends per optimizer step of `accum` micro-steps."""
    cmd = [str(bin_dir() / "zero_estimate"), "--json", "--stage", stage, "--precision", precision,
           "--world", ",".join(str(n) for n in worlds), "--accum", str(accum)]
    cmd += ["--params", str(params)] if params is not None else ["--preset", preset or "small"]
    if batch is not None:
        cmd += ["--batch", str(batch)]
    if seq is not None:
        cmd += ["--seq", str(seq)]
    return json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)


def paper_table():
    """The text of `zero_estimate --paper-table` (the ZeRO paper's Table 1)."""
    cmd = [str(bin_dir() / "zero_estimate"), "--paper-table"]
    return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout


def run(stage, world, preset="tiny", seq=32, batch=2, steps=2, precision="bf16", device="cpu", extra=()):
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

def fig_categories(reports, world=4):
    """Stacked bars per stage at N = world: the ledger's peak bytes (rank 0) beside zero_estimate's.
    Hatched: bytes on the host (offload)."""
    stages = [s for s in STAGES if (s, world) in reports]
    fig = Figure(figsize=(12, 5.5), layout="constrained")
    ax = fig.add_subplot()
    width = 0.38
    for i, s in enumerate(stages):
        rep = reports[(s, world)]
        f = formula_for(rep)
        host_meas = measured_at(rep, "host")
        for j, (label, vals) in enumerate((("measured", measured(rep)), ("formula", f["bytes"]))):
            x = i + (j - 0.5) * width
            bottom = 0
            for c in CATEGORIES:
                v = _kb(vals[c])
                on_host = (host_meas[c] > 0) if label == "measured" else f["location"][c] == "host"
                ax.bar(x, v, width * 0.95, bottom=bottom, color=CAT_COLOR[c], edgecolor="white",
                       hatch="//" if on_host else None, label=c if (i == 0 and j == 0) else None)
                bottom += v
            ax.text(x, bottom, f"{label}\n{bottom:.0f} kB", ha="center", va="bottom", fontsize=8)
    rep0 = reports[(stages[0], world)]
    ax.set_xticks(range(len(stages)), [STAGE_LABEL[s] for s in stages])
    ax.set_ylabel("peak bytes per rank (kB = 1000 bytes)")
    ax.set_title(f"Per-rank memory by category, N = {world} ranks: ledger of rank 0 (left bar) vs formula (right bar)\n"
                 f"{rep0['preset']} preset, Ψ = {rep0['num_params']:,} parameters, {rep0['precision']}, "
                 f"micro-batch {rep0['batch']} × {rep0['seq']} tokens")
    ax.set_ylim(0, ax.get_ylim()[1] * 1.1)
    handles, labels = ax.get_legend_handles_labels()
    handles.append(Patch(facecolor="white", edgecolor="gray", hatch="//"))
    labels.append("on the host")
    ax.legend(handles, labels, loc="upper right", ncols=3)
    return fig


# ---------------------------------------------------------------------------------------------
# Figure 2: model-state memory per rank against the number of ranks
# ---------------------------------------------------------------------------------------------

def fig_scaling(reports, params="7.5B", capacity_gb=80, max_world=1024):
    """Left: the formula for a big model (raw Ψ, bf16 mixed), N = 1..max_world, with a device
    capacity line. Right: the tiny runs, measured (markers) on their own formula (lines), as bytes per
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
    ax.axhline(capacity_gb, color="black", ls=":", lw=1.5)
    ax.text(worlds[-1], capacity_gb * 0.92, f"device capacity {capacity_gb:g} GB", ha="right", va="top")
    ax.set_xscale("log", base=2)
    ax.set_xticks(worlds, [str(n) for n in worlds])
    ax.set_yscale("log")
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.set_xlabel("number of ranks N (data-parallel devices)")
    ax.set_ylabel("model-state memory per rank (GB = 1e9 bytes)")
    ax.set_title(f"Formula (zero_estimate --json): Ψ = {params} parameters, bf16 mixed\n"
                 "params + grads + fp32 master + Adam m, v: (2 + 2 + 12)Ψ at N = 1")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(loc="lower left")

    # right: measured tiny runs as bytes per parameter
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

def fig_timeline(reports, world=4):
    """One panel per stage: model-state bytes on rank 0's device after every allocation or free,
    stacked by category (set-up, then steps 1-2, shaded). Offload's host bytes as a dashed line.
    The activations are left out: one block allocated at set-up, the same in every stage."""
    stages = [s for s in STAGES if (s, world) in reports]
    order = MODEL_STATE
    fig = Figure(figsize=(12, 2.6 * len(stages) + 0.6), layout="constrained")
    axes = fig.subplots(len(stages), 1, squeeze=False, sharey=True)[:, 0]  # one scale: sizes compare
    top = 0
    for ax, s in zip(axes, stages):
        events = [e for e in reports[(s, world)]["ranks"][0]["ledger"]["timeline"] if e["category"] in order]
        cur = {c: 0 for c in order}
        host, xs, ys, hs, steps = 0, [0], [[0] for _ in order], [0], []
        for i, e in enumerate(events, start=1):
            if e["location"] == "device" and e["category"] in cur:
                cur[e["category"]] += e["delta"]
            elif e["location"] != "device":
                host += e["delta"]
            xs.append(i)
            for k, c in enumerate(order):
                ys[k].append(cur[c] / 1e3)
            hs.append(host / 1e3)
            steps.append(e["step"])
        n_setup = sum(1 for st in steps if st < 0)
        quiet = n_setup == len(steps)  # nothing allocated during the steps: show them as a flat stretch
        if quiet:
            for _ in range(max(4, len(xs) // 3)):
                xs.append(xs[-1] + 1)
                for y in ys:
                    y.append(y[-1])
                hs.append(hs[-1])
        ax.axvspan(n_setup, xs[-1], color="gray", alpha=0.15, zorder=0)
        ax.stackplot(xs, ys, step="post", colors=[CAT_COLOR[c] for c in order], zorder=1,
                     labels=order if ax is axes[0] else ())
        if any(hs):
            ax.step(xs, hs, where="post", color="black", ls="--", lw=1.5, zorder=2, label="host (all categories)")
        top = max(top, max(sum(y[i] for y in ys) for i in range(len(xs))), max(hs))
        at_top = ax.get_xaxis_transform()  # x in data, y as a fraction of the panel
        if quiet:
            ax.text((n_setup + xs[-1]) / 2, 0.93, "steps 1–2: no allocations, no frees", ha="center", va="top",
                    fontsize=9, transform=at_top)
        else:  # label each step's stretch
            for st in sorted({x for x in steps if x >= 0}):
                idx = [i + 1 for i, x in enumerate(steps) if x == st]
                ax.text((idx[0] + idx[-1]) / 2, 0.93, f"step {st + 1}", ha="center", va="top", fontsize=9,
                        transform=at_top)
        ax.set_xlim(0, xs[-1])
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_ylabel("kB")
        ax.set_title(f"{STAGE_LABEL[s]}: {n_setup} model-state events in set-up, {len(events) - n_setup} in "
                     "steps 1–2 (shaded)", loc="left")
        if any(hs):
            ax.legend(loc="upper left", fontsize=8)
    axes[0].set_ylim(0, top * 1.25)
    axes[0].legend(loc="upper left", ncols=4, fontsize=8)
    axes[-1].set_xlabel("model-state allocations and frees of rank 0, in order")
    rep0 = reports[(stages[0], world)]
    acts = rep0["ranks"][0]["ledger"]["device"]["peak"]["activations"]
    fig.suptitle(f"Memory ledger timeline: model-state bytes on the device after each allocation or free\n"
                 f"N = {world} ranks, {rep0['preset']} preset, {rep0['precision']}, kB = 1000 bytes; not drawn: "
                 f"the activations ({acts / 1e3:.0f} kB, allocated once at set-up in every stage)")
    return fig


# ---------------------------------------------------------------------------------------------
# Figure 4: elements communicated per step
# ---------------------------------------------------------------------------------------------

def fig_comm(reports):
    """Elements each rank sent in one optimizer step of one micro-step (accum K = 1; steps_log,
    rank 0), in units of Ψ, against the paper's 2Ψ(N-1)/N (stages 0-2) and 3Ψ(N-1)/N (stage3);
    offload's host link against 2Ψ/N. For K > 1 see fig_comm_vs_accum."""
    worlds = sorted({n for (_, n) in reports})
    fig = Figure(figsize=(13, 5.5), layout="constrained")
    ax = fig.add_subplot()
    n = np.linspace(1, max(worlds), 200)  # the paper's curves, in units of Ψ
    ax.plot(n, 2 * (n - 1) / n, "-", color="gray", lw=2,
            label="2Ψ(N−1)/N  (all-reduce = reduce-scatter + all-gather)")
    ax.plot(n, 3 * (n - 1) / n, "-.", color="gray", lw=2,
            label="3Ψ(N−1)/N  (stage3: gather twice + reduce-scatter)")
    markers = {"stage0_ddp": "o", "stage1": "s", "stage2": "D", "stage3": "^", "offload": "v"}
    offsets = {s: (i - 2) * 0.06 for i, s in enumerate(STAGES)}  # side by side at each N
    for s in STAGES:
        ns = [w for w in worlds if (s, w) in reports]
        if not ns:
            continue
        last = [reports[(s, w)]["steps_log"][-1] for w in ns]  # rank 0's counts in the last step
        psi = reports[(s, ns[0])]["num_params"]
        # the paper's curves are for one micro-step per step; K > 1 is fig_comm_vs_accum's
        assert all(reports[(s, w)]["accum"] == 1 for w in ns), "the comparison is per step with accum K = 1"
        xs = [w + offsets[s] for w in ns]
        ax.plot(xs, [x["comm_elems"] / psi for x in last], markers[s], color=STAGE_COLOR[s], ms=9, mfc="none",
                mew=2, label=f"{STAGE_LABEL[s]} (measured)")
        if s == "offload":
            ax.plot(xs, [(x["to_host_elems"] + x["to_device_elems"]) / psi for x in last], "x",
                    color=STAGE_COLOR[s], ms=9, mew=2, label="offload: host↔device link (measured)")
            ax.plot(n, 2 / n, ":", color=STAGE_COLOR[s], lw=2, label="2Ψ/N  (offload link: grads down, params up)")
    rep0 = next(iter(reports.values()))
    ax.set_xticks(worlds)
    ax.set_xlabel("number of ranks N (markers spread sideways so that none hides another)")
    ax.set_ylabel("elements sent per rank per step / Ψ")
    ax.set_title(f"Communication per optimizer step with accum K = 1 (one micro-step per step), measured by the "
                 f"comm ledger\n{rep0['preset']} preset, Ψ = {rep0['num_params']:,} (units padded to a multiple of N)")
    ax.set_ylim(bottom=-0.05)
    ax.grid(True, alpha=0.3)
    ax.legend(loc="center left", bbox_to_anchor=(1.01, 0.5))
    return fig


# ---------------------------------------------------------------------------------------------
# Figure 5: elements communicated per step against gradient accumulation
# ---------------------------------------------------------------------------------------------

# How each stage's traffic grows with K, as common/zero_formulas.h writes it (labels only: the
# numbers come from zero_estimate).
SENT_FORMULA = {"stage0_ddp": "2(N−1)S", "stage1": "2(N−1)S", "stage2": "(K+1)(N−1)S",
                "stage3": "3K(N−1)S", "offload": "(K+1)(N−1)S"}


def comm_by_accum(world=4, accums=range(1, 9), preset="tiny", precision="bf16"):
    """Elements each rank sends per optimizer step of K micro-steps, from zero_estimate --accum K:
    {"world", "shard" (S), "accums", "sent": {stage: [elements for each K]}}."""
    accums = list(accums)
    sent = {s: [] for s in STAGES}
    for k in accums:
        est = estimate(worlds=[world], preset=preset, precision=precision, accum=k)
        assert est["accum"] == k
        for e in est["estimates"]:
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


def fig_comm_vs_accum(world=4, accums=range(1, 9), measured=None, preset="tiny"):
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

# Names a learner may reasonably use for a stage, beside the binaries' names.
STAGE_ALIAS = {"stage0": "stage0_ddp", "ddp": "stage0_ddp"}


def _same(answer, truth):
    """Numbers compare as numbers (5 == 5.0, within rounding); anything else exactly."""
    number = (int, float, np.integer, np.floating)
    if isinstance(answer, number) and isinstance(truth, number) and not isinstance(answer, bool):
        return abs(answer - truth) <= 1e-9 * max(1, abs(truth))
    return answer == truth


def check_answer(answer, truth, what):
    """Self-check for the exercises: None means 'not answered yet' (the notebook still runs).
    A dict truth ({stage: value}) wants a dict with an answer for every key, and nothing else; a
    dict whose values are all still None counts as not answered."""
    if isinstance(truth, dict) and isinstance(answer, dict) and all(v is None for v in answer.values()):
        answer = None
    if answer is None:
        print(f"{what}: put your answer in the cell above and run it again.")
        return
    if isinstance(truth, dict):
        assert isinstance(answer, dict), f"{what}: expected a dict {{stage: answer}} for {', '.join(truth)}"
        answer = {STAGE_ALIAS.get(k, k): v for k, v in answer.items()}
        missing = [k for k in truth if answer.get(k) is None]
        unknown = [str(k) for k in answer if k not in truth]
        assert not missing, f"{what}: no answer for {', '.join(missing)}; give one for every stage."
        assert not unknown, f"{what}: {', '.join(unknown)} is not one of {', '.join(truth)}."
        wrong = [k for k in truth if not _same(answer[k], truth[k])]
        assert not wrong, (f"{what}: not right for {', '.join(wrong)}; look at the figure again "
                           "(or the hidden answer).")
        print(f"{what}: right for all {len(truth)} ({', '.join(f'{k} {answer[k]}' for k in truth)}).")
        return
    assert _same(answer, truth), f"{what}: {answer} is not right; look at the figure again (or the hidden answer)."
    print(f"{what}: {answer} is right.")
