#!/usr/bin/env bash
# make grade (scripts/exercises.py grade): a folder of submissions, DIR/<student-id>/<exercise>.cpp,
# graded on the public runs and the hidden ones (scripts/exercise_hidden.py). Two students on
# pipeline_1f1b: the real region passes every run; a warm-up capped at max(K, 2) instead of K passes
# every public run (K >= 2 there) and fails the hidden K = 1 < P - 1. One line per student and
# exercise, a CSV table, HINTS=0 (--no-hints) shows no hint. Bad input (an OUT that is not empty, a
# missing or extra file, a file that does not compile, a student id with a space or a path
# character; a missing, world-readable or public key): one line, exit 2, nothing written.
# With the course's key (SIGNING_KEY): each student's grading seed is SHA-256 of the public key and the
# id (checked with hashlib), the hidden runs are that student's own (the real trainer's losses differ
# between two students' runs), and each student gets one signed record, which an Ed25519 written apart
# from libsodium (tests/tools/ed25519_ref.py) and `zero_estimate --verify` accept; the forgeries (an
# edited verdict, another student's id, another key, a replayed seed) are each refused in one line.
# Prints NZRESULT lines for tests/run_all.sh.
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

est=build/bin/zero_estimate
ed() { python3 tests/tools/ed25519_ref.py "$@"; }
keys=$tmp/keys
$est --course-keys "$keys" >/dev/null 2>&1 && $est --course-keys "$tmp/other" >/dev/null 2>&1
pub=$(awk '{ print $2 }' "$keys/course.pub" 2>/dev/null)
out=$(timeout 400 nice python3 scripts/exercises.py grade "$subs" --out "$tmp/out" --only pipeline_1f1b \
  --signing-key "$keys/course.key" 2>&1); rc=$?
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

# the grading seed: 1 + (the first 8 bytes of SHA-256("nzgrade-seed1\0" + public key + id)) mod 2^30
seed_of() { python3 -c 'import hashlib, sys
h = hashlib.sha256(b"nzgrade-seed1\0" + bytes.fromhex(sys.argv[1]) + sys.argv[2].encode()).digest()
print(1 + int.from_bytes(h[:8], "big") % 2**30)' "$pub" "$1"; }
alice=$(seed_of alice); bob=$(seed_of bob.2)
python3 - "$tmp/out/grades.csv" "$alice" "$bob" <<'PY'
import csv, sys
rows = {r["student"]: r for r in csv.DictReader(open(sys.argv[1]))}
assert rows["alice"]["seed"] == sys.argv[2] and rows["bob.2"]["seed"] == sys.argv[3] and sys.argv[2] != sys.argv[3], rows
PY
res=$?
# each student's hidden runs are their own: the runs alice passed carry her seed's flags, and the real
# trainer, run on her hidden runs and on bob's, gives other losses (the outputs of one are no answer
# to the other's)
python3 - "$tmp/out/alice/pipeline_1f1b.txt" "$alice" "$bob" <<'PY'
import json, os, re, subprocess, sys
sys.path.insert(0, "scripts")
import exercises as X, exercise_grader as G
from exercise_hidden import hidden_for
verdict, alice, bob = open(sys.argv[1]).read(), int(sys.argv[2]), int(sys.argv[3])
ex = X.BY_NAME["pipeline_1f1b"]
mine, theirs = hidden_for(ex, alice), hidden_for(ex, bob)
assert all(f"ok   {c.label}:" in verdict for c in mine), verdict
assert not any(c.label in verdict for c in theirs), verdict
for a, b in zip(mine, theirs):
    assert re.search(r"--seed \d+ --seq \d+ --batch \d+$", a.extra) and a.extra != b.extra, (a.extra, b.extra)
losses = [[s["loss"] for s in G.reference_run("pipeline", c)["report"]["steps_log"]] for c in (mine[0], theirs[0])]
assert losses[0] != losses[1], losses
PY
res2=$?
[ $res = 0 ] && [ $res2 = 0 ] && echo "NZRESULT PASS grade.each_student_has_own_hidden_runs (seeds alice $alice, bob.2 $bob)" ||
  echo "NZRESULT FAIL grade.each_student_has_own_hidden_runs (alice $alice, bob.2 $bob)"

# the signed records: one line each, Ed25519 over everything before " sig=", accepted by --verify
ra=$(cat "$tmp/out/alice/grade-record.txt" 2>/dev/null); rb=$(cat "$tmp/out/bob.2/grade-record.txt" 2>/dev/null)
day="$(date -u +%Y-%m-%d)T[0-9:]*Z"
grep -qx "nzgrade1 student=alice seed=$alice exercises=pipeline_1f1b:PASS passed=1/1 date=$day key=${pub:0:16} sig=[0-9a-f]*" <<<"$ra" &&
  grep -qx "nzgrade1 student=bob.2 seed=$bob exercises=pipeline_1f1b:FAIL passed=0/1 date=$day key=${pub:0:16} sig=[0-9a-f]*" <<<"$rb" &&
  ed verify "$pub" "${ra##* sig=}" "${ra% sig=*}" && ed verify "$pub" "${rb##* sig=}" "${rb% sig=*}" &&
  grep -q "^alice .*signed: .*grade-record.txt (1/1 passed, seed $alice)" <<<"$out" &&
  echo "NZRESULT PASS grade.writes_a_signed_record_per_student" ||
  echo "NZRESULT FAIL grade.writes_a_signed_record_per_student: $ra | $rb | $(grep signed <<<"$out")"
vout=$($est --verify "$ra" --course-pub "$keys/course.pub" 2>&1); rc=$?
[ $rc = 0 ] && grep -qx "verified: student alice, 1 of 1 exercises passed (pipeline_1f1b:PASS), graded $day with course key ${pub:0:16} (seed $alice)" <<<"$vout" &&
  echo "NZRESULT PASS grade.record_verifies_with_the_public_key_alone" ||
  echo "NZRESULT FAIL grade.record_verifies_with_the_public_key_alone (exit $rc): $vout"

refused() {  # NAME LINE PATTERN: --verify says "not verified" and PATTERN, in one line, exit 1
  local o c
  o=$($est --verify "$2" --course-pub "$keys/course.pub" 2>&1); c=$?
  [ $c = 1 ] && [ "$(wc -l <<<"$o")" = 1 ] && grep -q "^not verified: .*$3" <<<"$o" &&
    echo "NZRESULT PASS grade.forgery_$1" || echo "NZRESULT FAIL grade.forgery_$1 (exit $c): $o"
}
field() { sed "s| $1=[^ ]*| $1=$2|" <<<"$3"; }  # replace field $1 of line $3 with $2
refused edited_verdict_is_refused "$(field passed 1/1 "$(field exercises pipeline_1f1b:PASS "$rb")")" 'signature does not match'
refused another_students_id_is_refused "$(field student bob.2 "$ra")" 'signature does not match'
# another key: a record signed with another course's key (its own key id; or this course's id claimed)
oseed=$($est --grade-seed alice --signing-key "$tmp/other/course.key")
other=$($est --sign-grade "nzgrade1 student=alice seed=$oseed exercises=pipeline_1f1b:PASS" --signing-key "$tmp/other/course.key")
refused another_key_is_refused "$other" "signed with key .*, not with this course's key ${pub:0:16}"
claimed=$(field key "${pub:0:16}" "$(field seed "$alice" "$other")"); claimed=${claimed% sig=*}
osk=$(awk '{ print substr($2, 1, 64) }' "$tmp/other/course.key")
refused another_key_under_this_courses_id_is_refused "$claimed sig=$(ed sign "$osk" "$claimed")" 'signature does not match'
# a replayed seed: bob's hidden runs (his seed) under alice's id, signed with the course's own key
# (--sign-grade refuses to; the independent Ed25519 signs it)
sk=$(awk '{ print substr($2, 1, 64) }' "$keys/course.key")
replay=$(field seed "$bob" "$ra"); replay=${replay% sig=*}
refused replayed_seed_is_refused "$replay sig=$(ed sign "$sk" "$replay")" "seed $bob is not student alice's grading seed"
o=$($est --sign-grade "nzgrade1 student=alice seed=$bob exercises=pipeline_1f1b:PASS" --signing-key "$keys/course.key" 2>&1); c=$?
[ $c = 2 ] && [ "$(wc -l <<<"$o")" = 1 ] && grep -q "not student alice's grading seed" <<<"$o" &&
  echo "NZRESULT PASS grade.sign_refuses_another_students_seed" || echo "NZRESULT FAIL grade.sign_refuses_another_students_seed (exit $c): $o"
out=$(timeout 300 nice python3 scripts/exercises.py grade "$subs" --out "$tmp/exam" --only pipeline_1f1b --no-hints 2>&1)
grep -q 'FAIL' "$tmp/exam/bob.2/pipeline_1f1b.txt" && ! grep -rq 'hint:' "$tmp/exam" &&
  echo "NZRESULT PASS grade.hints_off_for_exams" || echo "NZRESULT FAIL grade.hints_off_for_exams: $out"

bad() {  # $1 name, $2 phrase of the one line; the submissions as they are now; $KEY: a signing key
  local before after
  before=$(find "$tmp" -type f -print0 | sort -z | xargs -0 md5sum)
  out=$(python3 scripts/exercises.py grade "$subs" --out "${OUT:-$tmp/new}" --only pipeline_1f1b \
    ${KEY:+--signing-key "$KEY"} 2>&1); rc=$?
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
KEY=$tmp/nokey/course.key bad a_missing_key "cannot\|no such\|not found\|read"
cp "$keys/course.key" "$tmp/open.key" && chmod 644 "$tmp/open.key"
KEY=$tmp/open.key bad a_key_others_can_read "readable by others"
KEY=$keys/course.pub bad a_public_key_as_the_signing_key "private key"
rm -f "$tmp/open.key"

# a file two exercises share: the student edition's copy of stage1_reduce_scatter has
# stage1_update_and_gather's region as its TODO, so it is graded against the real stage1 with that
# region as submitted (the real one would never match a copy whose update is a TODO)
python3 - "$tmp/shared" <<'PY'
import os, sys
sys.path.insert(0, "scripts")
import exercises as X
ex, other = X.BY_NAME["stage1_reduce_scatter"], X.BY_NAME["stage1_update_and_gather"]
text = X.with_region(open(ex.path).read(), other.name, X.todo_lines(other))
os.makedirs(os.path.join(sys.argv[1], "carol"))
open(os.path.join(sys.argv[1], "carol", "stage1_reduce_scatter.cpp"), "w").write(text)
PY
out=$(timeout 400 nice python3 scripts/exercises.py grade "$tmp/shared" --out "$tmp/shared_out" --only stage1_reduce_scatter 2>&1); rc=$?
[ $rc = 0 ] && grep -q '^carol .*stage1_reduce_scatter .*PASS' <<<"$out" &&
  echo "NZRESULT PASS grade.a_shared_file_is_graded_with_its_other_region_as_submitted" ||
  echo "NZRESULT FAIL grade.a_shared_file_is_graded_with_its_other_region_as_submitted (exit $rc): $out"
