#!/usr/bin/env bash
# What does each way of making the model smaller cost in loss, and what does it save in bytes?
# For each seed: train a `small` model (stage0_ddp, one rank), then score it by gpt_eval on the
# validation split as fp32, int8 (blocks of 64), int4 post-training (blocks of 64 and 256, the tied
# embedding kept) and pruned by magnitude per matrix at four sparsities; then fine-tune it from the
# trained weights: dense (a pruned file at sparsity 0: the same run with nothing pruned, the baseline
# of the fine-tuned rows), with --qat int4 --qat-skip embedding (scored by gpt_eval --weights-int4,
# which at the default block 64 is the trainer's own QAT forward), and with --prune-mask at each
# sparsity. The seed is the initial training's (initialisation and data order) and its fine-tunes'
# (their data order): every seed is the whole study again, so differences pair by seed.
#   scripts/compression_study.sh FILE [SEEDS] [STEPS] [FT_STEPS]   (default 3 seeds, 100, 20)
# writes every score to FILE (tab-separated, the command in its first line), which
# docs/compression.md's table, notebooks/07_compression.ipynb and make plots' compression.png read,
# and prints the summary table (markdown). Bytes: the format's size as the tools report it
# (generate's params_stored for fp32/int8/int4, the pruned file's size from prune). BIN=build/bin.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-build/bin}
command_line="$([ "$BIN" = build/bin ] || echo "BIN=$BIN ")scripts/compression_study.sh $*"
raw_file=${1:?usage: scripts/compression_study.sh FILE [SEEDS] [STEPS] [FT_STEPS]}
SEEDS=${2:-3}
STEPS=${3:-100}
FT_STEPS=${4:-20}
SPARSITIES="0.25 0.5 0.75 0.9"
DATA=data/corpus.txt
TRAIN="--preset small --batch 8 --seq 64 --lr 3e-3 --eval-every 0 --eval-windows 64 --quiet --data $DATA"
FT="--preset small --batch 8 --seq 64 --lr 1e-3 --warmup 0 --eval-every 0 --eval-windows 64 --quiet --data $DATA"
EVAL="--data $DATA --split val --seq 64 --windows 64"
work=$(mktemp -d /tmp/compression-study.XXXXXX)
trap 'rm -rf "$work"' EXIT
rows="$work/rows"

fail() { echo "error: run failed: $*" >&2; exit 1; }
score() {  # gpt_eval's mean cross-entropy
  local v
  v=$("$BIN/gpt_eval" "$@" $EVAL 2>&1 | sed -n 's/^mean cross-entropy: \([0-9.]*\) nats.*/\1/p')
  [ -n "$v" ] || fail "$BIN/gpt_eval $* $EVAL"
  echo "$v"
}
stored() {  # the bytes generate stores the weights in
  local v
  v=$("$BIN/generate" "$@" --length 1 2>&1 | sed -n 's/.*params_stored=\([0-9]*\).*/\1/p')
  [ -n "$v" ] || fail "$BIN/generate $* --length 1"
  echo "$v"
}
train() {  # train SEED MODEL_OUT ARGS...: prints the trainer's final validation loss
  local seed=$1 out=$2 v
  shift 2
  v=$("$BIN/stage0_ddp" --seed "$seed" --save-model "$out" "$@" 2>&1 |
      sed -n 's/.*validation loss \([0-9.]*\).*/\1/p' | tail -1)
  [ -n "$v" ] || fail "$BIN/stage0_ddp --seed $seed --save-model $out $*"
  echo "$v"
}
row() {
  for x in "$@"; do [ -n "$x" ] || fail "a score is missing in row: $*"; done
  printf "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n" "$@" >>"$rows"
}

for s in $(seq 1 "$SEEDS"); do
  m="$work/s$s.model"
  train "$s" "$m" $TRAIN --steps "$STEPS" >/dev/null
  if [ "$s" = 1 ]; then  # the bytes do not depend on the weights' values
    b_fp32=$(stored --model "$m"); b_int8=$(stored --model "$m" --weights-int8)
    b_int4_64=$(stored --model "$m" --weights-int4 --int4-block 64)
    b_int4_256=$(stored --model "$m" --weights-int4 --int4-block 256)
  fi
  row fp32 - - no "$s" "$(score --model "$m")" "$b_fp32" "gpt_eval"
  row int8 64 - no "$s" "$(score --model "$m" --weights-int8)" "$b_int8" "gpt_eval --weights-int8"
  row int4 64 - no "$s" "$(score --model "$m" --weights-int4 --int4-block 64)" "$b_int4_64" \
    "gpt_eval --weights-int4 --int4-block 64"
  row int4 256 - no "$s" "$(score --model "$m" --weights-int4 --int4-block 256)" "$b_int4_256" \
    "gpt_eval --weights-int4 --int4-block 256"
  "$BIN/prune" --model "$m" --out "$work/s$s.p0" --sparsity 0 >/dev/null || fail "prune --sparsity 0"
  train "$s" "$work/s$s.ft.model" $FT --steps "$FT_STEPS" --prune-mask "$work/s$s.p0" >/dev/null
  row fp32 - - yes "$s" "$(score --model "$work/s$s.ft.model")" "$b_fp32" "stage0_ddp --prune-mask (sparsity 0)"
  train "$s" "$work/s$s.qat.model" $FT --steps "$FT_STEPS" --prune-mask "$work/s$s.p0" \
    --qat int4 --qat-skip embedding >/dev/null
  row int4 64 - yes "$s" "$(score --model "$work/s$s.qat.model" --weights-int4)" "$b_int4_64" \
    "stage0_ddp --qat int4 --qat-skip embedding, then gpt_eval --weights-int4"
  for sp in $SPARSITIES; do
    p="$work/s$s.p$sp"
    "$BIN/prune" --model "$m" --out "$p" --sparsity "$sp" >/dev/null || fail "prune --sparsity $sp"
    row pruned - "$sp" no "$s" "$(score --model "$p")" "$(stat -c %s "$p")" "prune --sparsity $sp"
    train "$s" "$work/s$s.ft$sp.model" $FT --steps "$FT_STEPS" --prune-mask "$p" >/dev/null
    row pruned - "$sp" yes "$s" "$(score --model "$work/s$s.ft$sp.model")" "$(stat -c %s "$p")" "stage0_ddp --prune-mask (prune --sparsity $sp)"
  done
done
{
  echo "# $command_line   ($(date -u +%Y-%m-%d), $(nproc) cores, $(uname -m))"
  echo "# train: stage0_ddp $TRAIN --steps $STEPS --seed SEED; fine-tune: stage0_ddp $FT --steps $FT_STEPS --seed SEED from the trained model (--prune-mask)"
  echo "# every model scored by gpt_eval $EVAL; bytes: generate's params_stored, the pruned file's size"
  printf "format\tblock\tsparsity\tfinetuned\tseed\tval_loss\tbytes\thow\n"
  cat "$rows"
} >"$raw_file.tmp"
mv "$raw_file.tmp" "$raw_file"
.venv/bin/python -c 'import sys; sys.path.insert(0, "scripts"); import nzplots
print(nzplots.compression_markdown(sys.argv[1]))' "$raw_file"
