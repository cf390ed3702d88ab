"""inference.py — notebook 04 (inference): build/bin/generate, its --bench table and statistics."""
import hashlib
import json
import os
import subprocess

import numpy as np
from matplotlib.figure import Figure  # figures without pyplot: no global state, any backend
from matplotlib.ticker import FuncFormatter

from .core import REPO, bin_dir, runs_dir

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
