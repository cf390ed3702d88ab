"""compression.py — notebook 07 (compression): the study's table, its bytes, and its figure."""

import numpy as np
from matplotlib.figure import Figure  # figures without pyplot: no global state, any backend

from .core import REPO, T_CRIT_5PCT, read_study_table

# The compression study (scripts/compression_study.sh): every model's validation loss and the bytes
# of its format, committed as a table so that the figure needs no training.
COMPRESSION_TABLE = REPO / "docs" / "data" / "compression.tsv"
SMALL_SHAPE = {"vocab": 256, "ctx": 128, "layers": 5, "dim": 128}  # the `small` preset (common/layout.cpp)


def compression_table(path=COMPRESSION_TABLE):
    """The study's rows: {"command": the comment lines, "rows": [{format, block, sparsity, finetuned,
    seed, val_loss, bytes, how}]} (block and sparsity None where they do not apply)."""
    command, rows = read_study_table(path)
    out = []
    for d in rows:
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
