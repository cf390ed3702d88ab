#!/usr/bin/env bash
# offload's disk tier and bad --offload-dir values: every bad directory exits with code 2 and one
# line naming the problem (missing, not a directory, not writable: before anything else is
# printed; full: when the files are made); no run, clean, failed or interrupted, leaves a file in
# the directory. Prints NZRESULT lines for tests/run_all.sh. The not-writable and full cases mount
# a small tmpfs in a private mount namespace (unshare); where that is not allowed they are skipped.
cd "$(dirname "$0")/../.."
bin=${NZ_BIN_DIR:-build/bin}/offload
tmp=$(mktemp -d)
trap 'chmod -R u+w "$tmp" 2>/dev/null; rm -rf "$tmp"' EXIT
run="--preset tiny --seq 16 --batch 2 --steps 2 --eval-every 0 --eval-windows 2 --quiet --offload-to disk"

source tests/lib/check.sh  # pass, fail, expect_error
check_suite offload
empty() { [ -z "$(ls -A "$1")" ]; }

expect_one_line() {  # name, expected substring, command...: exit 2 and exactly one line of output
  local name=$1 want=$2 out rc
  shift 2
  out=$("$@" 2>&1)
  rc=$?
  if [ $rc = 2 ] && grep -q -- "$want" <<<"$out" && [ "$(grep -c . <<<"$out")" = 1 ]; then pass "$name"
  else fail "$name" "exit $rc, want 2 and one line with '$want'; got: $out"; fi
}

touch "$tmp/a_file"
expect_one_line dir_missing "--offload-dir $tmp/none" $bin $run --offload-dir "$tmp/none"
expect_one_line dir_is_a_file "not a directory" $bin $run --offload-dir "$tmp/a_file"
expect_one_line dir_not_given "needs --offload-dir" $bin $run

# A private mount namespace, where this script may mount a tmpfs: as root directly, otherwise as
# root of a user namespace.
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
  echo "NZRESULT SKIP offload.dir_not_writable (running as root without unshare: every directory is writable)"
fi

# Full: the tiny model needs 3 files of 4 S = 139 kB on one rank; 300 kB holds two of them. The
# error comes after the start-up lines, so count the error lines; the two files made are removed.
if [ -n "$ns" ]; then
  mkdir -p "$tmp/full"
  out=$($ns sh -c "mount -t tmpfs -o size=300k tmpfs '$tmp/full' && $bin $run --offload-dir '$tmp/full';
                   rc=\$?; echo left: \$(ls -A '$tmp/full' | wc -l); exit \$rc" 2>&1)
  rc=$?
  if [ $rc = 2 ] && [ "$(grep -c '^error:' <<<"$out")" = 1 ] && grep -q "cannot reserve" <<<"$out" &&
     grep -q "^left: 0" <<<"$out"; then pass dir_full
  else fail dir_full "exit $rc, want 2, one error line 'cannot reserve', no files left; got: $out"; fi
else
  echo "NZRESULT SKIP offload.dir_full (no private mount namespace to mount a small tmpfs in)"
fi

# A clean run on 2 ranks: three files per rank while it runs, none after.
mkdir -p "$tmp/clean"
if mpirun -np 2 $bin $run --offload-dir "$tmp/clean" >"$tmp/clean.log" 2>&1 && empty "$tmp/clean"; then pass clean_run_leaves_no_files
else fail clean_run_leaves_no_files "exit or files left: $(ls -A "$tmp/clean") $(tail -3 "$tmp/clean.log")"; fi

# While it runs the three files per rank have no name (unlinked right after they are created and
# reserved): the directory looks empty, and the process holds three deleted files open. So no way
# of ending it, SIGTERM or SIGKILL, can leave a file behind.
held_deleted() { ls -l /proc/"$1"/fd 2>/dev/null | grep -c "$2/nanozero-offload-.* (deleted)"; }
for sig in TERM KILL; do
  d="$tmp/sig$sig"
  mkdir -p "$d"
  $bin ${run/--steps 2/--steps 1000000} --offload-dir "$d" >/dev/null 2>&1 &
  pid=$!
  held=0
  for _ in $(seq 300); do held=$(held_deleted $pid "$d"); [ "$held" -ge 3 ] && break; sleep 0.1; done
  names=$(ls -A "$d" | wc -l)
  kill -$sig $pid 2>/dev/null
  wait $pid 2>/dev/null
  if [ "$held" = 3 ] && [ "$names" = 0 ] && empty "$d"; then pass "sig${sig,,}_leaves_no_files"
  else fail "sig${sig,,}_leaves_no_files" "held $held deleted files open (want 3), $names names while running (want 0); after SIG$sig: $(ls -A "$d")"; fi
done
