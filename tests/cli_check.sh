#!/usr/bin/env bash
# Bad input: every case must exit with code 2 and print one line naming the problem, before any
# work is done; good input must not. Prints NZRESULT lines for tests/run_all.sh.
cd "$(dirname "$0")/.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
printf 'too short' >"$tmp/short.txt"
head -c 100 /dev/urandom >"$tmp/bad.model"
bin=build/bin/stage0_ddp

expect_error() {  # name, expected substring, command...
  local name=$1 want=$2
  shift 2
  local out rc
  out=$("$@" 2>&1)
  rc=$?
  if [ $rc = 2 ] && grep -q -- "$want" <<<"$out" && [ "$(grep -c . <<<"$out")" = 1 ]; then
    echo "NZRESULT PASS cli.$name"
  else
    echo "NZRESULT FAIL cli.$name (exit $rc, want 2 and one line with '$want'; got: $out)"
  fi
}

expect_error heads_not_dividing "--heads 5" $bin --preset tiny --heads 5
expect_error seq_too_long "longer than the model's context" $bin --preset tiny --seq 1000
expect_error zero_batch "--batch 0" $bin --batch 0
expect_error negative_steps "--steps -3" $bin --steps -3
expect_error not_a_number "--lr abc" $bin --lr abc
expect_error unknown_preset "unknown preset" $bin --preset huge
expect_error unknown_precision "unknown precision" $bin --precision fp8
expect_error unknown_flag "unknown flag --bogus" $bin --bogus 1
expect_error missing_data "cannot read" $bin --data /nonexistent/file.txt
expect_error short_data "shorter than one batch" $bin --preset tiny --seq 16 --data "$tmp/short.txt"
expect_error missing_value "needs a value" $bin --steps
expect_error unknown_device "unknown device" $bin --device tpu
expect_error eval_bad_model "not a nanoZeRO model file" build/bin/gpt_eval --model "$tmp/bad.model" --data data/corpus.txt
expect_error eval_missing_model "cannot open" build/bin/gpt_eval --model "$tmp/none.model" --data data/corpus.txt
expect_error sample_no_model "--model PATH is required" build/bin/gpt_sample --prompt hi

# A truncated model file: clear error, and the good file next to it is untouched.
mpirun -np 1 $bin --preset tiny --seq 16 --steps 1 --quiet --eval-windows 2 --save-model "$tmp/good.model" >/dev/null 2>&1
head -c 200 "$tmp/good.model" >"$tmp/cut.model"
expect_error eval_truncated_model "truncated" build/bin/gpt_eval --model "$tmp/cut.model" --data data/corpus.txt
sum_before=$(md5sum <"$tmp/good.model")
expect_error save_unwritable "cannot write" $bin --preset tiny --seq 16 --steps 1 --quiet --eval-windows 2 --save-model /nonexistent/dir/m.model
if [ "$sum_before" = "$(md5sum <"$tmp/good.model")" ]; then echo "NZRESULT PASS cli.good_model_untouched"; else echo "NZRESULT FAIL cli.good_model_untouched"; fi

# --help lists every flag the issues rely on.
help=$($bin --help)
missing=""
for f in --preset --layers --dim --heads --batch --seq --accum --steps --lr --warmup --weight-decay --clip \
         --seed --precision --data --log-json --eval-every --save-model --device; do
  grep -q -- "$f" <<<"$help" || missing+=" $f"
done
if [ -z "$missing" ]; then echo "NZRESULT PASS cli.help_lists_flags"; else echo "NZRESULT FAIL cli.help_lists_flags (missing:$missing)"; fi
