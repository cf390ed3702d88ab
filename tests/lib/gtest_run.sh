# gtest_run.sh — sourced by tests/cuda/gpu_check.sh and tests/cuda/emu_check.sh (not a check itself).
#   run_gtest PREFIX LABEL LOGDIR TIMEOUT COMMAND...
# Runs one GoogleTest binary (tests/lib/gtest_mpi_main.cpp prints an NZRESULT line per test) under a
# timeout, output in LOGDIR/LABEL.log, and prints its PASS and FAIL lines renamed
# PREFIX.LABEL.<test>, plus one FAIL line of its own when the run exited non-zero without a failed
# test (a crash, a timeout, an emulator stop: its nz_emu lines are shown) or ran no test at all.
# Sets n_pass, n_fail (that extra FAIL included) and n_skip.
run_gtest() {
  local prefix=$1 label=$2 out="$3/$2.log" limit=$4 rc=0
  shift 4
  timeout -k 10 "$limit" "$@" >"$out" 2>&1 || rc=$?
  n_pass=$(grep -c '^NZRESULT PASS' "$out")
  n_fail=$(grep -c '^NZRESULT FAIL' "$out")
  n_skip=$(grep -c '^NZRESULT SKIP' "$out")
  grep -E '^NZRESULT (PASS|FAIL)' "$out" | sed -E "s/^NZRESULT (PASS|FAIL) /NZRESULT \1 $prefix.$label./"
  if [ $rc != 0 ] && [ "$n_fail" = 0 ]; then
    echo "NZRESULT FAIL $prefix.$label (exit code $rc without a failed test; see $out)"
    grep '^nz_emu: ' "$out" | head -3
    n_fail=1
  elif [ "$n_pass" = 0 ]; then
    echo "NZRESULT FAIL $prefix.$label (no test ran ($n_skip skipped); see $out)"
    n_fail=1
  fi
}
