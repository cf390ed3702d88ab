#!/usr/bin/env bash
# Signals to a running job (timing-sensitive: tests/run_all.sh runs this alone, after both lanes):
#   - the watchdog under its pulse's 3 s: a rank stopped with SIGSTOP is named, whichever it is
#     (rank 0, which would otherwise print the line, and the last rank of a pipeline, whose segments
#     do different work), within max(--watchdog, 3) + 1 s and the machine's slack;
#   - SIGTERM to scripts/train_resilient.sh ends the job it runs (mpirun and every rank), releases
#     the checkpoint directory's lock, and is not relaunched.
# Prints NZRESULT lines for tests/run_all.sh.
cd "$(dirname "$0")/../.."
bin=${NZ_BIN_DIR:-build/bin}
tmp=$(mktemp -d)
source tests/lib/job.sh    # rank_pid, wait_for_checkpoint
source tests/lib/check.sh  # pass, fail
check_suite signal
leftover=()  # pids to end on the way out, whatever happened
trap 'for p in "${leftover[@]}"; do kill -9 "$p" 2>/dev/null; done; rm -rf "$tmp"' EXIT

seconds_since() { python3 -c "import sys; print(f'{$(date +%s.%N) - $1:.1f}')"; }
at_most() { python3 -c "import sys; sys.exit(0 if $1 <= $2 else 1)"; }

# ---- the watchdog names the stopped rank, with --watchdog 1 (under the pulse's 3 s) ----
# name, ranks, the rank to stop, program, its flags
stop_rank() {
  local name=$1 np=$2 victim=$3 prog=$4
  shift 4
  local marker="$tmp/$name"
  mpirun -np "$np" $bin/$prog --preset tiny --seq 16 --batch 2 --eval-every 0 --quiet --steps 100000000 \
    --watchdog 1 --ckpt-dir "$marker" --ckpt-every 20 "$@" >"$tmp/$name.log" 2>&1 &
  local job=$! stopped="" t_stop
  leftover+=("$job")
  if wait_for_checkpoint "$marker" 20 2400; then
    local pid
    pid=$(rank_pid "$marker" "$victim" "$prog")
    [ -n "$pid" ] && kill -STOP "$pid" && stopped=$pid && t_stop=$(date +%s.%N) && leftover+=("$pid")
  fi
  for _ in $(seq 300); do kill -0 $job 2>/dev/null || break; sleep 0.1; done
  kill -0 $job 2>/dev/null && kill -9 $job
  wait $job
  local rc=$? took
  [ -n "$stopped" ] && kill -9 "$stopped" 2>/dev/null
  took=$(seconds_since "${t_stop:-0}")
  local lines
  lines=$(grep -c "watchdog:" "$tmp/$name.log")
  # max(1, 3) + 1 s, and 3 s of slack for a busy machine and mpirun's clean-up
  if [ -n "$stopped" ] && [ $rc != 0 ] && [ "$lines" = 1 ] &&
     grep -q "^error: watchdog: rank $victim stopped responding" "$tmp/$name.log" && at_most "$took" 7; then
    pass "$name (ended ${took} s after SIGSTOP, --watchdog 1)"
  else fail "$name" "stopped '$stopped', exit $rc, ${took} s, $lines watchdog lines; log: $(grep -v '^step\|^rank\|^ ' "$tmp/$name.log" | tail -3)"; fi
}
stop_rank watchdog_names_stopped_rank_0_stage2 2 0 stage2
stop_rank watchdog_names_stopped_rank_3_pipeline 4 3 pipeline --pipeline 2
stop_rank watchdog_names_stopped_rank_0_pipeline 4 0 pipeline --pipeline 2

# ---- SIGTERM to the wrapper: the job ends with it, and the checkpoint directory is free ----
ck="$tmp/term_ckpt"
scripts/train_resilient.sh --restarts 2 -- mpirun -np 2 $bin/stage2 --preset tiny --seq 16 --batch 2 --eval-every 0 \
  --quiet --steps 100000000 --ckpt-dir "$ck" --ckpt-every 20 >"$tmp/term.log" 2>&1 &
wrapper=$!
leftover+=("$wrapper")
ranks_before=""
if wait_for_checkpoint "$ck" 20 2400; then
  ranks_before="$(rank_pid "$ck" 0 stage2) $(rank_pid "$ck" 1 stage2)"
  kill -TERM $wrapper
fi
for _ in $(seq 100); do kill -0 $wrapper 2>/dev/null || break; sleep 0.1; done
wait $wrapper 2>/dev/null
rc=$?
left=""
for _ in $(seq 50); do  # mpirun's clean-up may take a moment after the wrapper has gone
  left=$(pgrep -f -- "$ck" | tr '\n' ' ')
  [ -z "$left" ] && break
  sleep 0.1
done
if [ -z "$left" ] && flock -n "$ck/LOCK" true; then lock=free; else lock=held; fi
for p in $left; do kill -9 "$p" 2>/dev/null; done
if [ -n "${ranks_before// /}" ] && [ $rc = 143 ] && [ -z "$left" ] && [ $lock = free ] && ! grep -q relaunching "$tmp/term.log"
then pass "resilient_sigterm_ends_the_job (ranks $ranks_before gone, lock free, exit 143)"
else fail resilient_sigterm_ends_the_job "ranks before: '$ranks_before', exit $rc, left running: '$left', lock $lock; log: $(tail -3 "$tmp/term.log")"; fi
