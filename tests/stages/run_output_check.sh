#!/usr/bin/env bash
# run_output_check.sh — what a training run prints, beyond its numbers (issue 29), on the CPU:
#   1. NZ_PROFILE=1: one "profile:" line after "done:" and a "profile" key in --log-json, the parts
#      each >= 0, attention within its phase, the parts adding up to the step, and the same losses
#      as without NZ_PROFILE (tests/lib/check_profile.py): stage0_ddp on one rank (6 steps: the
#      first two are warm-up) and stage3 on two ranks (4 steps, all timed; its collectives > 0);
#   2. every program's stdout is line-buffered and its stderr unbuffered from the start, with stdout
#      going to a file (stdio would buffer it fully: a run killed at a time limit loses its last lines).
# Prints NZRESULT lines for tests/run_all.sh; about 2 s of CPU.
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

# 2. every program in the bin folder (trainers, tools, inference), its stdout going to a file: line-
#    buffered, and stderr unbuffered, when main starts (tests/lib/at_main.c, preloaded, stops it there).
#    Without the start-up code in check.cpp stdout to a file is fully buffered.
if ! ${CC:-cc} -shared -fPIC -o "$tmp/at_main.so" tests/lib/at_main.c -ldl 2>"$tmp/cc.log"; then
  echo "NZRESULT FAIL output.line_buffered (cannot build tests/lib/at_main.c: $(head -c 300 "$tmp/cc.log"))"
  exit 0
fi
checked=0 bad=""
for p in "$bin"/*; do
  [ -f "$p" ] && [ -x "$p" ] || continue
  LD_PRELOAD="$tmp/at_main.so" "$p" >"$tmp/stdout.txt" 2>"$tmp/mode.txt"
  checked=$((checked + 1))
  grep -q '^stdout at main: line-buffered$' "$tmp/mode.txt" && grep -q '^stderr at main: unbuffered$' "$tmp/mode.txt" ||
    bad="$bad $(basename "$p") ($(tr '\n' ' ' <"$tmp/mode.txt"))"
done
if [ $checked -gt 0 ] && [ -z "$bad" ]; then
  echo "NZRESULT PASS output.line_buffered ($checked programs: stdout line-buffered, stderr unbuffered at main)"
else
  echo "NZRESULT FAIL output.line_buffered ($checked programs checked; not so:${bad:- none found in $bin})"
fi
