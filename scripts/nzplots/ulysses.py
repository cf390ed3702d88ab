"""ulysses.py — notebook 10 (Ulysses and ring attention): activations per rank against the sequence
length, the bytes of the all-to-all against the ring's, and which S a model's heads allow."""
import json
import subprocess

from matplotlib.figure import Figure  # figures without pyplot: no global state, any backend

from .core import STAGE_COLOR, bin_dir, measured, run

# ---------------------------------------------------------------------------------------------
# Ulysses (ulysses/train.cpp, docs/ulysses.md): the sequence split over S ranks, with ZeRO-3
# ---------------------------------------------------------------------------------------------

SP_COLOR = {"stage3": STAGE_COLOR["stage3"], "ulysses": "#1f77b4", "ring": "#2ca02c"}
SP_STYLE = {1: ":", 2: "--", 4: "-", 8: "-."}
# the sequences of docs/ulysses.md's tables: `small` with a context of 2048
SP_SEQS = (128, 256, 512, 1024, 2048)


def sp_estimate(S, seq, world=None, mode="ulysses", preset="small", precision="fp32", batch=1, ctx=2048, extra=()):
    """zero_estimate --sp S [--sp-mode ring] --json: one rank's bytes by category (with the activations
    the run's ledger holds), stage3's activations beside them (ulysses) or Ulysses' (ring), and the
    elements each rank sends per block (all_to_all_elems_per_block; ring: p2p_elems_per_block and
    p2p_elems_forward_per_block)."""
    cmd = [str(bin_dir() / "zero_estimate"), "--json", "--sp", str(S), "--world", str(world or S),
           "--preset", preset, "--precision", precision, "--batch", str(batch), "--seq", str(seq)]
    if ctx:
        cmd += ["--ctx", str(ctx)]
    if mode != "ulysses":
        cmd += ["--sp-mode", mode]
    cmd += [str(x) for x in extra]  # e.g. ("--heads", "16"): a reshaped preset
    return json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)


def sp_activations(seqs=SP_SEQS, sps=(1, 2, 4), **kw):
    """{(design, S, T): activation bytes per rank}: design "stage3" (S = 1 only: no split), "ulysses",
    "ring", from zero_estimate."""
    out = {}
    for T in seqs:
        for S in sps:
            u = sp_estimate(S, T, **kw)
            out[("ulysses", S, T)] = u["bytes"]["activations"]
            out[("stage3", 1, T)] = u["stage3_activations"]
            out[("ring", S, T)] = sp_estimate(S, T, mode="ring", **kw)["bytes"]["activations"]
    return out


def fig_sp_memory(seqs=SP_SEQS, sps=(1, 2, 4), **kw):
    """Activation bytes per rank against T, log-log: stage3 alone, Ulysses and ring at each S."""
    acts = sp_activations(seqs, sps, **kw)
    fig = Figure(figsize=(8, 5), layout="constrained")
    ax = fig.subplots()
    ax.plot(seqs, [acts[("stage3", 1, T)] / 2**20 for T in seqs], color=SP_COLOR["stage3"], lw=2.5,
            label="stage3 alone (every rank all T tokens)")
    for design in ("ulysses", "ring"):
        for S in sps:
            ax.plot(seqs, [acts[(design, S, T)] / 2**20 for T in seqs], SP_STYLE.get(S, "-"), marker="o", ms=3,
                    color=SP_COLOR[design], label=f"{design}, S = {S}")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log", base=2)
    ax.set_xticks(list(seqs), [str(T) for T in seqs])
    ax.set_xlabel("sequence length T (tokens)")
    ax.set_ylabel("activations per rank (MiB)")
    ax.set_title("activations per rank, `small`, micro-batch 1, fp32 (zero_estimate --sp)")
    ax.legend(ncols=2)
    return fig


def sp_measured(S=2, seq=128, precision="fp32", mode="ulysses"):
    """One real run of build/bin/ulysses on S ranks (small, micro-batch 1, two steps): (the ledger's
    activation bytes on every rank, zero_estimate's for the same shape)."""
    extra = ("--sp", str(S)) + (("--sp-mode", mode) if mode != "ulysses" else ())
    report = run("ulysses", S, preset="small", seq=seq, batch=1, precision=precision, extra=extra)
    ledger = [measured(report, r)["activations"] for r in range(S)]
    formula = sp_estimate(S, seq, mode=mode, precision=precision, ctx=None)["bytes"]["activations"]
    return ledger, formula


def sp_bytes_per_block(sps=(2, 4, 8, 16), tokens_per_rank=512, preset="small", batch=1, heads=16):
    """{S: (Ulysses' all-to-all elements, ring's point-to-point forward, ring's forward + backward)},
    each rank's per block and micro-step, with T = S x tokens_per_rank (the sequence grows with the
    ranks: the paper's setting). The preset gets `heads` heads, so that Ulysses splits them up to
    S = heads (the elements sent do not depend on the head count)."""
    out = {}
    for S in sps:
        T = S * tokens_per_rank
        shape = ("--heads", str(heads))
        u = sp_estimate(S, T, preset=preset, batch=batch, ctx=T, extra=shape)
        r = sp_estimate(S, T, mode="ring", preset=preset, batch=batch, ctx=T, extra=shape)
        out[S] = (u["all_to_all_elems_per_block"], r["p2p_elems_forward_per_block"], r["p2p_elems_per_block"])
    return out


def fig_sp_bytes(sps=(2, 4, 8, 16), tokens_per_rank=512, **kw):
    """Elements each rank sends per block and micro-step against S, T/S fixed: the all-to-all flat,
    the ring growing as S - 1 (`small` with 16 heads, sp_bytes_per_block)."""
    data = sp_bytes_per_block(sps, tokens_per_rank, **kw)
    fig = Figure(figsize=(8, 4.5), layout="constrained")
    ax = fig.subplots()
    xs = list(data)
    ax.plot(xs, [data[S][0] for S in xs], "o-", color=SP_COLOR["ulysses"], label="Ulysses: 4 all-to-alls")
    ax.plot(xs, [data[S][1] for S in xs], "s--", color=SP_COLOR["ring"], label="ring: the forward's k|v hops")
    ax.plot(xs, [data[S][2] for S in xs], "s-", color=SP_COLOR["ring"], label="ring: forward + backward")
    ax.set_xscale("log", base=2)
    ax.set_xticks(xs, [str(S) for S in xs])
    ax.set_xlabel("S (ranks per sequence), T = S x %d tokens" % tokens_per_rank)
    ax.set_ylabel("elements sent per rank, per block")
    ax.set_title("elements per block and micro-step, T/S fixed (small, 16 heads; zero_estimate --sp)")
    ax.legend()
    return fig


def sp_allowed(world, seq, mode="ulysses", preset="gpt2"):
    """The S that zero_estimate --sp S --world N accepts for the preset's heads (its one-line refusal,
    exit 2, for the others): S from 1 to N."""
    ok = []
    for S in range(1, world + 1):
        cmd = [str(bin_dir() / "zero_estimate"), "--json", "--sp", str(S), "--world", str(world), "--preset", preset,
               "--seq", str(seq), "--ctx", str(seq)] + (["--sp-mode", mode] if mode != "ulysses" else [])
        if subprocess.run(cmd, capture_output=True, text=True).returncode == 0:
            ok.append(S)
    return ok


__all__ = [n for n in dir() if n.startswith(("sp_", "fig_sp_", "SP_"))]
