#!/usr/bin/env bash
# make grade (scripts/exercises.py grade): a folder of submissions, DIR/<student-id>/<exercise>.cpp,
# graded on the public runs and the hidden ones (scripts/exercise_hidden.py). Two students on
# pipeline_1f1b: the real region passes every run; a warm-up capped at max(K, 2) instead of K passes
# every public run (K >= 2 there) and fails the hidden K = 1 < P - 1. One line per student and
# exercise, a CSV table, HINTS=0 (--no-hints) shows no hint. Bad input (an OUT that is not empty, a
# missing or extra file, a file that does not compile, a student id with a space or a path
# character): one line, exit 2, nothing written. Prints NZRESULT lines for tests/run_all.sh.
cd "$(dirname "$0")/../.."
tmp=$(mktemp -d /tmp/nanozero-grade.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
subs=$tmp/subs
python3 - "$subs" <<'PY'
import os, sys
sys.path.insert(0, "scripts")
import exercises as X
subs = sys.argv[1]
ex = X.BY_NAME["pipeline_1f1b"]
real = "\n".join(X.region_body(open(ex.path).read(), ex.name))
late = X.edited(real, [("std::min(P - s - 1, K)", "std::min(P - s - 1, std::max(K, 2))")], "grade_check")
for sid, body in (("alice", real), ("bob.2", late)):
    os.makedirs(os.path.join(subs, sid))
    open(os.path.join(subs, sid, "pipeline_1f1b.cpp"), "w").write(X.solution_text(ex, body))
PY

out=$(timeout 300 nice python3 scripts/exercises.py grade "$subs" --out "$tmp/out" --only pipeline_1f1b 2>&1); rc=$?
grep -q '^alice .*pipeline_1f1b .*PASS' <<<"$out" && grep -q '^bob.2 .*pipeline_1f1b .*FAIL (a hidden run)' <<<"$out" &&
  grep -q 'hint:' "$tmp/out/bob.2/pipeline_1f1b.txt" && grep -q '^  ok ' "$tmp/out/bob.2/pipeline_1f1b.txt" &&
  echo "NZRESULT PASS grade.hidden_runs_catch_what_the_public_ones_pass" ||
  echo "NZRESULT FAIL grade.hidden_runs_catch_what_the_public_ones_pass (exit $rc): $out"
python3 - "$tmp/out/grades.csv" <<'PY' && echo "NZRESULT PASS grade.writes_the_table" || echo "NZRESULT FAIL grade.writes_the_table"
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
want = {("alice", "PASS", ""), ("bob.2", "FAIL", "hidden")}
assert {(r["student"], r["result"], r["failed_run"]) for r in rows} == want, rows
assert all(int(r["runs"]) >= 6 for r in rows), rows
PY
out=$(timeout 300 nice python3 scripts/exercises.py grade "$subs" --out "$tmp/exam" --only pipeline_1f1b --no-hints 2>&1)
grep -q 'FAIL' "$tmp/exam/bob.2/pipeline_1f1b.txt" && ! grep -rq 'hint:' "$tmp/exam" &&
  echo "NZRESULT PASS grade.hints_off_for_exams" || echo "NZRESULT FAIL grade.hints_off_for_exams: $out"

bad() {  # $1 name, $2 phrase of the one line; the submissions as they are now
  local before after
  before=$(find "$tmp" -type f -print0 | sort -z | xargs -0 md5sum)
  out=$(python3 scripts/exercises.py grade "$subs" --out "${OUT:-$tmp/new}" --only pipeline_1f1b 2>&1); rc=$?
  after=$(find "$tmp" -type f -print0 | sort -z | xargs -0 md5sum)
  [ $rc = 2 ] && [ "$(wc -l <<<"$out")" = 1 ] && grep -q "$2" <<<"$out" && [ "$before" = "$after" ] && [ ! -e "$tmp/new" ] &&
    echo "NZRESULT PASS grade.refuses_$1" || echo "NZRESULT FAIL grade.refuses_$1 (exit $rc): $out"
}
OUT=$tmp/out bad an_out_folder_that_is_not_empty "not empty"
mv "$subs/bob.2/pipeline_1f1b.cpp" "$tmp/saved.cpp"
bad a_missing_file "has no pipeline_1f1b.cpp"
mv "$tmp/saved.cpp" "$subs/bob.2/pipeline_1f1b.cpp"
echo x >"$subs/bob.2/notes.txt"
bad an_extra_file "has notes.txt"
rm "$subs/bob.2/notes.txt"
cp "$subs/bob.2/pipeline_1f1b.cpp" "$tmp/saved.cpp"
echo "this is not C++" >>"$subs/bob.2/pipeline_1f1b.cpp"
bad a_file_that_does_not_compile "does not compile"
cp "$tmp/saved.cpp" "$subs/bob.2/pipeline_1f1b.cpp"
mkdir "$subs/carol smith" && cp "$tmp/saved.cpp" "$subs/carol smith/pipeline_1f1b.cpp"
bad a_student_id_with_a_space "no spaces or path characters"
rm -rf "$subs/carol smith"
mkdir "$subs/dave\\..\\x" && cp "$tmp/saved.cpp" "$subs/dave\\..\\x/pipeline_1f1b.cpp"
bad a_student_id_with_path_characters "no spaces or path characters"
rm -rf "$subs/dave\\..\\x"
