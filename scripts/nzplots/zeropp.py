"""zeropp.py — notebook 06 (ZeRO++): bytes inside and across nodes, a time model, and the loss
against the quantization block."""
import json
import subprocess

import numpy as np
from matplotlib.figure import Figure  # figures without pyplot: no global state, any backend
from matplotlib.ticker import FuncFormatter

from .core import REPO, STAGE_COLOR, T_CRIT_5PCT, bin_dir, read_study_table

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


def zeropp_loss_table(path=ZEROPP_LOSS_TABLE):
    """The block study's runs: {"command": the lines that made it, "runs": [{technique, bits, block,
    seed, val_loss}]}."""
    command, rows = read_study_table(path)
    runs = []
    for d in rows:
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
