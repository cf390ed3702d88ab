#!/usr/bin/env bash
# The main job (`make run`): every stage trains the same `small` model on the same data with 4 MPI
# ranks, then one table compares them side by side: per-rank memory by category (measured by the
# ledger, and the formula), final loss (identical, bit for bit), ms per step, and elements sent per step.
# Override with environment variables, e.g.  NP=2 STEPS=50 make run
set -euo pipefail
cd "$(dirname "$0")/.."
NP=${NP:-4}
STEPS=${STEPS:-450}
# bf16: on a CPU with bf16 instructions its products run about 1.5x faster than fp32's (make bench),
# which buys the batch of 6 that takes the model from babble to words in about the same time.
FLAGS=${FLAGS:-"--preset small --batch 6 --seq 64 --precision bf16 --lr 3e-3 --warmup 15 --eval-every 50"}
out=runs/tour
mkdir -p "$out"
stages=()
for s in stage0_ddp stage1 stage2 stage3 offload; do
  [ -x "build/bin/$s" ] && stages+=("$s")
done
echo "nanoZeRO tour: ${stages[*]} | $NP ranks | $FLAGS --steps $STEPS"
for s in "${stages[@]}"; do
  echo
  echo "=== $s"
  # stage0_ddp prints every 10th step; the others only their summary (the numbers are the same)
  if [ "$s" = stage0_ddp ]; then
    mpirun -np "$NP" "build/bin/$s" $FLAGS --steps "$STEPS" --log-json "$out/$s.json" --save-model "$out/$s.model" |
      awk '/^step/ && !/validation/ { n++; if (n % 10 != 0) next } { print; fflush() }'
  else
    mpirun -np "$NP" "build/bin/$s" $FLAGS --steps "$STEPS" --log-json "$out/$s.json" --save-model "$out/$s.model" --quiet
  fi
done
echo
python3 scripts/tour_table.py "${stages[@]/#/$out/}"
echo
# The model was trained on windows of 64 bytes (--seq 64): it has learned positions 0..63 only, so
# the sample stops there (generate says so); the KV cache computes one position per byte.
# Three sequences decoded together (--batch 3), each from its own random stream.
echo "samples from the trained model (build/bin/generate --model $out/stage0_ddp.model --prompt 'One morning' --window 64 --batch 3):"
build/bin/generate --model "$out/stage0_ddp.model" --prompt "One morning" --window 64 --batch 3 --length 200 --seed 7 --quiet
