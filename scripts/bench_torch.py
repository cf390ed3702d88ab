"""bench_torch.py — the same GPT training step in PyTorch, on the CPU, for `make bench` to compare.

    python scripts/bench_torch.py --layers 6 --dim 384 --heads 6 --seq 256 --batch 4 [--steps 8]
    python scripts/bench_torch.py --adam 10000000 [--reps 5]   # PyTorch's fused CPU AdamW alone

The model of common/model.h: byte vocabulary (256), learned positions, pre-norm blocks (layernorm,
causal self-attention, layernorm, MLP with tanh GELU), a final layernorm and the LM head tied to
the token embedding; cross-entropy, backward, AdamW. fp32 (or bf16 autocast with --precision bf16),
one process on every core. Prints one line: BENCH tokens_per_s=... ms_per_step=...
With --adam N: one AdamW step of torch.optim.AdamW(fused=True) on N fp32 parameters, the best of
--reps, as `make bench-adam` compares it with the host AdamW (scripts/bench_adam.sh): BENCH
adam_elems_per_s=...
PyTorch is not a dependency of the project: scripts/bench.sh and bench_adam.sh run this only where
torch imports.
"""
import argparse
import math
import os
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.fc, self.fcproj = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(C, dim=2)
        # (B, T, C) -> (B, heads, T, head size)
        q, k, v = (z.view(B, T, self.heads, C // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(B, T, C))
        return x + self.fcproj(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, layers, dim, heads, ctx, vocab=256):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, dim), nn.Embedding(ctx, dim)
        self.blocks = nn.ModuleList(Block(dim, heads) for _ in range(layers))
        self.lnf = nn.LayerNorm(dim)

    def forward(self, idx, targets):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))
        for b in self.blocks:
            x = b(x)
        logits = self.lnf(x) @ self.wte.weight.t()  # the LM head, tied to the token embedding
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1))


def bench_adam(n, reps):
    """Elements per second of PyTorch's fused CPU AdamW, with the hyperparameters bench_adam uses."""
    g = torch.Generator().manual_seed(0)
    p = nn.Parameter(0.02 * torch.randn(n, generator=g))
    p.grad = 0.001 * torch.randn(n, generator=g)
    opt = torch.optim.AdamW([p], lr=1e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1, fused=True)
    opt.step()  # first step: the state (m, v) is allocated here, not timed
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        opt.step()
        best = min(best, time.perf_counter() - t0)
    print(f"BENCH adam_elems_per_s={n / best:.4e} n={n} torch={torch.__version__} "
          f"threads={torch.get_num_threads()}")


def main():
    ap = argparse.ArgumentParser()
    for name, default in (("layers", 6), ("dim", 384), ("heads", 6), ("seq", 256), ("batch", 4), ("steps", 8)):
        ap.add_argument("--" + name, type=int, default=default)
    ap.add_argument("--precision", default="fp32", choices=("fp32", "bf16"))
    ap.add_argument("--adam", type=int, default=0, help="time only a fused AdamW step on N parameters")
    ap.add_argument("--reps", type=int, default=5)
    a = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", os.cpu_count())))
    if a.adam:
        return bench_adam(a.adam, a.reps)
    model = GPT(a.layers, a.dim, a.heads, a.seq)
    params = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.1)
    idx = torch.randint(0, 256, (a.batch, a.seq))
    tgt = torch.randint(0, 256, (a.batch, a.seq))
    times = []
    for step in range(a.steps + 2):  # two warm-up steps
        t0 = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.precision == "bf16"):
            loss = model(idx, tgt)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        times.append(time.perf_counter() - t0)
    ms = 1e3 * sorted(times[2:])[len(times[2:]) // 2]  # the median step
    print(f"BENCH tokens_per_s={a.batch * a.seq / ms * 1e3:.1f} ms_per_step={ms:.2f} params={params} "
          f"torch={torch.__version__} threads={torch.get_num_threads()}")


if __name__ == "__main__":
    main()
