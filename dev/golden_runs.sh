#!/usr/bin/env bash
# golden_runs.sh — the same-bytes proof for a change that must not change any number.
#
#   bash dev/golden_runs.sh BIN_DIR OUT_DIR     # run the set with the programs in BIN_DIR
#   bash dev/golden_runs.sh --compare A B       # every file of A and B equal, byte for byte
#
# Build the tree before the change, run the set into A; build after it, run into B; compare.
# Each run writes its model file, its checkpoint files and its --log-json report with the
# fields that measure time removed (ms, tokens/s, seconds): every loss, norm, learning rate,
# ledger byte count and comm count stays in, so any changed number is a changed byte.
set -euo pipefail

if [[ "${1:-}" == "--compare" ]]; then
  a=$2; b=$3
  fa=$(cd "$a" && find . -type f | sort); fb=$(cd "$b" && find . -type f | sort)
  if [[ "$fa" != "$fb" ]]; then
    echo "golden: the two sets hold different files:"; diff <(echo "$fa") <(echo "$fb") || true
    exit 1
  fi
  bad=0; n=0
  while read -r f; do
    n=$((n + 1))
    cmp -s "$a/$f" "$b/$f" || { echo "golden: DIFFERS $f"; bad=$((bad + 1)); }
  done <<< "$fa"
  echo "golden: $n files compared, $bad differ"
  [[ $bad -eq 0 ]]
  exit
fi

bin=$(cd "${1:?usage: golden_runs.sh BIN_DIR OUT_DIR}" && pwd)
out=${2:?usage: golden_runs.sh BIN_DIR OUT_DIR}
root=$(cd "$(dirname "$0")/.." && pwd)
[[ -e "$out" ]] && { echo "error: $out exists, expected a new directory; remove it or name another"; exit 2; }
mkdir -p "$out"; out=$(cd "$out" && pwd)
cd "$out"
data="$root/data/corpus.txt"
common=(--preset tiny --seq 32 --batch 2 --steps 4 --eval-every 2 --eval-windows 4 --quiet
        --data "$data" --watchdog 0)

strip_times() {  # the report without the fields that measure time
  python3 - "$1" <<'EOF'
import json, sys
TIME = {"ms", "tokens_per_s", "seconds", "wall_s", "mfu", "elapsed_s", "time_s"}
def clean(x):
    if isinstance(x, dict):
        return {k: clean(v) for k, v in x.items() if k not in TIME and not k.endswith("_ms")}
    if isinstance(x, list):
        return [clean(v) for v in x]
    return x
p = sys.argv[1]
d = clean(json.load(open(p)))
json.dump(d, open(p, "w"), indent=1, sort_keys=True)
EOF
}

run() {  # run NAME NP PROGRAM ARGS...: its report, model file and checkpoints under NAME/
  local name=$1 np=$2 prog=$3; shift 3
  mkdir -p "$name"
  echo "golden: $name" >&2
  mpirun -np "$np" "$bin/$prog" "${common[@]}" --log-json "$name/report.json" \
    --save-model "$name/model.bin" "$@" > "$name/stdout.txt" 2>&1 \
    || { echo "golden: $name failed:"; tail -5 "$name/stdout.txt"; exit 1; }
  strip_times "$name/report.json"
  rm -f "$name/stdout.txt"   # step lines carry times; the report holds every number
}

run s0_np1            1 stage0_ddp
run s0_np2_accum2     2 stage0_ddp --accum 2
run s1_np2            2 stage1
run s2_np2            2 stage2
run s3_np2            2 stage3
run s3_np3_noprefetch 3 stage3 --prefetch 0
run off_np2           2 offload
run off_np2_disk      2 offload --offload-to disk --offload-dir .
run s1_np2_bf16       2 stage1 --precision bf16
run s3_np3_bf16       3 stage3 --precision bf16
run s2_np2_fp16       2 stage2 --precision fp16 --loss-scale 1024
run s3_np2_fp16_ac    2 stage3 --precision fp16 --activation-checkpointing
run s2_np2_ref        2 stage2 --kernels reference
run s3_np2_ac         2 stage3 --activation-checkpointing --accum 2
run s2_np2_ckpt       2 stage2 --ckpt-dir "s2_np2_ckpt/ckpt" --ckpt-every 2
run s2_np2_resume     2 stage2 --resume "s2_np2_ckpt/ckpt/step-00000002" \
                             --ckpt-dir s2_np2_resume/ckpt
run s3_np3_from_s2    3 stage3 --resume "s2_np2_ckpt/ckpt/step-00000002" \
                             --ckpt-dir s3_np3_from_s2/ckpt
"$bin/consolidate" --ckpt s2_np2_ckpt/ckpt --out consolidated.bin --with-optimizer >/dev/null
# checkpoint MANIFESTs carry a run id and a time: keep the shards' bytes, drop the MANIFESTs
find . -name MANIFEST -delete
find . -name LOCK -delete
"$bin/gpt_eval" --model s1_np2/model.bin --data "$data" --seq 32 --windows 8 > eval.txt
"$bin/gpt_eval" --model s1_np2/model.bin --data "$data" --seq 32 --windows 8 --weights-int8 > eval_int8.txt
"$bin/generate" --model s1_np2/model.bin --prompt "The " --length 40 --quiet --seed 3 > gen.txt
"$bin/generate" --model s1_np2/model.bin --prompt "The " --length 40 --quiet --weights-int8 > gen_int8.txt
"$bin/generate" --model s1_np2/model.bin --prompt "The " --length 40 --quiet --kv-cache 0 > gen_nocache.txt
mpirun -np 2 "$bin/generate" --model s1_np2/model.bin --prompt "The " --length 40 --quiet \
  --weights sharded > gen_sharded.txt
"$bin/zero_estimate" --preset small --world 1,2,4,64 --precision bf16 --json > estimate.json
"$bin/zero_estimate" --paper-table > paper_table.txt
"$bin/zero_estimate" --quiz --seed 5 --count 6 --key > quiz_key.txt
echo "golden: $(find . -type f | wc -l) files in $out"
