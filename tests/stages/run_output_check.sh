#!/usr/bin/env bash
# run_output_check.sh — what a training run prints, beyond its numbers (issue 29), on the CPU:
#   1. NZ_PROFILE=1: one "profile:" line after "done:" and a "profile" key in --log-json, the parts
#      each >= 0, attention within its phase, the parts adding up to the step, and the same losses
#      as without NZ_PROFILE (tests/lib/check_profile.py): stage0_ddp on one rank (6 steps: the
#      first two are warm-up) and stage3 on two ranks (4 steps, all timed; its collectives > 0);
#   2. stdout is line-buffered: a run killed right after "done:" (by the file-size limit, SIGXFSZ,
#      while it writes its model file) still has its "done:" line in the file its stdout went to;
#      with stdio's default full buffering of a file that line was lost.
# Prints NZRESULT lines for tests/run_all.sh; about 6 s of CPU.
cd "$(dirname "$0")/../.." || exit 1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
bin=${NZ_BIN_DIR:-build/bin}
tiny="--preset tiny --seq 16 --batch 2 --eval-every 0 --eval-windows 2"

# 1. the profile, and the same bits without it
NZ_PROFILE=1 $bin/stage0_ddp $tiny --steps 6 --log-json "$tmp/p1.json" >"$tmp/p1.log" 2>&1
$bin/stage0_ddp $tiny --steps 6 --log-json "$tmp/q1.json" >"$tmp/q1.log" 2>&1
python3 tests/lib/check_profile.py profile.stage0_ddp host "3-6 of 6" "$tmp/p1.log" "$tmp/p1.json" "$tmp/q1.log" "$tmp/q1.json"
NZ_PROFILE=1 mpirun -np 2 $bin/stage3 $tiny --steps 4 --log-json "$tmp/p3.json" >"$tmp/p3.log" 2>&1
mpirun -np 2 $bin/stage3 $tiny --steps 4 --log-json "$tmp/q3.json" >"$tmp/q3.log" 2>&1
python3 tests/lib/check_profile.py profile.stage3 host "1-4 of 4" "$tmp/p3.log" "$tmp/p3.json" "$tmp/q3.log" "$tmp/q3.json" \
  --collectives

# 2. line-buffered stdout: 64 KiB of file per process (ulimit -f counts 512-byte blocks) is more than
#    the log and less than the tiny model's file, whose writing then kills the run (SIGXFSZ) after
#    "done:" and before anything flushes stdout again
rc=0
(ulimit -f 128; exec $bin/stage0_ddp $tiny --steps 1 --save-model "$tmp/model.bin") >"$tmp/killed.log" 2>&1 || rc=$?
if [ $rc -gt 128 ] && grep -q '^done: 1 steps' "$tmp/killed.log"; then
  echo "NZRESULT PASS output.line_buffered (killed by signal $((rc - 128)) while writing its model; the done: line is in the file)"
else
  echo "NZRESULT FAIL output.line_buffered (exit $rc; expected a run killed by SIGXFSZ with its done: line in the file: $(tail -c 300 "$tmp/killed.log"))"
fi
