"""tensor.py — notebook 09 (tensor parallelism): the elements a rank sends per step against ZeRO-3's,
the time they take on a node's links and across nodes, and where sequence parallelism's memory goes.

Every number is zero_estimate's (--tensor T [--sequence-parallel] --json, and --stage stage3 --json,
both from the formulas the trainers' ledgers are held to) or a real run's ledger; only the link
speeds below are assumptions, and the figures say so."""
import json
import subprocess

import numpy as np
from matplotlib.figure import Figure  # figures without pyplot: no global state, any backend

from .core import bin_dir, estimate, measured, run

__all__ = ["NVLINK", "IB", "tensor_estimate", "zero3_elements", "tensor_elements", "crossover_tokens",
           "fig_tensor_vs_zero3", "link_times", "fig_link_times", "run_tensor", "activations_by_t",
           "fig_sp_activations"]

# ---------------------------------------------------------------------------------------------
# The assumptions: one direction of one GPU's links, in bytes per second
# ---------------------------------------------------------------------------------------------
NVLINK = 300e9  # inside a node: NVLink 3 on an A100 SXM board (600 GB/s both ways together)
IB = 25e9       # across nodes: one 200 Gb/s HDR InfiniBand adapter per GPU
# A collective's time is taken as the bytes one rank sends over its slowest link (the bandwidth term
# of the ring algorithms, no latency): a ring over 8 GPUs of a node runs at NVLink's speed, one that
# leaves the node at the adapter's.

# The model of the comparison: GPT-2 medium's blocks (24 of width 1024, 16 heads; nanoZeRO's byte
# vocabulary and 1024 positions), in bf16; sequences of 1024 tokens.
SHAPE = ("--preset", "gpt2", "--layers", "24", "--dim", "1024", "--heads", "16")
SEQ = 1024
PRECISION = "bf16"
ELEM = 2  # bytes of a bf16 element on the wire


def tensor_estimate(T, world, batch=1, seq=SEQ, sp=False, precision=PRECISION, shape=SHAPE):
    """zero_estimate --tensor T --json on `world` ranks (D = world / T replicas), a micro-batch of
    batch x seq tokens per tensor group: the one record of its table (bytes by category, elements)."""
    cmd = [str(bin_dir() / "zero_estimate"), "--json", "--tensor", str(T), "--world", str(world),
           "--batch", str(batch), "--seq", str(seq), "--precision", precision, *shape]
    cmd += ["--sequence-parallel"] if sp else []
    return json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)["estimates"][0]


def zero3_elements(world, shape=SHAPE):
    """Elements one stage3 rank sends per step (accumulation 1): two all-gathers and a reduce-scatter
    of the model, whatever the batch."""
    est = estimate(worlds=[world], stage="stage3", precision=PRECISION, seq=SEQ, batch=1,
                   extra=shape[2:], preset=shape[1])
    return est["estimates"][0]["comm_elems_per_step"], est["num_params"]


def tensor_elements(T, tokens, world=None):
    """Elements one rank of a T-way tensor group sends per step when the group runs `tokens` tokens
    (whole sequences of SEQ), split into (over the tensor ranks, over the replicas): the replicas' part
    is the D-replica run's elements less the one-replica run's."""
    world = world or T
    batch = max(1, tokens // SEQ)
    one = tensor_estimate(T, T, batch)["comm_elems_per_step"]
    both = tensor_estimate(T, world, batch)["comm_elems_per_step"] if world != T else one
    return one, both - one


def crossover_tokens(T=8):
    """Tokens per step (of the T ranks together) at which a T-way tensor group sends as many elements
    per rank as stage3 on the same T ranks: TP's elements grow with the tokens, ZeRO-3's do not."""
    z3, _ = zero3_elements(T)
    a, _ = tensor_elements(T, SEQ)
    b, _ = tensor_elements(T, 2 * SEQ)
    per_token = (b - a) / SEQ  # TP's elements are affine in the tokens (the loss's rows add a little)
    return (z3 - (a - per_token * SEQ)) / per_token


def fig_tensor_vs_zero3(T=8, tokens=(1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072)):
    """Bytes per rank per step on T ranks of one node: a T-way tensor group against stage3, against the
    tokens the T ranks process together per step."""
    z3, psi = zero3_elements(T)
    tp = [tensor_elements(T, n)[0] for n in tokens]
    x = crossover_tokens(T)
    fig = Figure(figsize=(7.5, 4.5), layout="constrained")
    ax = fig.subplots()
    ax.plot(tokens, [e * ELEM / 1e9 for e in tp], "o-", color="#1f77b4", label=f"tensor parallel, T = {T}")
    ax.axhline(z3 * ELEM / 1e9, color="#d62728", label=f"stage3 on {T} ranks: 3Ψ(N-1)/N, any batch")
    ax.axvline(x, color="#444444", ls=":", label=f"equal at {x:,.0f} tokens per step")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel(f"tokens per step of the {T} ranks together (sequences of {SEQ})")
    ax.set_ylabel("GB sent per rank per step (bf16)")
    ax.set_title(f"24 x 1024 blocks, Ψ = {psi / 1e6:.0f} M: TP sends activations, ZeRO-3 the model")
    ax.legend()
    return fig


def link_times(tokens, nodes=2, per_node=8):
    """Seconds per step spent sending, for `tokens` tokens per step on nodes x per_node GPUs, three
    ways: stage3 over every GPU (across the nodes), T = per_node inside each node x one replica per
    node (the replicas' all-reduce across the nodes), T = every GPU (a tensor group across the nodes)."""
    N = nodes * per_node
    z3, _ = zero3_elements(N)
    inside, replicas = tensor_elements(per_node, tokens // nodes, world=N)
    across, _ = tensor_elements(N, tokens)
    return {"stage3 across the nodes": z3 * ELEM / IB,
            f"T = {per_node} in each node, {nodes} replicas": inside * ELEM / NVLINK + replicas * ELEM / IB,
            f"T = {N} across the nodes": across * ELEM / IB}


def fig_link_times(nodes=2, per_node=8, tokens=(16384, 32768, 65536, 131072, 262144, 524288)):
    """Communication time per step on two nodes of 8 GPUs at the assumed link speeds."""
    data = [link_times(n, nodes, per_node) for n in tokens]
    fig = Figure(figsize=(7.5, 4.5), layout="constrained")
    ax = fig.subplots()
    for (name, color) in zip(data[0], ("#d62728", "#1f77b4", "#9467bd")):
        ax.plot(tokens, [d[name] * 1e3 for d in data], "o-", color=color, label=name)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("tokens per step, all GPUs together")
    ax.set_ylabel("ms per step on the wire")
    ax.set_title(f"{nodes} nodes x {per_node} GPUs; assumed NVLink {NVLINK / 1e9:.0f} GB/s, "
                 f"InfiniBand {IB / 1e9:.0f} GB/s per GPU")
    ax.legend()
    return fig


# ---------------------------------------------------------------------------------------------
# Sequence parallelism's memory: real runs' ledgers beside the formula
# ---------------------------------------------------------------------------------------------

def run_tensor(T, sp=False, **kw):
    """build/bin/tensor on T ranks (one replica), the measured preset (small, b 2 x s 32, bf16)."""
    extra = ("--tensor", str(T)) + (("--sequence-parallel",) if sp else ())
    return run("tensor", T, extra=extra, **kw)


def activations_by_t(Ts=(1, 2, 4)):
    """{(T, sp): (measured activation bytes of rank 0, zero_estimate's)} on the measured preset."""
    out = {}
    for T in Ts:
        for sp in ((False, True) if T > 1 else (False,)):
            rep = run_tensor(T, sp)
            est = tensor_estimate(T, T, rep["batch"], rep["seq"], sp, rep["precision"], ("--preset", rep["preset"]))
            out[(T, sp)] = (measured(rep)["activations"], est["bytes"]["activations"])
    return out


def fig_sp_activations(Ts=(1, 2, 4)):
    """Activation bytes per rank against T, with and without sequence parallelism: the ledger's
    points on zero_estimate's bars."""
    data = activations_by_t(Ts)
    fig = Figure(figsize=(7, 4.2), layout="constrained")
    ax = fig.subplots()
    x = np.arange(len(Ts))
    for k, (sp, color, name) in enumerate(((False, "#bcbd22", "without SP"), (True, "#1f77b4", "with SP"))):
        at = [(i, data[(T, sp)]) for i, T in enumerate(Ts) if (T, sp) in data]  # (T = 1: no SP)
        pos = [x[i] + (0 if T_one else (k - 0.5) * 0.38) for (i, _), T_one in zip(at, [Ts[i] == 1 for i, _ in at])]
        ax.bar(pos, [v[1] / 1e3 for _, v in at], 0.36, color=color, label=f"formula, {name}")
        ax.plot(pos, [v[0] / 1e3 for _, v in at], "k_", ms=18, mew=2)
    ax.plot([], [], "k_", ms=12, mew=2, label="the ledger (rank 0)")
    ax.set_xticks(x)
    ax.set_xticklabels([f"T = {T}" for T in Ts])
    ax.set_ylabel("activation KB per rank")
    ax.set_title("small, bf16, b 2 x s 32: without SP the (b, s, C) terms stay whole")
    ax.legend()
    return fig
