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
# OpenMP threads that wait sleep instead of spinning: two suites run at once on a machine that may
# have two cores, and the runs are tiny, so a thread spinning for a descheduled partner costs more
# than the work (results do not depend on it; test_stage3 took 82 s and 27 CPU-s spinning, 42 s
# and 20 CPU-s not, on a shared 2-core machine).
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
pass=0 fail=0 skip=0
failures=()
log_dir=$(mktemp -d /tmp/nanozero-tests.XXXXXX)
# One run cache for every suite (tests/lib/harness.h, run_cached): a reference run that several
# suites ask for with the same flags is computed once. Removed at the end; the logs stay.
export NZ_RUN_CACHE=$log_dir/runs

# The counts of one suite's NZRESULT lines, as the line printed when it ends.
counts_line() {  # $1 = label, $2 = output file, $3 = "seconds CPU-seconds" it took
  printf '  %-40s %4d passed %4d failed %4d skipped %5ds %5s CPU-s' "$1" "$(grep -c '^NZRESULT PASS' "$2")" \
    "$(grep -c '^NZRESULT FAIL' "$2")" "$(grep -c '^NZRESULT SKIP' "$2")" $3
}
# The CPU time (user + system, in hundredths of a second) of this shell's finished children so far: bash's `times`, whose
# second line they are. Run in this shell (a subshell's children are its own), into a file.
children_cpu() {  # $1 = file to write the seconds into
  times >"$1.times"
  tail -1 "$1.times" | awk '{ for (i = 1; i <= 2; i++) { split($i, a, "m"); s += a[1] * 60 + a[2] } }
                           END { printf "%d\n", s * 100 }' >"$1"
}
# Add one suite's counts to the totals; remember its failures.
tally() {  # $1 = label, $2 = output file
  local label=$1 out=$2
  pass=$((pass + $(grep -c '^NZRESULT PASS' "$out")))
  fail=$((fail + $(grep -c '^NZRESULT FAIL' "$out")))
  skip=$((skip + $(grep -c '^NZRESULT SKIP' "$out")))
  while read -r line; do failures+=("$label: ${line#NZRESULT FAIL }"); done < <(grep '^NZRESULT FAIL' "$out")
}

log_of() { echo "$log_dir/$(echo "$1" | tr ' /=' '___').log"; }

# Runs one suite into its log (and its seconds and CPU seconds into the log's .secs); tally counts it
# at the end.
execute() {  # $1 = label, $2 = number of ranks (0: no mpirun), rest = command
  local label=$1 np=$2
  shift 2
  local out
  out=$(log_of "$label")
  local prog
  prog=$(mktemp -d "$log_dir/progress.XXXXXX")
  local rc=0 start=$SECONDS limit=$NZ_TIMEOUT cpu0
  children_cpu "$out.cpu" && cpu0=$(cat "$out.cpu")
  # The emulator's suite builds its own tree first (every .cu file for the CPU) beside another
  # suite: on a busy 2-core machine that alone has taken minutes. Its runs have their own timeouts
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
  children_cpu "$out.cpu"
  echo "$((SECONDS - start)) $((($(cat "$out.cpu") - cpu0 + 50) / 100))" >"$out.secs"
  rm -rf "$prog"
}

# The suites run in two lanes on a shared list: each lane takes the next suite nobody has taken
# (mkdir is the atomic claim), so a 2-core machine stays busy until the list is empty. The longest
# suites go first, so that no long one starts last and runs alone: the CUDA emulator's (its own
# build, then CPU-heavy runs), the exercise graders, the pipeline's matrix, the notebooks. The
# timing-sensitive shell checks (killed ranks, watchdogs, files held open while a run is stopped)
# run after both lanes, alone.
longest_first=(tests/cuda/emu_check.sh tests/teaching/student_pack_check.sh tests/teaching/exercises_check.sh build/tests/test_pipeline
               tests/teaching/notebooks_check.sh build/tests/test_checkpoint build/tests/test_stage3)
alone=(tests/checkpoint/fault_check.sh tests/checkpoint/signal_check.sh tests/cuda/gpu_report_check.sh tests/infinity/infinity_check.sh
       tests/stages/offload_check.sh)
labels=() nps=() cmds=()  # the shared list, in order; a command is one string of words without spaces inside
add() { labels+=("$1"); nps+=("$2"); cmds+=("$3"); }
add_path() {  # a test program (under mpirun with 1..4 ranks when multi-rank) or a shell check
  local p=$1 name np
  name=$(basename "$p")
  case "$p" in
    build/tests/test_mpi_*) [ -x "$p" ] && for np in 1 2 3 4; do add "$name np=$np" "$np" "$p"; done ;;
    build/tests/*) [ -x "$p" ] && add "$name" 0 "$p" ;;
    *) [ -f "$p" ] && add "$name" 0 "bash $p" ;;
  esac
}
in_list() { local x=$1; shift; [[ " $* " == *" $x "* ]]; }
for p in "${longest_first[@]}"; do add_path "$p"; done
for p in build/tests/test_* tests/*/*_check.sh; do
  in_list "$p" "${longest_first[@]}" "${alone[@]}" || add_path "$p"
done
n_shared=${#labels[@]}
for p in "${alone[@]}"; do add_path "$p"; done

# One lane: claim, run, print the suite's line (the counts are added up at the end, in list order).
lane() {
  local i
  for ((i = 0; i < n_shared; i++)); do
    mkdir "$log_dir/claim.$i" 2>/dev/null || continue
    # shellcheck disable=SC2086  # a command is words
    execute "${labels[$i]}" "${nps[$i]}" ${cmds[$i]}
    line "${labels[$i]}"
  done
}
line() { local out; out=$(log_of "$1"); printf '%s\n' "$(counts_line "$1" "$out" "$(cat "$out.secs")")"; }

suites_start=$SECONDS
echo "== $n_shared suites in two lanes, the longest first"
# both lanes in subshells: each one's `times` then counts only its own suites
lane &
lane_a=$!
lane &
lane_b=$!
wait "$lane_a" "$lane_b"
echo "== timing-sensitive checks, alone"
for ((i = n_shared; i < ${#labels[@]}; i++)); do
  # shellcheck disable=SC2086
  execute "${labels[$i]}" "${nps[$i]}" ${cmds[$i]}
  line "${labels[$i]}"
done
cpu_total=0
for ((i = 0; i < ${#labels[@]}; i++)); do
  tally "${labels[$i]}" "$(log_of "${labels[$i]}")"
  read -r _ c <"$(log_of "${labels[$i]}").secs" && cpu_total=$((cpu_total + c))
done

rm -rf "$NZ_RUN_CACHE"
if [ ${#failures[@]} -gt 0 ]; then
  echo
  echo "failures (logs in $log_dir):"
  printf '  %s\n' "${failures[@]}"
fi
echo
echo "the suites: $((SECONDS - suites_start)) s, $cpu_total CPU-s"
echo "$pass passed, $fail failed, $skip skipped"
[ "$fail" = 0 ]
