#!/usr/bin/env bash
# harness_check.sh — the MPI test harness (tests/lib/gtest_mpi_main.cpp) gives a verdict only for tests
# that ran: --gtest_list_tests lists the names and prints no NZRESULT line (it used to print PASS for
# every test, though none ran), and a run prints one verdict per test.
# Prints NZRESULT lines for tests/run_all.sh.
cd "$(dirname "$0")/../.."
bin=build/tests/test_mpi_comm
[ -x "$bin" ] || { echo "NZRESULT FAIL harness.built ($bin not built: make tests)"; exit 0; }
# the names from one rank: two ranks print their lists at once, and their lines can interleave
# (a name glued to another's, a count off by one)
listed=$(timeout 60 mpirun -np 1 "$bin" --gtest_list_tests 2>&1)
names=$(grep '^  [A-Za-z]' <<< "$listed" | sort -u | wc -l)
verdicts=$(grep -c '^NZRESULT' <<< "$listed")
if [ "$names" -gt 0 ] && [ "$verdicts" = 0 ]; then
  echo "NZRESULT PASS harness.listing_gives_no_verdict ($names tests listed, no NZRESULT line)"
else
  echo "NZRESULT FAIL harness.listing_gives_no_verdict ($names tests listed, $verdicts NZRESULT lines)"
fi
ran=$(timeout 120 mpirun -np 2 "$bin" 2>&1 | grep -c '^NZRESULT PASS')
if [ "$ran" = "$names" ]; then
  echo "NZRESULT PASS harness.a_run_gives_one_verdict_per_test ($ran of $names)"
else
  echo "NZRESULT FAIL harness.a_run_gives_one_verdict_per_test ($ran PASS lines for $names tests)"
fi
