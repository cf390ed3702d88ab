"""pipeline.py — notebook 05 (the pipeline): the schedule's diagram and the bubble against K.
A segment is what DeepSpeed and Megatron call a pipeline stage (pipeline/pipeline.h)."""
import numpy as np
from matplotlib.figure import Figure  # figures without pyplot: no global state, any backend
from matplotlib.patches import Patch

from .core import run_pipeline

# ---------------------------------------------------------------------------------------------
# The pipeline (pipeline/train.cpp, docs/pipeline.md)
# ---------------------------------------------------------------------------------------------

OP_COLOR = {"F": "#1f77b4", "B": "#ff7f0e"}


def _pipeline_rows(ax, report, title):
    """One row per segment, its last step as measured: a box per stretch of compute (F blue, B orange,
    the micro-batch written on the op's longest stretch), the waits left blank."""
    ranks = report["pipeline"]["ranks"]
    P = report["pipeline"]["segments"]
    longest = {}
    for r, rank in enumerate(ranks[:P]):  # replica 0: ranks 0..P-1 are its segments when D = 1
        for op, k, kind, t0, t1 in rank["events"]:
            if kind != "compute":
                continue
            ax.broken_barh([(t0, t1 - t0)], (r - 0.4, 0.8), facecolors=OP_COLOR[op], edgecolor="white", lw=0.3)
            if t1 - t0 > longest.get((r, op, k), (0, 0, 0))[0]:
                longest[(r, op, k)] = (t1 - t0, t0, t1)
    for (r, op, k), (_, t0, t1) in longest.items():
        ax.text((t0 + t1) / 2, r, str(k), ha="center", va="center", fontsize=7, color="white")
    ax.set_yticks(range(P))
    ax.set_yticklabels([f"segment {s}" for s in range(P)])
    ax.invert_yaxis()
    ax.set_xlabel("ms (the last step)")
    idle = [x["idle"] for x in ranks[:P]]
    ax.set_title(f"{title}: idle {min(idle):.2f}..{max(idle):.2f} per segment, (P-1)/(K+P-1) = "
                 f"{report['pipeline']['bubble_formula']:.2f}")


def fig_pipeline_diagram(segments=4, accum=8, **kw):
    """The classic pipeline diagram, GPipe above 1F1B, from real runs' events (K micro-batches, P segments)."""
    fig = Figure(figsize=(11, 5.5), layout="constrained")
    axes = fig.subplots(2, 1)
    for ax, schedule in zip(axes, ("gpipe", "1f1b")):
        _pipeline_rows(ax, run_pipeline(segments, accum, schedule, **kw), f"{schedule}, P = {segments}, K = {accum}")
    fig.legend(handles=[Patch(color=OP_COLOR["F"], label="forward"), Patch(color=OP_COLOR["B"], label="backward")],
               loc="outside lower center", ncols=2)
    return fig


def bubble_by_accum(segments=4, accums=(1, 2, 4, 8, 16), schedule="1f1b", **kw):
    """{K: (formula, mean idle over the segments, the least idle segment's)} measured on real runs."""
    out = {}
    for k in accums:
        pp = run_pipeline(segments, k, schedule, **kw)["pipeline"]
        idle = [x["idle"] for x in pp["ranks"]]
        out[k] = (pp["bubble_formula"], sum(idle) / len(idle), min(idle))
    return out


def fig_bubble_vs_accum(segments=4, accums=(1, 2, 4, 8, 16), **kw):
    """The bubble against K: the measured idle fraction beside (P-1)/(K+P-1)."""
    data = bubble_by_accum(segments, accums, **kw)
    fig = Figure(figsize=(7, 4.5), layout="constrained")
    ax = fig.subplots()
    ks = np.arange(1, max(accums) + 1)
    ax.plot(ks, (segments - 1) / (ks + segments - 1), color="#444444", label=f"(P-1)/(K+P-1), P = {segments}")
    ax.plot(list(data), [v[1] for v in data.values()], "o", color="#1f77b4", label="measured: mean over the segments")
    ax.plot(list(data), [v[2] for v in data.values()], "s", color="#ff7f0e", label="measured: the busiest segment")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("K, micro-batches per step")
    ax.set_ylabel("idle fraction")
    ax.set_ylim(0, 1)
    ax.legend()
    ax.set_title("the bubble against K (1F1B); on a shared CPU the segments are not equal")
    return fig
