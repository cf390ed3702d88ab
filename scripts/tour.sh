#!/usr/bin/env bash
# The main job (`make run`): every stage trains the same `small` model on the same data with 4 MPI
# ranks, then one table compares them side by side: per-rank memory by category (measured by the
# ledger, and the formula), the loss (identical, bit for bit), ms per step, and elements sent per step.
# stage0_ddp trains the whole run (STEPS) and writes the model the samples come from; the four ZeRO
# rungs train its first COMPARE steps, which is all the comparison needs: the learning rate follows
# a curve fixed by STEPS alone (linear warm-up, then linear decay to 0 at STEPS: DeepSpeed's
# WarmupDecayLR), so their first COMPARE steps are the same computation as stage0_ddp's, and the
# table checks every one of those steps' losses bit for bit.
# Override with environment variables, e.g.  NP=2 STEPS=50 make run, PRECISION=fp32 make run,
# COMPARE=450 make run (every rung the whole run)
set -euo pipefail
cd "$(dirname "$0")/.."
NP=${NP:-4}
STEPS=${STEPS:-450}
COMPARE=${COMPARE:-100}
[ "$COMPARE" -le "$STEPS" ] || COMPARE=$STEPS
# The precision that is fastest on this CPU. bf16 where the CPU multiplies bf16 pairs itself
# (AVX512-BF16, AMX): its products run about 1.5x faster than fp32's (make bench). Elsewhere (most
# laptops: AVX2 without AVX-512, ARM) a bf16 product is widened to fp32 first, fp32's work plus the
# widening, so the tour trains in fp32. The trainers decide the path once per process
# (common/kernels/gemm_bf16.h) and say it in their header: one tiny bf16 step asks them.
if [ -z "${PRECISION:-}" ]; then
  said=$(mpirun -np 1 build/bin/stage0_ddp --preset tiny --seq 16 --batch 1 --steps 1 --eval-windows 1 \
           --precision bf16 --quiet 2>&1 | grep -m1 '^bf16 products:' || true)
  case "$said" in
    *"bf16 instructions"*) PRECISION=bf16 ;;
    *) PRECISION=fp32 ;;
  esac
  echo "precision: $PRECISION (${said:-no bf16 path reported}); PRECISION=bf16|fp32 chooses"
fi
FLAGS=${FLAGS:-"--preset small --batch 6 --seq 64 --precision $PRECISION --lr 3e-3 --warmup 15 --eval-every 50"}
LR_CURVE="--lr-curve warmup-decay --warmup-type linear --lr-total-steps $STEPS"
out=runs/tour
mkdir -p "$out"
stages=()
for s in $(awk '/^[a-z]/ {print $1}' stages.txt); do
  [ -x "build/bin/$s" ] && stages+=("$s")
done
echo "nanoZeRO tour: ${stages[*]} | $NP ranks | $FLAGS $LR_CURVE"
echo "stage0_ddp trains $STEPS steps; the ZeRO rungs train its first $COMPARE (COMPARE=$STEPS make run: all of them)"
for s in "${stages[@]}"; do rm -f "$out/$s.json" "$out/$s.model"; done  # nothing of an earlier tour is read
for s in "${stages[@]}"; do
  echo
  # stage0_ddp prints every 10th step; the others only their summary (the numbers are the same)
  if [ "$s" = stage0_ddp ]; then
    echo "=== $s: $STEPS steps"
    mpirun -np "$NP" "build/bin/$s" $FLAGS $LR_CURVE --steps "$STEPS" --log-json "$out/$s.json" \
      --save-model "$out/$s.model" |
      awk '/^step/ && !/validation/ { n++; if (n % 10 != 0) next } { print; fflush() }'
  else
    echo "=== $s: the first $COMPARE steps"
    mpirun -np "$NP" "build/bin/$s" $FLAGS $LR_CURVE --steps "$COMPARE" --log-json "$out/$s.json" --quiet
  fi
done
echo
python3 scripts/tour_table.py --at "$COMPARE" "${stages[@]/#/$out/}"
echo
# The model was trained on windows of 64 bytes (--seq 64): it has learned positions 0..63 only, so
# the sample stops there (generate says so); the KV cache computes one position per byte.
# Three sequences decoded together (--batch 3), each from its own random stream.
echo "samples from the trained model (build/bin/generate --model $out/stage0_ddp.model --prompt 'One morning' --window 64 --batch 3):"
build/bin/generate --model "$out/stage0_ddp.model" --prompt "One morning" --window 64 --batch 3 --length 200 --seed 7 --quiet
