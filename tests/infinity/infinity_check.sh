#!/usr/bin/env bash
# infinity's bad input and its disk tier's files: --offload-param given to another trainer, an
# unknown tier, a missing, non-directory, read-only or full --offload-dir: each exits with code 2
# and one line naming the problem, and leaves nothing behind. While a run holds its parameter
# and optimizer files they have no name, so neither SIGTERM nor SIGKILL can leave one behind.
# Prints NZRESULT lines for tests/run_all.sh. The read-only and full cases mount a small tmpfs in
# a private mount namespace (unshare); where that is not allowed they are skipped.
cd "$(dirname "$0")/../.."
bins=${NZ_BIN_DIR:-build/bin}
bin=$bins/infinity
tmp=$(mktemp -d)
trap 'chmod -R u+w "$tmp" 2>/dev/null; rm -rf "$tmp"' EXIT
run="--preset tiny --seq 16 --batch 2 --steps 2 --eval-every 0 --eval-windows 2 --quiet"

source tests/lib/check.sh  # pass, fail, expect_error
check_suite infinity
empty() { [ -z "$(ls -A "$1")" ]; }

expect_one_line() {  # name, expected substring, command...: exit 2 and exactly one line of output
  local name=$1 want=$2 out rc
  shift 2
  out=$("$@" 2>&1)
  rc=$?
  if [ $rc = 2 ] && grep -q -- "$want" <<<"$out" && [ "$(grep -c . <<<"$out")" = 1 ]; then pass "$name"
  else fail "$name" "exit $rc, want 2 and one line with '$want'; got: $out"; fi
}

# another trainer: refused before anything is written (the model file named is left as it was)
echo keep >"$tmp/model.bin"
expect_one_line param_to_stage3 "stage3 does not use it, expected it with build/bin/infinity only" \
  $bins/stage3 $run --offload-param cpu --save-model "$tmp/model.bin"
expect_one_line param_to_offload "offload does not use it" $bins/offload $run --offload-param disk
expect_one_line prefetch_to_offload "expected it with build/bin/stage3 or build/bin/infinity only" \
  $bins/offload $run --prefetch 0
if [ "$(cat "$tmp/model.bin")" = keep ]; then pass refused_run_damages_nothing
else fail refused_run_damages_nothing "the model file was touched"; fi
expect_one_line unknown_tier "--offload-param nvme: valid: cpu, disk" $bin $run --offload-param nvme
expect_one_line offload_to_infinity "infinity does not use it" $bin $run --offload-to disk

touch "$tmp/a_file"
run="$run --offload-param disk"
expect_one_line dir_missing "--offload-dir $tmp/none" $bin $run --offload-dir "$tmp/none"
expect_one_line dir_is_a_file "not a directory" $bin $run --offload-dir "$tmp/a_file"
expect_one_line dir_not_given "--offload-param disk needs --offload-dir" $bin $run

ns=""
if unshare -m true 2>/dev/null; then ns="unshare -m"; elif unshare -rm true 2>/dev/null; then ns="unshare -rm"; fi
mkdir -p "$tmp/ro"
if [ "$(id -u)" != 0 ]; then
  chmod 500 "$tmp/ro"
  expect_one_line dir_not_writable "not writable" $bin $run --offload-dir "$tmp/ro"
elif [ -n "$ns" ]; then
  expect_one_line dir_not_writable "not writable" $ns sh -c \
    "mount -t tmpfs -o ro,size=1m tmpfs '$tmp/ro' && exec $bin $run --offload-dir '$tmp/ro'"
else
  echo "NZRESULT SKIP infinity.dir_not_writable (running as root without unshare: every directory is writable)"
fi

# Full: one rank of the tiny model (seq 16) needs a parameter file of 4 S = 136 kB and three
# optimizer files as large. 100 kB holds not even the parameters; 300 kB holds the parameters and
# the master, not m. Either way: one error line, exit 2, and no file left.
if [ -n "$ns" ]; then
  for c in "100k:the parameter slices" "300k:the optimizer state"; do
    size=${c%%:*} want=${c#*:}
    mkdir -p "$tmp/full$size"
    out=$($ns sh -c "mount -t tmpfs -o size=$size tmpfs '$tmp/full$size' && $bin $run --offload-dir '$tmp/full$size';
                     rc=\$?; echo left: \$(ls -A '$tmp/full$size' | wc -l); exit \$rc" 2>&1)
    rc=$?
    if [ $rc = 2 ] && [ "$(grep -c '^error:' <<<"$out")" = 1 ] && grep -q "cannot reserve .* for $want" <<<"$out" &&
       grep -q "^left: 0" <<<"$out"; then pass "dir_full_$size"
    else fail "dir_full_$size" "exit $rc, want 2, one error line 'cannot reserve ... $want', no files left; got: $out"; fi
  done
else
  echo "NZRESULT SKIP infinity.dir_full (no private mount namespace to mount a small tmpfs in)"
fi

# While it runs: one parameter file and three optimizer files, all without a name.
held_deleted() { ls -l /proc/"$1"/fd 2>/dev/null | grep -c "$2/nanozero-.* (deleted)"; }
for sig in TERM KILL; do
  d="$tmp/sig$sig"
  mkdir -p "$d"
  $bin ${run/--steps 2/--steps 1000000} --offload-dir "$d" >/dev/null 2>&1 &
  pid=$!
  held=0
  for _ in $(seq 300); do held=$(held_deleted $pid "$d"); [ "$held" -ge 4 ] && break; sleep 0.1; done
  names=$(ls -A "$d" | wc -l)
  kill -$sig $pid 2>/dev/null
  wait $pid 2>/dev/null
  if [ "$held" = 4 ] && [ "$names" = 0 ] && empty "$d"; then pass "sig${sig,,}_leaves_no_files"
  else fail "sig${sig,,}_leaves_no_files" "held $held deleted files open (want 4), $names names while running (want 0); after SIG$sig: $(ls -A "$d")"; fi
done
