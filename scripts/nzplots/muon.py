"""muon.py — notebook 11 (Muon under ZeRO): which hidden matrices the slices cut at N ranks, the three
designs' extra elements and Newton–Schulz compute per rank against N, and the optimizer state Muon saves
beside AdamW. The numbers are `zero_estimate --optimizer muon`'s (common/muon_formulas.cpp, which the
trainers' ledgers and comm ledgers match: tests/muon), read from its text."""
import re
import subprocess

from matplotlib.figure import Figure

from .core import bin_dir

DESIGNS = ["owners", "gather-all", "whole-matrices"]
DESIGN_COLOR = {"owners": "#1f77b4", "gather-all": "#d62728", "whole-matrices": "#2ca02c"}


def _range(text):
    """'12..34' or '12' -> (lo, hi) as numbers."""
    lo, _, hi = text.partition("..")
    return float(lo), float(hi or lo)


def muon_estimate(worlds=(2, 4, 8, 16, 32, 64), preset="small", precision="fp32"):
    """`zero_estimate --optimizer muon` for each N: {N: {"matrices", "muon_params", "params", "cut": [(name,
    rows, cols, first rank, last rank, [boundaries in the matrix])], "stages": {stage: {"adam_m",
    "adam_v_adamw", "adam_v_muon": (lo, hi)}}, "designs": {design: {"p2p": (lo, hi), "gather",
    "ns_gflop": (lo, hi), "work"}}, "ddp_ns_gflop"}}; lo..hi over the ranks."""
    cmd = [str(bin_dir() / "zero_estimate"), "--preset", preset, "--precision", precision, "--optimizer", "muon",
           "--world", ",".join(str(n) for n in worlds)]
    text = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    out, cur = {}, None
    for line in text.splitlines():
        m = re.match(r"muon: (\d+) hidden matrices, (\d+) of the (\d+) parameters; at N = (\d+) the slices cut", line)
        if m:
            cur = {"matrices": int(m[1]), "muon_params": int(m[2]), "params": int(m[3]), "cut": [], "stages": {},
                   "designs": {}}
            out[int(m[4])] = cur
            continue
        if cur is None:
            continue
        m = re.match(r"\s+(\S+)\s+(\d+) x (\d+)\s+ranks (\d+)\.\.(\d+) \(boundary at element ([\d, ]+) of \d+\)", line)
        if m:
            cur["cut"].append((m[1], int(m[2]), int(m[3]), int(m[4]), int(m[5]),
                               [int(b) for b in m[6].split(",")]))
            continue
        m = re.match(r"\s+(stage0_ddp|stage1|stage2|stage3)\s+(\d+)\s+(\d+)\s+(\S+)$", line)
        if m:
            cur["stages"][m[1]] = {"adam_m": int(m[2]), "adam_v_adamw": int(m[3]), "adam_v_muon": _range(m[4])}
            continue
        m = re.match(r"\s+--muon-shard (\S+)\s+(\S+)\s+(\d+)\s+(\S+)\s+(\d+)$", line)
        if m:
            cur["designs"][m[1]] = {"p2p": _range(m[2]), "gather": int(m[3]), "ns_gflop": _range(m[4]),
                                    "work": int(m[5])}
            continue
        m = re.search(r"stage0_ddp: no messages, NS ([\d.]+) GFLOP", line)
        if m:
            cur["ddp_ns_gflop"] = float(m[1])
    missing = [n for n in worlds if n not in out or len(out[n]["designs"]) != 3 or len(out[n]["stages"]) != 4]
    if missing:
        raise RuntimeError(f"zero_estimate --optimizer muon: could not read N = {missing} from:\n{text[:2000]}")
    return out


def fig_muon_designs(est):
    """Per rank per step against N, each design: left, the elements the busiest rank sends beyond the
    stage's own collectives (point to point, or gather-all's all-gathers); right, the Newton–Schulz
    GFLOP of the busiest and the least busy rank, beside stage0_ddp's (every matrix on every rank)."""
    ns = sorted(est)
    fig = Figure(figsize=(14, 5), layout="constrained")
    ax, bx = fig.subplots(1, 2)
    for d in DESIGNS:
        sent = [max(est[n]["designs"][d]["p2p"][1], est[n]["designs"][d]["gather"]) / 1e3 for n in ns]
        ax.plot(ns, sent, "o-", color=DESIGN_COLOR[d], label=d)
        hi = [est[n]["designs"][d]["ns_gflop"][1] for n in ns]
        lo = [est[n]["designs"][d]["ns_gflop"][0] for n in ns]
        bx.plot(ns, hi, "o-", color=DESIGN_COLOR[d], label=f"{d}: busiest rank")
        bx.plot(ns, lo, "o--", color=DESIGN_COLOR[d], alpha=0.6, label=f"{d}: least busy rank")
    bx.axhline(est[ns[0]]["ddp_ns_gflop"], color="#444444", lw=1, label="stage0_ddp (every matrix, every rank)")
    for a in (ax, bx):
        a.set_xscale("log", base=2)
        a.set_xticks(ns, [str(n) for n in ns])
        a.set_xlabel("ranks N")
        a.grid(True, alpha=0.3)
    ax.set_ylabel("thousand fp32 elements per step (busiest rank)")
    ax.set_title("Muon's own messages, beyond the stage's collectives")
    bx.set_ylabel("Newton–Schulz GFLOP per step per rank")
    bx.set_title("Newton–Schulz compute: repeated by every owner, or once per matrix")
    ax.legend()
    bx.legend(fontsize=8, ncols=2)
    return fig


def fig_muon_memory(est, stage="stage1"):
    """Optimizer state per rank (adam_m + adam_v bytes) with AdamW and with Muon (its busiest rank)
    against N, at `stage`, and how many of the hidden matrices the slices cut."""
    ns = sorted(est)
    fig = Figure(figsize=(14, 5), layout="constrained")
    ax, bx = fig.subplots(1, 2)
    adamw = [(est[n]["stages"][stage]["adam_m"] + est[n]["stages"][stage]["adam_v_adamw"]) / 1e6 for n in ns]
    muon = [(est[n]["stages"][stage]["adam_m"] + est[n]["stages"][stage]["adam_v_muon"][1]) / 1e6 for n in ns]
    ax.plot(ns, adamw, "o-", color="#444444", label="AdamW: m and v, 8 bytes per owned element")
    ax.plot(ns, muon, "o-", color="#d62728", label="Muon: momentum 4 bytes, AdamW's v for the rest (busiest rank)")
    ax.set_yscale("log")
    ax.set_ylabel("optimizer state per rank (MB = 10⁶ bytes)")
    ax.set_title(f"{stage}: optimizer state per rank")
    cut = [len(est[n]["cut"]) for n in ns]
    bx.bar([str(n) for n in ns], cut, color="#1f77b4")
    bx.axhline(est[ns[0]]["matrices"], color="#444444", lw=1, ls="--", label="all hidden matrices")
    bx.set_xlabel("ranks N")
    bx.set_ylabel("matrices the slices cut")
    bx.set_title("How many matrices a slice boundary crosses")
    bx.legend()
    ax.set_xscale("log", base=2)
    ax.set_xticks(ns, [str(n) for n in ns])
    ax.set_xlabel("ranks N")
    for a in (ax, bx):
        a.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    return fig
