"""timeline_comm.py — notebooks 02 and 03 (the timeline, communication): memory through the
first steps from the ledger's timeline, and the elements each stage sends, against accumulation too."""
import numpy as np
from matplotlib.figure import Figure  # figures without pyplot: no global state, any backend

from .core import (CAT_COLOR, MEASURED, MODEL_STATE, STAGES, STAGE_COLOR, STAGE_LABEL, built_stages,
    estimate, run)

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
    columns = [("setup", -1)] + [(ph, st) for st in range(steps) for ph in ("forward", "backward", "optimizer")]
    for evs in timelines.values():
        for e in evs:
            if (e["phase"], e["step"]) not in columns:
                columns.append((e["phase"], e["step"]))
    # A column's width: its most events in any stage (at least 2), so the panels share one x-axis.
    width = {col: max(2, max(sum(1 for e in evs if (e["phase"], e["step"]) == col) for evs in timelines.values()))
             for col in columns}
    start, x = {}, 0.0
    for col in columns:
        start[col] = x
        x += width[col] + 1
    x_end = x

    fig = Figure(figsize=(13, 2.5 * len(stages) + 1.0), layout="constrained")
    # each panel on its own scale, so that stage3's saw-tooth shows (fig_categories compares sizes)
    axes = fig.subplots(len(stages), 1, squeeze=False, sharex=True)[:, 0]
    for ax, s in zip(axes, stages):
        for col in columns:
            ax.axvspan(start[col], start[col] + width[col] + 1, color=PHASE_COLOR.get(col[0], "#f4f4f4"), zorder=0)
        cur = {c: 0 for c in order}
        host = 0
        xs, ys, hs = [0.0], [[0] for _ in order], [0]
        seen = {col: 0 for col in columns}
        labels = []
        for e in timelines[s]:
            col = (e["phase"], e["step"])
            seen[col] += 1
            xe = start[col] + seen[col]
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
    axes[-1].set_xticks([start[col] + (width[col] + 1) / 2 for col in columns],
                        [names.get(ph, ph) + (f"\nstep {st + 1}" if st >= 0 else "") for ph, st in columns],
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
