#!/usr/bin/env bash
# The lessons stay focused: `make diff A=stage0_ddp B=stage1`, `stage1 stage2`, `stage2 stage3` and
# `stage2 offload` are what a learner reads, so each train.cpp diff must be small (under MAX changed
# lines, as git counts: lines added plus lines removed), must change something, must not hide a whole
# file behind "Only in", and every hunk that adds code must say, in a comment, which idea it
# implements. The rung's own files are listed after it, each by its purpose line (checked below).
# Prints NZRESULT lines for tests/run_all.sh.
cd "$(dirname "$0")/../.."

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
# the pipeline is a rung beside the ladder: split the layers instead of the batch (marked blocks:
# the split, ZeRO-1 inside the replicas, the tied weight, the sends), and the schedule's loop
check_lesson stage0_ddp pipeline 220
# infinity is stage3 with its slices off the device: the copies up and down, the host optimizer
check_lesson stage3 infinity 100
# ZeRO++ beside stage3: three marked blocks (qwZ, hpZ, qgZ), each a switch; qgZ's block holds both
# of its reductions, the flat all-to-all and the paper's two hops (about 45 lines of the 180)
check_lesson stage3 zeropp 180
# tensor parallelism beside stage0_ddp: the split and ZeRO-1 (marked), my pieces' state, the norm over
# pieces and replicated tensors (the Trainer's hooks are in tensor/hooks.cpp)
check_lesson stage0_ddp tensor 130
# Ulysses beside stage3: the split into sequence groups, the two all-to-alls written out, a block's
# forward and backward in three calls between them, the validation forward and the memory hooks;
# on the GPU the same moves as two block swaps around each all-to-all (about 20 lines, after the
# exercise region so that the loops stay the lesson)
check_lesson stage3 ulysses 222

# A rung is a folder: beside its train.cpp, the files only it uses (make diff lists them under the
# train.cpp diff). Each opens with its purpose in one line, `// NAME — what it is for`, which the
# listing shows, so it must be whole in that line (a sentence ending in a full stop) and fit 99
# columns.
purpose=$(for d in $(sed -n 's/^+*\([a-z][a-z0-9_]*\).*/\1/p' stages.txt); do
  for f in "$d"/*; do
    n=${f##*/}
    [ -f "$f" ] && [ "$n" != train.cpp ] || continue
    first=$(head -n 1 "$f")
    if ! grep -qE "^// ${n//./\\.} — .+\.\$" <<<"$first" || [ ${#first} -gt 99 ]; then
      printf '%s: "%s"; ' "$f" "$first"
    fi
  done
done)
if [ -z "$purpose" ]; then
  echo "NZRESULT PASS diff.rung_files_say_their_purpose"
else
  echo "NZRESULT FAIL diff.rung_files_say_their_purpose (want a first line '// NAME — purpose.' of <= 99 columns: $purpose)"
fi

# Readable on a projector: every line of the five trainers fits 99 columns, so every line of a diff
# between two of them (one more, for the +/-/space) fits 100. The trainers mirror each other, so
# they are wrapped alike and a neighbour diff shows the idea, not the wrapping.
wide=$(python3 - stage0_ddp/train.cpp stage1/train.cpp stage2/train.cpp stage3/train.cpp offload/train.cpp \
  pipeline/train.cpp infinity/train.cpp zeropp/train.cpp tensor/train.cpp ulysses/train.cpp <<'PY'
import sys
for f in sys.argv[1:]:
    for n, line in enumerate(open(f, encoding="utf-8"), 1):
        if len(line.rstrip("\n")) > 99:
            print(f"{f}:{n} ({len(line.rstrip(chr(10)))} columns)", end="; ")
PY
)
[ -z "$wide" ]; res_line=$?
if [ $res_line = 0 ]; then echo "NZRESULT PASS diff.trainers_fit_99_columns"; else echo "NZRESULT FAIL diff.trainers_fit_99_columns ($wide)"; fi

# Colour, and no exercise markers: COLOR=always colours the changed lines and, colours taken out,
# is the plain diff (headers aside: they carry the copies' times); a pipe (COLOR=auto, as here) gets
# no colour; WORDS=1 marks the changed words, in colour with COLOR=always, [-so-]{+so+} in a pipe; no
# output ever shows a `// begin exercise:` or `// end
# exercise:` line; every lesson fits 100 columns; a wrong COLOR is one line, exit 2.
strip_headers() { grep -v '^\(---\|+++\|diff\) '; }
no_colour() { sed 's/\x1b\[[0-9;]*m//g'; }
for pair in "stage0_ddp stage1" "stage1 stage2" "stage2 stage3" "stage2 offload"; do
  set -- $pair
  name="diff.$1_to_$2"
  plain=$(make -s --no-print-directory diff A="$1" B="$2" 2>&1)
  colour=$(make -s --no-print-directory diff A="$1" B="$2" COLOR=always 2>&1)
  words=$(make -s --no-print-directory diff A="$1" B="$2" WORDS=1 COLOR=always 2>&1)
  words_plain=$(make -s --no-print-directory diff A="$1" B="$2" WORDS=1 2>&1)
  bad=""
  grep -q $'\x1b\\[' <<<"$plain" && bad+="colour in a pipe; "
  grep -q $'^\x1b\\[[0-9;]*m+' <<<"$colour" || bad+="no coloured + line with COLOR=always; "
  [ "$(no_colour <<<"$colour" | strip_headers)" = "$(strip_headers <<<"$plain")" ] || bad+="COLOR=always is not the plain diff in colour; "
  grep -q $'\x1b\\[' <<<"$words" || bad+="no colour with WORDS=1 COLOR=always; "
  { grep -q '\[-.*-\]\|{+.*+}' <<<"$words_plain" && ! grep -q $'\x1b\\[' <<<"$words_plain"; } || bad+="WORDS=1 in a pipe: no [-...-]{+...+}, or colour; "
  for out in "$plain" "$colour" "$words" "$words_plain"; do
    grep -q '// \(begin\|end\) exercise: ' <<<"$out" && { bad+="an exercise marker is shown; "; break; }
  done
  w=$(strip_headers <<<"$plain" | python3 -c 'import sys; print(max(len(l.rstrip("\n")) for l in sys.stdin))')
  [ "$w" -le 100 ] || bad+="$w columns wide; "
  if [ -z "$bad" ]; then echo "NZRESULT PASS $name.colour_without_markers ($w columns)"; else echo "NZRESULT FAIL $name.colour_without_markers ($bad)"; fi
done
out=$(COLOR=blue bash scripts/lesson_diff.sh stage1 stage2 2>&1); rc=$?
if [ $rc = 2 ] && [ "$(wc -l <<<"$out")" = 1 ] && grep -q '^error: COLOR=blue' <<<"$out"; then
  echo "NZRESULT PASS diff.wrong_colour_is_one_line_exit_2"
else
  echo "NZRESULT FAIL diff.wrong_colour_is_one_line_exit_2 (exit $rc: $out)"
fi
