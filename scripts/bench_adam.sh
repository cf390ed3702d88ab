#!/usr/bin/env bash
# bench_adam.sh — `make bench-adam`: how fast the host AdamW of ZeRO-Offload runs, and against
# PyTorch's fused CPU AdamW in the same run.
#   1. bench_adam's table: the scalar loop, the reference kernel and the fast one (cpu_adam.h), at
#      10M, 30M and 100M parameters, fp32 and bf16 gradients;
#   2. where `import torch` works for $NZ_TORCH_PYTHON (default: .venv/bin/python, then python3):
#      ROUNDS rounds (default 3), each timing the fast host AdamW and then torch.optim.AdamW(fused=True)
#      on N (default 10M) fp32 parameters with the same threads; each side's best over all rounds.
#      Interleaving the two spreads any other load on the machine over both sides alike.
# Run it on an otherwise idle machine; the update is memory-bound, so the rate follows the memory
# bandwidth the cores get.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=build/bin
threads=${OMP_NUM_THREADS:-$(nproc)}
export OMP_NUM_THREADS=$threads
n_m=${N_MILLION:-10}
rounds=${ROUNDS:-3}
reps=${REPS:-5}

"$BIN/bench_adam" "$@"

py=""
for cand in ${NZ_TORCH_PYTHON:-} .venv/bin/python python3; do
  if [ -x "$(command -v "$cand" 2>/dev/null)" ] && "$cand" -c 'import torch' >/dev/null 2>&1; then py=$cand; break; fi
done
echo
if [ -z "$py" ]; then
  echo "PyTorch: not importable here; set NZ_TORCH_PYTHON to a python with torch to compare"
  exit 0
fi
best_nz=0 best_pt=0 tv=""
for r in $(seq "$rounds"); do
  # the fast column of bench_adam's fp32 row for N million elements
  nz=$("$BIN/bench_adam" --max "$n_m" --reps "$reps" |
       awk -v n="$((n_m * 1000000))" '$1 == "fp32" && $2 == n { print $5 }')
  pt=$("$py" scripts/bench_torch.py --adam "$((n_m * 1000000))" --reps "$reps" | grep '^BENCH')
  tv=$(sed -nE 's/.* torch=([^ ]+).*/\1/p' <<<"$pt")
  pt=$(sed -nE 's/.*adam_elems_per_s=([0-9.e+-]+).*/\1/p' <<<"$pt")
  [ -n "$nz" ] && [ -n "$pt" ] || { echo "bench_adam.sh: round $r gave no number (nanoZeRO '$nz', PyTorch '$pt')" >&2; exit 1; }
  printf 'round %d: host AdamW %.3e elem/s, PyTorch fused AdamW %.3e elem/s\n' "$r" "$nz" "$pt"
  best_nz=$(awk -v a="$best_nz" -v b="$nz" 'BEGIN { print (b > a ? b : a) }')
  best_pt=$(awk -v a="$best_pt" -v b="$pt" 'BEGIN { print (b > a ? b : a) }')
done
awk -v a="$best_nz" -v b="$best_pt" -v n="$n_m" -v t="$threads" -v tv="$tv" -v r="$rounds" -v k="$reps" 'BEGIN {
  printf "AdamW, %dM fp32 parameters, %d threads, best of %d rounds x %d: host AdamW %.3e elem/s, " \
         "PyTorch %s fused %.3e elem/s: %.2fx\n", n, t, r, k, a, tv, b, a / b }'
