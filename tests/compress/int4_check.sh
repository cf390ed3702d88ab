#!/usr/bin/env bash
# int4 weights for inference (issue 28, item 3), from the command line: generate --weights-int4
# stores and moves ceil(n/2) + 4 ceil(n/B) bytes per quantised unit of n weights (the formula
# written out here, at several block sizes B, one that divides no unit), the tied embedding kept
# in the storage type unless --int4-embed 1 (a one-byte prompt: every step moves every unit once,
# plus the embedding once for the first lookup); the same text wherever the weights live (device,
# host, disk); a --qat int4 model scored at its own validation loss; and bad input is one line,
# exit 2. Prints NZRESULT lines for tests/run_all.sh.
cd "$(dirname "$0")/../.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
bin=${NZ_BIN_DIR:-build/bin}
gen=$bin/generate
export OMP_WAIT_POLICY=passive
source tests/lib/check.sh  # pass, fail, expect_error
check_suite int4
check() { if [ "$2" = "$3" ]; then pass "$1"; else fail "$1" "got '$2', want '$3'"; fi; }
stat() { sed -n "s/.*stats:.* $1=\([0-9]*\).*/\1/p" "$2"; }

mpirun -np 1 $bin/stage0_ddp --preset tiny --seq 16 --steps 1 --quiet --eval-windows 2 \
  --save-model "$tmp/tiny.model" >/dev/null 2>&1 || { fail setup "could not train the tiny model"; exit 0; }
# tiny: the embedding unit (wte 256 x 32 + wpe 32 x 32), two blocks of 12 C^2 + 13 C, lnf 2 C
E=9216 K=12704 F=64
i4() { echo $((($1 + 1) / 2 + 4 * (($1 + $2 - 1) / $2))); }  # n weights, blocks of B
base="--model $tmp/tiny.model --prompt T --batch 2 --length 12 --temperature 0.8"

for B in 8 32 64 4096; do  # 4096 divides no unit: each unit ends in a shorter block
  flags="--weights-int4"
  [ $B = 64 ] || flags="$flags --int4-block $B"  # 64: the default
  Q=$((E * 4 + 2 * $(i4 $K $B) + $(i4 $F $B)))
  $gen $base --weights device $flags >"$tmp/d.txt" 2>"$tmp/d.err"
  check "B${B}_device_params_bytes" "$(stat params_stored "$tmp/d.err")" $Q
  for w in host disk; do
    $gen $base --weights $w $flags >"$tmp/o.txt" 2>"$tmp/e.txt"
    if [ -s "$tmp/o.txt" ] && cmp -s "$tmp/o.txt" "$tmp/d.txt"; then pass "B${B}_${w}_same_text"
    else fail "B${B}_${w}_same_text" "differs from device"; fi
    steps=$(stat steps "$tmp/e.txt")
    check "B${B}_${w}_params_bytes" "$(stat params_stored "$tmp/e.txt")" $Q
    check "B${B}_${w}_link_bytes" "$(stat link_bytes "$tmp/e.txt")" $((steps * Q + E * 4))
  done
done
$gen $base --weights-int4 --int4-embed 1 >/dev/null 2>"$tmp/e.txt"
check embedding_int4_params_bytes "$(stat params_stored "$tmp/e.txt")" $(($(i4 $E 64) + 2 * $(i4 $K 64) + $(i4 $F 64)))
$gen $base --weights-int4 --precision bf16 >/dev/null 2>"$tmp/e.txt"
check bf16_embedding_kept_params_bytes "$(stat params_stored "$tmp/e.txt")" $((E * 2 + 2 * $(i4 $K 64) + $(i4 $F 64)))
# against fp32 and int8 (n + 4 ceil(n/64), the 4-byte padding a no-op on tiny's units)
$gen $base >/dev/null 2>"$tmp/f.txt"
$gen $base --weights-int8 >/dev/null 2>"$tmp/i8.txt"
i8() { echo $(($1 + 4 * (($1 + 63) / 64))); }
check fp32_params_bytes "$(stat params_stored "$tmp/f.txt")" $(((E + 2 * K + F) * 4))
check int8_params_bytes "$(stat params_stored "$tmp/i8.txt")" $(($(i8 $E) + 2 * $(i8 $K) + $(i8 $F)))
if $bin/gpt_eval --model "$tmp/tiny.model" --data data/corpus.txt --windows 4 --weights-int4 --int4-block 64 \
  >"$tmp/g.txt" 2>&1 && grep -q "int4 weights (embedding kept" "$tmp/g.txt"; then pass gpt_eval_int4
else fail gpt_eval_int4 "$(head -c 300 "$tmp/g.txt")"; fi

# A model trained with --qat int4 --qat-skip embedding (its validation runs at the quantized
# weights) is served on the grid it trained on: gpt_eval --weights-int4 at the default block gives
# the trainer's validation loss to the printed digit; fp32 and another block do not.
mpirun -np 1 $bin/stage0_ddp --preset tiny --seq 32 --batch 4 --steps 10 --qat int4 --qat-skip embedding \
  --eval-every 0 --eval-windows 8 --quiet --save-model "$tmp/qat.model" >"$tmp/qat.txt" 2>&1
val=$(sed -n 's/.*validation loss \([0-9.]*\) .*/\1/p' "$tmp/qat.txt")
qev() { $bin/gpt_eval --model "$tmp/qat.model" --data data/corpus.txt --split val --seq 32 --windows 8 "$@" |
  sed -n 's/mean cross-entropy: \([0-9.]*\) nats.*/\1/p'; }
l4=$(qev --weights-int4) l32=$(qev) l4b=$(qev --weights-int4 --int4-block 32)
if [ -n "$val" ] && [ "$l4" = "$val" ] && [ "$l32" != "$val" ] && [ "$l4b" != "$val" ]; then pass qat_model_on_its_grid
else fail qat_model_on_its_grid "trainer $val, int4 $l4, fp32 $l32, int4 B=32 $l4b"; fi

# ---- bad input: one line, exit 2 ----
for B in 48 4 131072 0 -8; do
  expect_error "block_$B" "expected a power of two from 8 to 65536" $gen $base --weights-int4 --int4-block $B
  expect_error "gpt_eval_block_$B" "expected a power of two from 8 to 65536" \
    $bin/gpt_eval --model "$tmp/tiny.model" --data data/corpus.txt --weights-int4 --int4-block $B
done
expect_error block_without_int4 "go with --weights-int4" $gen $base --int4-block 64
expect_error int4_and_int8 "one format at a time" $gen $base --weights-int4 --weights-int8
expect_error int4_sharded "not supported" $gen $base --weights-int4 --weights sharded
expect_error int4_cuda "CPU backend only" $gen $base --weights-int4 --device cuda
expect_error gpt_eval_int4_and_int8 "one format at a time" \
  $bin/gpt_eval --model "$tmp/tiny.model" --data data/corpus.txt --weights-int4 --weights-int8
