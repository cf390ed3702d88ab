"""plots.py — the memory and communication figures as PNG files, without Jupyter (`make plots`).

    .venv/bin/python scripts/plots.py --out runs/plots [--params 7.5B] [--capacity-gb 80]

Runs every built trainer on the small preset at N = 1..4 (about a second each; reports cached in
runs/reports), at N = 4 with --accum 2 and 4 and with --activation-checkpointing, asks zero_estimate
for the formulas, and writes (with infinity's runs for largest_model.png):
    memory_by_category.png   per-rank bytes by category, ledger beside formula (N = 4): the model
                             states alone, and the same with the activations on top
    memory_vs_ranks.png      model-state memory per rank against N: the formula for 7.5B with the
                             ZeRO paper's Table 1 written on it, and the measured runs
    memory_checkpointing.png per-rank memory by category without and with activation checkpointing:
                             the formula for a 7B-like shape (N = 64, batch 4 x 1024, bf16), and the
                             small runs measured (N = 4)
    largest_model.png        the largest model whose device peak fits 24 GB per rank, per rung (the ladder
                             and infinity) at N = 1 and 64, without and with activation checkpointing,
                             from the formulas; beside it the small runs' device peak, ledger = formula
                             (N = 1 and 4; the script stops if one differs)
    memory_timeline.png      the ledger's timeline by phase (set-up, forward, backward, optimizer of
                             two steps), stage3's gathers labelled with their unit (N = 4)
    comm_per_step.png        bytes per step: the network (K = 1) against 2Ψ(N-1)/N and 3Ψ(N-1)/N, and
                             offload's host link (K·S down, S up) on its own axis
    comm_vs_accum.png        elements sent per step against K = 1..8 micro-steps, by stage (N = 4)
    pipeline_diagram.png     the pipeline (P = 4, K = 8), GPipe and 1F1B: each segment's forwards and
                             backwards of the last step, as measured
    pipeline_bubble.png      the measured idle fraction against K = 1..16 beside (P-1)/(K+P-1), P = 2
    zeropp_network.png       ZeRO++ against stage3: communication time and time per step against N on a
                             fast and a slow interconnect (zero_estimate --zeropp --network; no runs)
    zeropp_loss_vs_block.png the final validation loss of int8 weights (qwZ) and int4 gradients (qgZ)
                             minus stage3's against the block size, mean ± sd over seeds, from the
                             committed table docs/data/zeropp_loss_vs_block.tsv (no training here)
    compression.png          a trained `small` model pruned (loss against sparsity, before and after
                             fine-tuning) and quantized (int8, int4, int4 after QAT): loss against
                             bytes, from the committed table docs/data/compression.tsv (no training here)
The notebooks in notebooks/ draw the same figures with the same code (scripts/nzplots/).
"""
import argparse
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display needed
sys.path.insert(0, str(Path(__file__).resolve().parent))
import nzplots as nz  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="runs/plots", help="directory for the PNG files (default runs/plots)")
    ap.add_argument("--params", default="7.5B", help="parameter count of the big model in memory_vs_ranks (7.5B)")
    ap.add_argument("--capacity-gb", type=float, default=80, help="device capacity line in GB (default 80)")
    ap.add_argument("--worlds", default="1,2,3,4", help="rank counts of the measured runs (default 1,2,3,4)")
    a = ap.parse_args()
    try:
        worlds = [int(w) for w in a.worlds.split(",")]
        assert worlds and min(worlds) >= 1
    except (ValueError, AssertionError):
        sys.exit(f"error: --worlds {a.worlds}: expected rank counts like 1,2,3,4")
    if not (nz.bin_dir() / "zero_estimate").is_file():
        sys.exit(f"error: {nz.bin_dir()}/zero_estimate not found; run `make` first")
    if not nz.built_stages()[0]:
        sys.exit(f"error: no trainer in {nz.bin_dir()}; run `make` first")
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)

    reports = nz.run_stages(worlds=worlds)
    accum_reports = nz.run_accums(world=max(worlds), accums=(1, 2, 4))
    ckpt_reports = nz.run_checkpointed(world=max(worlds))
    figures = {
        "memory_by_category.png": nz.fig_categories(reports, world=max(worlds)),
        "memory_vs_ranks.png": nz.fig_scaling(reports, params=a.params, capacity_gb=a.capacity_gb),
        "memory_checkpointing.png": nz.fig_checkpointing(capacity_gb=a.capacity_gb, reports=reports,
                                                         ckpt_reports=ckpt_reports, small_world=max(worlds)),
        "largest_model.png": nz.fig_largest_model(capacity_gb=24, measured_worlds=(1, max(worlds))),
        "memory_timeline.png": nz.fig_timeline(reports, world=max(worlds)),
        "comm_per_step.png": nz.fig_comm(reports, accum_reports),
        "comm_vs_accum.png": nz.fig_comm_vs_accum(world=max(worlds), measured=accum_reports),
    }
    if (nz.bin_dir() / "pipeline").is_file():  # beside the ladder: drawn when it is built
        figures["pipeline_diagram.png"] = nz.fig_pipeline_diagram(segments=4, accum=8)
        figures["pipeline_bubble.png"] = nz.fig_bubble_vs_accum(segments=2)  # two segments: one core each here
    figures["zeropp_network.png"] = nz.fig_zeropp_network()  # formulas only
    figures["zeropp_loss_vs_block.png"] = nz.fig_zeropp_loss_vs_block()  # the committed measured table
    figures["compression.png"] = nz.fig_compression()  # the committed measured table
    for name, fig in figures.items():
        fig.savefig(out / name)
        print(f"wrote {out / name}")


if __name__ == "__main__":
    main()
