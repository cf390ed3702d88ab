#!/usr/bin/env bash
# Runs every test suite and ends with one line "N passed, N failed, N skipped".
#   build/tests/test_mpi_*   multi-rank: under mpirun with 1, 2, 3 and 4 ranks
#   build/tests/test_*       single-process
#   tests/*/*_check.sh       shell-level checks (command-line errors, tools, notebooks), each
#                            printing NZRESULT lines like the GoogleTest binaries do
# No test can hang: every run has a timeout; a timeout is a failure naming the test each rank
# was in. A run that crashes without reporting is a failure too.
set -u
cd "$(dirname "$0")/.."
export NZ_TIMEOUT=${NZ_TIMEOUT:-600}
pass=0 fail=0 skip=0
failures=()
log_dir=$(mktemp -d /tmp/nanozero-tests.XXXXXX)
# One run cache for every suite (tests/lib/harness.h, run_cached): a reference run that several
# suites ask for with the same flags is computed once. Removed at the end; the logs stay.
export NZ_RUN_CACHE=$log_dir/runs

# Count the NZRESULT lines of one run; remember failures.
tally() {  # $1 = label, $2 = output file, $3 = seconds it took
  local label=$1 out=$2 secs=$3 p f s
  p=$(grep -c '^NZRESULT PASS' "$out")
  f=$(grep -c '^NZRESULT FAIL' "$out")
  s=$(grep -c '^NZRESULT SKIP' "$out")
  pass=$((pass + p)) fail=$((fail + f)) skip=$((skip + s))
  while read -r line; do failures+=("$label: ${line#NZRESULT FAIL }"); done < <(grep '^NZRESULT FAIL' "$out")
  printf '  %-40s %4d passed %4d failed %4d skipped %5ds\n' "$label" "$p" "$f" "$s" "$secs"
}

log_of() { echo "$log_dir/$(echo "$1" | tr ' /=' '___').log"; }

# Runs one suite into its log (and its seconds into the log's .secs); run_one then counts it.
execute() {  # $1 = label, $2 = number of ranks (0: no mpirun), rest = command
  local label=$1 np=$2
  shift 2
  local out
  out=$(log_of "$label")
  local prog="$log_dir/progress.$RANDOM"
  mkdir -p "$prog"
  local rc=0 start=$SECONDS limit=$NZ_TIMEOUT
  # The emulator's suite builds its own tree first (every .cu file for the CPU) beside the other
  # suites: on a busy 2-core machine that alone has taken minutes. Its runs have their own timeouts
  # inside (tests/lib/gtest_run.sh), so a hang still ends there; the outer limit only bounds the whole.
  [ "$label" = emu_check.sh ] && limit=${NZ_TIMEOUT_EMU:-1500}
  if [ "$np" -gt 0 ]; then
    NZ_PROGRESS_DIR=$prog timeout -k 10 "$limit" mpirun -np "$np" "$@" >"$out" 2>&1 || rc=$?
  else
    NZ_PROGRESS_DIR=$prog timeout -k 10 "$limit" "$@" >"$out" 2>&1 || rc=$?
  fi
  if [ $rc = 124 ] || [ $rc = 137 ]; then
    local where=""
    for f in "$prog"/rank.*; do [ -f "$f" ] && where+=" ${f##*/}=$(cat "$f")"; done
    echo "NZRESULT FAIL (timeout after ${limit}s) ranks in:${where:- (no test started)}" >>"$out"
  elif [ $rc != 0 ] && ! grep -q '^NZRESULT FAIL' "$out"; then
    echo "NZRESULT FAIL (exited with code $rc without reporting a failed test; see $out)" >>"$out"
  fi
  echo $((SECONDS - start)) >"$out.secs"
  rm -rf "$prog"
}
run_one() { execute "$@"; tally "$1" "$(log_of "$1")" "$(cat "$(log_of "$1").secs")"; }

# The CUDA emulator's suite (its own build, then CPU-heavy runs without timing-sensitive checks) and
# the notebooks (mostly Python start-up and waiting) run beside the single-process suites, in a second
# lane: on 2 cores that takes minutes off the whole. The timing-sensitive shell checks (watchdogs,
# deadlines) run after both lanes have finished, alone.
side_lane=(cuda/emu_check.sh teaching/notebooks_check.sh)
(for s in "${side_lane[@]}"; do [ -f "tests/$s" ] && execute "${s#*/}" 0 bash "tests/$s"; done) &
side_pid=$!

echo "== single-process suites"
for t in build/tests/test_*; do
  case "$(basename "$t")" in test_mpi_*) continue ;; esac
  [ -x "$t" ] && run_one "$(basename "$t")" 0 "$t"
done
echo "== multi-rank suites (mpirun -np 1..4)"
for t in build/tests/test_mpi_*; do
  [ -x "$t" ] || continue
  for np in 1 2 3 4; do run_one "$(basename "$t") np=$np" "$np" "$t"; done
done
wait "$side_pid"
echo "== shell-level checks"
for s in tests/*/*_check.sh; do
  [ -f "$s" ] || continue
  name=$(basename "$s")
  if [[ " ${side_lane[*]} " == *" ${s#tests/} "* ]]; then  # ran in the second lane: count it here, in order
    tally "$name" "$(log_of "$name")" "$(cat "$(log_of "$name").secs" 2>/dev/null || echo 0)"
  else
    run_one "$name" 0 bash "$s"
  fi
done

rm -rf "$NZ_RUN_CACHE"
if [ ${#failures[@]} -gt 0 ]; then
  echo
  echo "failures (logs in $log_dir):"
  printf '  %s\n' "${failures[@]}"
fi
echo
echo "$pass passed, $fail failed, $skip skipped"
[ "$fail" = 0 ]
