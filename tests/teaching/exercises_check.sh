#!/usr/bin/env bash
# The exercise graders are tested (tests/teaching/exercise_selftest.py): for every exercise of
# scripts/exercises.py the reference solution — the real code of the region — and correct variants
# pass, in fp32, bf16 and fp16; each wrong solution of the catalogue fails with the hint it is
# expected to get; crashes, hangs, build errors and NaN losses become verdicts; each find-the-bug
# copy fails with its first hint only. Also: `make exercise` lists every exercise, writes a learner
# copy that does not compile into a pass by itself, and refuses to overwrite a learner's work.
# Prints NZRESULT lines for tests/run_all.sh.
cd "$(dirname "$0")/../.."
python3 tests/teaching/exercise_selftest.py || echo "NZRESULT FAIL exercise.selftest (tests/teaching/exercise_selftest.py exited $?: see the lines above)"

# the learner's copy: the TODO in place of the region, never a silent overwrite
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
n=$(python3 scripts/exercises.py list | grep -c '^  ')
[ "$n" -ge 12 ] && echo "NZRESULT PASS exercise.list ($n exercises)" || echo "NZRESULT FAIL exercise.list ($n exercises listed)"
copy=exercises/stage1_update_and_gather/train.cpp
if [ -e "$copy" ]; then cp "$copy" "$tmp/saved"; fi
rm -f "$copy"
out=$(python3 scripts/exercises.py make stage1_update_and_gather 2>&1)
if grep -q 'TODO(exercise stage1_update_and_gather)' "$copy" && ! grep -q 'comm.all_gather(my_P(u), P(u)' "$copy"; then
  echo "NZRESULT PASS exercise.make_writes_the_todo_in_place_of_the_region"
else
  echo "NZRESULT FAIL exercise.make_writes_the_todo_in_place_of_the_region: $out"
fi
echo "// my work" >>"$copy"
if ! python3 scripts/exercises.py make stage1_update_and_gather >/dev/null 2>&1 && grep -q '// my work' "$copy"; then
  echo "NZRESULT PASS exercise.make_never_overwrites_a_learners_copy"
else
  echo "NZRESULT FAIL exercise.make_never_overwrites_a_learners_copy"
fi
out=$(python3 scripts/exercises.py check stage1_update_and_gather 2>&1); rc=$?
if [ $rc = 1 ] && grep -q 'FAIL stage1_update_and_gather' <<<"$out"; then
  echo "NZRESULT PASS exercise.the_untouched_todo_does_not_pass"
else
  echo "NZRESULT FAIL exercise.the_untouched_todo_does_not_pass (exit $rc): $out"
fi
rm -f "$copy"
if [ -e "$tmp/saved" ]; then cp "$tmp/saved" "$copy"; fi
out=$(python3 scripts/exercises.py check bug_stage2_a --hint 3 2>&1); rc=$?
[ $rc = 2 ] && [ "$(wc -l <<<"$out")" = 1 ] && grep -q 'HINT=3: no such hint' <<<"$out" &&
  echo "NZRESULT PASS exercise.no_such_hint_is_one_line_exit_2" ||
  echo "NZRESULT FAIL exercise.no_such_hint_is_one_line_exit_2 (exit $rc): $out"
out=$(python3 scripts/exercises.py make no_such_exercise 2>&1); rc=$?
[ $rc = 2 ] && [ "$(wc -l <<<"$out")" = 1 ] && echo "NZRESULT PASS exercise.unknown_name_is_one_line_exit_2" ||
  echo "NZRESULT FAIL exercise.unknown_name_is_one_line_exit_2 (exit $rc): $out"
