#!/usr/bin/env bash
# bench.sh — `make bench`: where the time of a CPU training step goes, for two shapes (1M and 11M parameters).
# For each shape, one process on every core:
#   1. stage0_ddp end to end (fp32, bf16; --kernels fast, and fp32 --kernels reference for the small
#      shape): tokens/s from the trainer's own mean step time;
#   2. bench_kernels: the kernels of one step by op, the matmuls' GFLOP/s beside the BLAS's own
#      sgemm measured in the same run;
#   3. the same model and step in PyTorch, if `import torch` works for $NZ_TORCH_PYTHON (default:
#      .venv/bin/python, then python3), and the ratio. PyTorch is never installed by this project.
# Then one table. Takes a few minutes on 2 cores; run it on an otherwise idle machine.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=build/bin
threads=$(nproc)
steps=${STEPS:-8}
py=""
for cand in ${NZ_TORCH_PYTHON:-} .venv/bin/python python3; do
  if [ -x "$(command -v "$cand" 2>/dev/null)" ] && "$cand" -c 'import torch' >/dev/null 2>&1; then py=$cand; break; fi
done

# name | model flags | batch | seq
shapes=("small L5 C128 H4 T128 B8|--preset small|8|128"
        "L6 C384 H6 T256 B4|--preset gpt2 --layers 6 --dim 384 --heads 6|4|256")

# tokens/s of a trainer run: B*T / mean ms per step (the trainer's "done:" line)
train_tok_s() {  # flags...
  local out
  out=$(timeout -k 5 600 mpirun -np 1 "$BIN/stage0_ddp" --steps "$steps" --eval-every 0 --eval-windows 1 --quiet "$@" 2>&1) ||
    { echo "stage0_ddp failed: $out" >&2; echo "-"; return; }
  local ms=$(sed -nE 's/.*\| ([0-9.]+) ms\/step$/\1/p' <<<"$out" | tail -1)
  awk -v ms="$ms" -v bt="$BT" 'BEGIN { printf "%.0f", bt / ms * 1000 }'
}
field() { sed -nE "s/.*[ ]$1=([0-9.]+).*/\1/p" <<<"$2" | tail -1; }

rows=()
# whether bf16 products run on the CPU's own bf16 instructions (common/kernels/gemm_bf16.h); bench_kernels reports it
bf16_how=$("$BIN/bench_kernels" --preset small --batch 1 --seq 8 --reps 1 --precision bf16 | sed -nE 's/^bf16 products: (.*)/\1/p')
for s in "${shapes[@]}"; do
  IFS='|' read -r name model B T <<<"$s"
  BT=$((B * T))
  echo "== $name: stage0_ddp, 1 rank, $threads threads, $steps steps"
  fp32=$(train_tok_s $model --batch "$B" --seq "$T" --precision fp32)
  bf16=$(train_tok_s $model --batch "$B" --seq "$T" --precision bf16)
  # the same bf16 run with its products widened to fp32 and sent to sgemm, as on a CPU without bf16 instructions
  bf16w=$(NZ_CPU_BF16_GEMM=widen train_tok_s $model --batch "$B" --seq "$T" --precision bf16)
  refk="-"
  [ "$BT" -le 1024 ] && [ "${name%% *}" = small ] && refk=$(train_tok_s $model --batch "$B" --seq "$T" --kernels reference)
  echo "   fp32 $fp32 tokens/s | bf16 $bf16 tokens/s ($bf16_how) | bf16 widened $bf16w tokens/s | fp32 --kernels reference $refk tokens/s"
  echo "== $name: bench_kernels (fp32, fast)"
  bk=$("$BIN/bench_kernels" $model --batch "$B" --seq "$T" --threads "$threads" --reps 10)
  grep -E '^(kernel time|by op|matmuls)' <<<"$bk" | sed 's/^/   /'
  torch="-" ratio="-"
  if [ -n "$py" ]; then
    IFS=' ' read -r L C H <<<"$(sed -E 's/.*L([0-9]+) C([0-9]+) H([0-9]+).*/\1 \2 \3/' <<<"$name")"
    tl=$("$py" scripts/bench_torch.py --layers "$L" --dim "$C" --heads "$H" --seq "$T" --batch "$B" --steps "$steps" 2>&1 | grep '^BENCH' || true)
    torch=$(field tokens_per_s "$tl")
    [ -n "$torch" ] && ratio=$(awk -v a="$fp32" -v b="$torch" 'BEGIN { printf "%.2f", a / b }') || torch="-"
    echo "   PyTorch: $tl"
  fi
  gf=$(awk -v t="$fp32" -v k="$(field tokens_per_s "$(grep '^BENCH' <<<"$bk")")" -v g="$(field gflops "$(grep '^BENCH' <<<"$bk")")" \
       'BEGIN { printf "%.0f", g * t / k }')  # the kernels' FLOPs per token at the trainer's rate
  mm=$(field matmul_gflops "$(grep '^BENCH' <<<"$bk")") peak=$(field sgemm_gflops "$(grep '^BENCH' <<<"$bk")")
  rows+=("$(printf '%-22s %9s %9s %9s %9s %8s %9s %6s %13s' "$name" "$fp32" "$bf16" "$bf16w" "$refk" "$gf" "$torch" "$ratio" "$mm / $peak")")
done

echo
echo "tokens/s, one process, $threads threads (fp32 unless marked); GFLOP/s: the matmuls' and attention's FLOPs at the fp32 rate;"
echo "GEMM: nanoZeRO's matmuls / the BLAS's sgemm alone, GFLOP/s, same run"
echo "bf16: its products on $bf16_how; bf16-wide: the same run with them widened to fp32 for sgemm"
printf '%-22s %9s %9s %9s %9s %8s %9s %6s %13s\n' shape nanoZeRO bf16 bf16-wide reference GFLOP/s PyTorch ratio GEMM
for r in "${rows[@]}"; do echo "$r"; done
[ -n "$py" ] || echo "(PyTorch: not importable here; set NZ_TORCH_PYTHON to a python with torch to compare)"
