#!/usr/bin/env bash
# The lessons stay focused: `make diff A=stage0_ddp B=stage1`, `stage1 stage2`, `stage2 stage3` and
# `stage2 offload` are what a learner reads, so each must be small (under MAX changed lines, as git counts:
# lines added plus lines removed), must change something, must not hide a whole file behind
# "Only in", and every hunk that adds code must say, in a comment, which idea it implements.
# Prints NZRESULT lines for tests/run_all.sh.
cd "$(dirname "$0")/.."

check_lesson() {  # A B MAX
  local a=$1 b=$2 MAX=$3 name="diff.$1_to_$2" out changed only uncommented
  out=$(make -s --no-print-directory diff A="$a" B="$b" 2>&1)
  changed=$(grep -v '^\(---\|+++\) ' <<<"$out" | grep -c '^[-+]')
  only=$(grep -c '^Only in' <<<"$out")
  if [ "$changed" -gt 0 ] && [ "$changed" -lt $MAX ] && [ "$only" = 0 ]; then
    echo "NZRESULT PASS $name.small ($changed changed lines)"
  else
    echo "NZRESULT FAIL $name.small ($changed changed lines, want 1..$((MAX - 1)); $only files only on one side)"
  fi
  # Hunks (@@ ... @@) that add code with no comment saying why: neither among the added lines nor
  # on the unchanged line just above a change. The stage's name tag (Stage::Z1) needs none.
  uncommented=$(awk '
    function close_hunk() { if (real && !commented) n++; real = 0; commented = 0; above = "" }
    /^@@/ { close_hunk(); next }
    /^(\+\+\+|---) / { next }
    /^ / { above = $0; next }
    /^[-+]/ {
      if (above ~ /^ [ \t]*\/\//) commented = 1
      above = ""
      if (/^\+/ && index($0, "//")) commented = 1
      if (/^\+/ && $0 !~ /Trainer run\(argc, argv, Stage::/) real = 1
    }
    END { close_hunk(); print n + 0 }' <<<"$out")
  if [ "$uncommented" = 0 ]; then
    echo "NZRESULT PASS $name.commented"
  else
    echo "NZRESULT FAIL $name.commented ($uncommented hunks add code without a comment naming the idea)"
  fi
}

# Limits: 60 changed lines for the one-buffer lessons; stage3's gather/release dance needs more.
check_lesson stage0_ddp stage1 60
check_lesson stage1 stage2 60
check_lesson stage2 stage3 100
check_lesson stage2 offload 60
