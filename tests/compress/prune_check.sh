#!/usr/bin/env bash
# Pruning's bad input (issue 28, item 6), from the command line: each is one line "error: ...",
# exit code 2, and the output file, when it already exists, keeps its bytes (prune writes through
# atomic_file.h). A damaged pruned file is refused by every reader: the checksum, and under a
# valid checksum the mask itself (its bit count, bits past the last parameter, an unprunable
# tensor marked pruned). Prints NZRESULT lines for tests/run_all.sh.
cd "$(dirname "$0")/../.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
bin=${NZ_BIN_DIR:-build/bin}
source tests/lib/check.sh  # pass, fail, expect_error
check_suite prune
tiny="--preset tiny --seq 32 --batch 2 --steps 1 --eval-every 0 --eval-windows 2 --quiet"

mpirun -np 1 $bin/stage0_ddp $tiny --save-model "$tmp/dense.model" >/dev/null 2>&1 &&
  $bin/prune --model "$tmp/dense.model" --out "$tmp/p.nzp" --sparsity 0.5 >/dev/null 2>&1 ||
  { fail setup "could not train and prune the tiny model"; exit 0; }
echo "old bytes" >"$tmp/existing.nzp"

# expect_error NAME WORDS CMD...: exit 2, one line starting "error:" that contains WORDS, and
# $tmp/existing.nzp untouched
expect_error() {
  local name=$1 words=$2
  shift 2
  "$@" >"$tmp/out.txt" 2>&1
  local rc=$? lines
  lines=$(grep -c . "$tmp/out.txt")
  if [ $rc -ne 2 ]; then fail "$name" "exit $rc, want 2: $(head -c 300 "$tmp/out.txt")"
  elif [ "$lines" != 1 ] || ! head -1 "$tmp/out.txt" | grep -q "^error: .*$words"; then
    fail "$name" "want one line 'error: ...$words...', got: $(head -c 300 "$tmp/out.txt")"
  elif [ "$(cat "$tmp/existing.nzp")" != "old bytes" ] || ls "$tmp" | grep -q '\.tmp\.'; then
    fail "$name" "the existing output was changed, or a temporary file was left"
  else pass "$name"; fi
}

for s in -0.1 1 1.5 nan inf abc ""; do
  expect_error "sparsity_${s:-empty}" "expected a fraction 0 <= S < 1" \
    $bin/prune --model "$tmp/dense.model" --out "$tmp/existing.nzp" --sparsity "$s"
done
expect_error bad_scope "expected per-matrix or global" \
  $bin/prune --model "$tmp/dense.model" --out "$tmp/existing.nzp" --sparsity 0.5 --scope rows
expect_error bad_method "expected magnitude" \
  $bin/prune --model "$tmp/dense.model" --out "$tmp/existing.nzp" --sparsity 0.5 --method random
expect_error out_is_model "the same file as --model" \
  $bin/prune --model "$tmp/existing.nzp" --out "$tmp/existing.nzp" --sparsity 0.5
expect_error mask_other_shape "expected this run's 3 layers" \
  mpirun -np 1 $bin/stage0_ddp $tiny --layers 3 --prune-mask "$tmp/p.nzp" --save-model "$tmp/existing.nzp"
for st in pipeline infinity zeropp; do
  [ -x $bin/$st ] || continue
  expect_error "mask_refused_$st" "not built for this rung" \
    mpirun -np 2 $bin/$st $tiny --prune-mask "$tmp/p.nzp" --save-model "$tmp/existing.nzp"
done

# a checkpoint of a pruned fine-tuning remembers its mask: resuming without it (or with another)
# is refused unless --resume-changed; a dense checkpoint resumed with a mask is how fine-tuning
# starts (test_prune)
$bin/prune --model "$tmp/dense.model" --out "$tmp/p75.nzp" --sparsity 0.75 >/dev/null 2>&1
mpirun -np 1 $bin/stage0_ddp $tiny --prune-mask "$tmp/p.nzp" --ckpt-dir "$tmp/ck" >/dev/null 2>&1 ||
  fail setup_ckpt "the pruned run with --ckpt-dir failed"
expect_error resume_without_mask "--prune-mask none (was 12288/" \
  mpirun -np 1 $bin/stage0_ddp $tiny --steps 2 --resume "$tmp/ck" --save-model "$tmp/existing.nzp"
expect_error resume_other_mask "expected the same" \
  mpirun -np 1 $bin/stage0_ddp $tiny --steps 2 --resume "$tmp/ck" --prune-mask "$tmp/p75.nzp" \
  --save-model "$tmp/existing.nzp"
if mpirun -np 1 $bin/stage0_ddp $tiny --steps 2 --resume "$tmp/ck" --prune-mask "$tmp/p.nzp" >"$tmp/r.txt" 2>&1
then pass resume_same_mask; else fail resume_same_mask "$(tail -c 300 "$tmp/r.txt")"; fi

# damaged pruned files: craft FILE MODE OUT (the CRC recomputed as the writer would, but for "flip")
craft() {
  python3 - "$@" <<'PY'
import struct, sys
TABLE = []
for i in range(256):
    c = i
    for _ in range(8):
        c = (c >> 1) ^ (0x82F63B78 if c & 1 else 0)
    TABLE.append(c)
def crc32c(data, crc=0xFFFFFFFF):  # CRC-32C (Castagnoli), as tests/lib/craft_files.py
    for b in data:
        crc = TABLE[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF
src, mode, out = sys.argv[1:4]
d = bytearray(open(src, "rb").read())
n, k = struct.unpack_from("<QQ", d, 32)
mask = 48
first_block_matrix_byte = mask + (256 * 32 + 32 * 32 + 64) // 8 + 8  # inside block 0's qkv_w
if mode == "flip":          # one mask bit flipped, the checksum left as it was
    d[first_block_matrix_byte] ^= 1
elif mode == "count":       # one mask bit flipped, the checksum recomputed: the bit count is off
    d[first_block_matrix_byte] ^= 1
elif mode == "unprunable":  # a kept embedding bit swapped with a pruned matrix bit: count unchanged
    d[mask] ^= 1
    byte = first_block_matrix_byte
    while d[byte] == 0xFF: byte += 1
    bit = next(b for b in range(8) if not (d[byte] >> b) & 1)
    d[byte] |= 1 << bit
elif mode == "truncated":
    d = d[:-9]
elif mode == "kept_too_many":  # the header's kept count past the parameter count
    struct.pack_into("<Q", d, 40, n + 1)
if mode not in ("flip", "truncated"):
    struct.pack_into("<I", d, len(d) - 4, crc32c(bytes(d[:-4])))
open(out, "wb").write(d)
PY
}
for m in flip:checksum count:"damaged mask" unprunable:"is marked pruned" truncated:"bytes, expected" \
         kept_too_many:"inconsistent header"; do
  mode=${m%%:*} words=${m#*:}
  craft "$tmp/p.nzp" $mode "$tmp/bad_$mode.nzp" || { fail "damaged_$mode" "could not craft"; continue; }
  expect_error "damaged_${mode}_prune" "$words" \
    $bin/prune --model "$tmp/bad_$mode.nzp" --out "$tmp/existing.nzp" --sparsity 0.5
  expect_error "damaged_${mode}_trainer" "$words" \
    mpirun -np 1 $bin/stage0_ddp $tiny --prune-mask "$tmp/bad_$mode.nzp" --save-model "$tmp/existing.nzp"
done
expect_error damaged_gpt_eval "checksum" $bin/gpt_eval --model "$tmp/bad_flip.nzp" --data data/corpus.txt

# a pruned file is a model to every tool: gpt_eval reads it
if $bin/gpt_eval --model "$tmp/p.nzp" --data data/corpus.txt --windows 2 >"$tmp/e.txt" 2>&1
then pass gpt_eval_reads_pruned
else fail gpt_eval_reads_pruned "$(head -c 300 "$tmp/e.txt")"; fi
