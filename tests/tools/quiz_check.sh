#!/usr/bin/env bash
# zero_estimate --quiz: the questions are printed without their answers, and --key prints the answer
# key, which, fed back through --check, scores 100%; every answer is graded (each one moved outside
# its tolerance fails, and is named); where the ZeRO paper's count and the exact one differ (the
# elements sent: Ψ per collective against Ψ(N-1)/N), both are accepted and the grader says which was
# used, and a number between them is not; a malformed answers file is one line, exit 2; and the
# key's model-state and traffic answers agree with the ZeRO paper's formulas recomputed here
# independently, from the question text alone. Prints NZRESULT lines for tests/run_all.sh.
cd "$(dirname "$0")/../.."
est=${NZ_BIN_DIR:-build/bin}/zero_estimate
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
res() { if [ "$2" = 0 ]; then echo "NZRESULT PASS quiz.$1"; else echo "NZRESULT FAIL quiz.$1 $3"; fi; }

$est --quiz --seed 11 --count 20 >"$tmp/quiz.txt" 2>&1
$est --quiz --seed 11 --count 20 --key >"$tmp/key_out.txt" 2>&1
grep '^Q[0-9]* ' "$tmp/key_out.txt" >"$tmp/key.txt"
awk '{ print $1, $2 }' "$tmp/key.txt" >"$tmp/key_values.txt"  # the answers alone, without comments
[ "$(grep -c '^Q[0-9]*\. ' "$tmp/quiz.txt")" = 20 ] && [ "$(wc -l <"$tmp/key.txt")" = 20 ]
res prints_twenty_questions_and_their_key $? "($(grep -c '^Q[0-9]*\. ' "$tmp/quiz.txt") questions, $(wc -l <"$tmp/key.txt") key lines)"

# The questions alone: no key line (`Q<n> <number>`), no "answer key", and none of the key's
# fractional answers anywhere (whole numbers such as 16 ranks occur in questions anyway).
leaked=$(grep -c -i '^Q[0-9]* [0-9]\|answer key' "$tmp/quiz.txt")
while read -r q a _; do
  case "$a" in *.*) grep -q -- "$a" "$tmp/quiz.txt" && leaked=$((leaked + 1)) ;; esac
done <"$tmp/key.txt"
[ "$leaked" = 0 ]; res the_key_is_not_printed_without_key $? "($leaked key lines or answers among the questions)"

out=$($est --quiz --seed 11 --count 20 --check "$tmp/key.txt" 2>&1); rc=$?
[ $rc = 0 ] && grep -q 'score: 20 of 20 right' <<<"$out"; res the_key_scores_100_percent $? "(exit $rc: $(tail -1 <<<"$out"))"

# Q3 moved by 5% (every tolerance is 1% or exact)
awk '$1 == "Q3" { $2 = $2 * 1.05 } { print $1, $2 }' "$tmp/key.txt" >"$tmp/off.txt"
out=$($est --quiz --seed 11 --count 20 --check "$tmp/off.txt" 2>&1); rc=$?
[ $rc = 1 ] && grep -q '^Q3  wrong' <<<"$out" && grep -q 'score: 19 of 20 right' <<<"$out"
res a_perturbed_answer_fails $? "(exit $rc: $(grep Q3 <<<"$out"))"

# Every answer is graded: all twenty moved (by 5%, or by one for the exact counts) are twenty
# lines "Q<n>  wrong", one per question, and a score of 0. (An exact count is the key's "exactly";
# a whole number with a tolerance, 160 B parameters within 1%, is moved by 5% as the others.)
awk '{ v = $2 * 1.05; if (v == $2 + 0 || / exactly/) v = $2 + 1; print $1, v }' "$tmp/key.txt" >"$tmp/all_off.txt"
out=$($est --quiz --seed 11 --count 20 --check "$tmp/all_off.txt" 2>&1); rc=$?
graded=$(for n in $(seq 1 20); do grep -c "^Q$n  wrong" <<<"$out"; done | grep -c '^1$')
[ $rc = 1 ] && [ "$graded" = 20 ] && grep -q 'score: 0 of 20 right' <<<"$out"
res each_answer_is_graded $? "(exit $rc, $graded of 20 questions marked wrong once: $(tail -1 <<<"$out"))"

# a different seed is a different quiz: the key of seed 11 does not pass it
$est --quiz --seed 12 --count 20 --check "$tmp/key.txt" >/dev/null 2>&1; rc=$?
[ $rc = 1 ]; res another_seed_is_another_quiz $? "(exit $rc)"

echo "Q1 twelve" >"$tmp/bad.txt"
out=$($est --quiz --seed 11 --count 20 --check "$tmp/bad.txt" 2>&1); rc=$?
[ $rc = 2 ] && [ "$(wc -l <<<"$out")" = 1 ]; res a_malformed_answer_is_one_line_exit_2 $? "(exit $rc: $out)"
out=$($est --check "$tmp/key.txt" 2>&1); rc=$?
[ $rc = 2 ]; res check_without_quiz_is_a_usage_error $? "(exit $rc: $out)"
out=$($est --key 2>&1); rc=$?
[ $rc = 2 ] && [ "$(wc -l <<<"$out")" = 1 ]; res key_without_quiz_is_a_usage_error $? "(exit $rc: $out)"
out=$($est --quiz --key --check "$tmp/key.txt" 2>&1); rc=$?
[ $rc = 2 ] && [ "$(wc -l <<<"$out")" = 1 ]; res key_and_check_together_is_a_usage_error $? "(exit $rc: $out)"

# Independent truth: the paper's per-rank model states and traffic, from the question text.
# The elements sent are also written, as the ZeRO paper counts them (no (N-1)/N), to paper.txt.
python3 - "$tmp/quiz.txt" "$tmp/key.txt" "$tmp/paper.txt" <<'PY'
import re, sys
text = open(sys.argv[1]).read()
qs = dict(re.findall(r"^Q(\d+)\. (.*)$", text, re.M))
key = {k: float(v) for k, v in re.findall(r"^Q(\d+) (\S+)", open(sys.argv[2]).read(), re.M)}
paper = dict(key)
checked = bad = 0
for n in qs:
    if n not in key:  # a question without its key line: nothing to compare, a failure
        bad += 1
        key[n] = paper[n] = float("nan")
        print(f"  Q{n}: no key line")
for n, q in qs.items():
    m = re.search(r"\((\d+) layers, width (\d+), .* vocabulary (\d+)", q)
    if not m:
        continue
    L, C, V = map(int, m.groups())
    psi = V * C + 1024 * C + L * (12 * C * C + 13 * C) + 2 * C      # GPT-2 with a tied embedding
    mN = re.search(r"on (\d+) ranks", q)
    if not mN:  # the fewest ranks (a power of two) whose per-rank model states fit the capacity
        stage = re.search(r"(stage1|stage2|stage3)", q).group(1)
        cap = float(re.search(r"fit in (\d+) GB", q).group(1)) * 1e9
        def total(n):
            S = -(-psi // n)
            return {"stage1": 4 * S * n + 12 * S, "stage2": 2 * S * n + 14 * S, "stage3": 16 * S}[stage]
        want = next(n for n in (2 ** i for i in range(11)) if total(n) <= cap)
        checked += 1
        if key[n] != want:
            bad += 1
            print(f"  Q{n}: key {key[n]}, the fewest ranks by the paper's formula {want}")
        continue
    N = int(mN.group(1))
    S = -(-psi // N)                                                  # padded to a multiple of N
    stage = re.search(r"(stage0_ddp|stage1|stage2|stage3|ZeRO-Offload)", q).group(1)
    bf16 = "bf16 mixed" in q
    e, opt = (2, 12) if bf16 else (4, 8)                              # bytes per param; optimizer bytes
    if "model states (params" in q:
        P = S * N
        want = {"stage0_ddp": (2 * e + opt) * P, "stage1": 2 * e * P + opt * S,
                "stage2": e * P + (e + opt) * S, "stage3": (2 * e + opt) * S}[stage] / 1e9
    elif "host memory" in q:
        want = (e + 12) * S / 1e9                                      # grad slice + fp32 master + m + v
    elif "cross each rank's host" in q:
        K = int(re.search(r"with (\d+) micro-steps", q).group(1))
        want = (K + 1) * S / 1e6
    elif "million elements does each rank send" in q:
        K = int(re.search(r"over (\d+) micro-steps", q).group(1))
        collectives = {"stage0_ddp": 2, "stage1": 2, "stage2": K + 1, "stage3": 3 * K}[stage]
        want = collectives * (N - 1) * S / 1e6
        paper[n] = collectives * psi / 1e6                              # Ψ per collective, the paper's way
    else:
        continue
    checked += 1
    if abs(key[n] - want) > 1e-4 * abs(want):
        bad += 1
        print(f"  Q{n}: key {key[n]}, the paper's formula {want:.6g}")
open(sys.argv[3], "w").write("".join(f"Q{n} {v:.6g}\n" for n, v in sorted(paper.items(), key=lambda x: int(x[0]))))
ok = checked >= 10 and bad == 0
print(f"NZRESULT {'PASS' if ok else 'FAIL'} quiz.key_agrees_with_the_papers_formulas ({checked} questions recomputed, {bad} differ)")
PY

# Both conventions where they differ: the paper's answers (the elements sent without (N-1)/N, every
# other answer the key's) score 100% too, and each such question says it was graded by the paper's
# count, while the key's say "exact"; a number halfway between the two is wrong.
sent=$(grep -c 'million elements does each rank send' "$tmp/quiz.txt")
changed=$(diff "$tmp/key_values.txt" "$tmp/paper.txt" | grep -c '^>')
out=$($est --quiz --seed 11 --count 20 --check "$tmp/paper.txt" 2>&1); rc=$?
said_paper=$(grep -c "right .*the ZeRO paper's" <<<"$out")
said_exact=$($est --quiz --seed 11 --count 20 --check "$tmp/key.txt" 2>&1 | grep -c 'right .*exact, with (N-1)/N')
[ "$sent" -ge 2 ] && [ "$changed" = "$sent" ] && [ $rc = 0 ] && grep -q 'score: 20 of 20 right' <<<"$out" &&
  [ "$said_paper" = "$sent" ] && [ "$said_exact" = "$sent" ]
res both_conventions_are_accepted_and_named $? \
  "($sent elements-sent questions, $changed paper answers differ from the key, exit $rc, $said_paper said paper, $said_exact said exact: $(tail -1 <<<"$out"))"
q=$(diff "$tmp/key_values.txt" "$tmp/paper.txt" | grep '^>' | head -1 | awk '{ print $2 }')
mid=$(join <(sort "$tmp/key_values.txt") <(sort "$tmp/paper.txt") | awk -v q="$q" '$1 == q { print $1, ($2 + $3) / 2 }')
{ grep -v "^$q " "$tmp/key_values.txt"; echo "$mid"; } >"$tmp/between.txt"
out=$($est --quiz --seed 11 --count 20 --check "$tmp/between.txt" 2>&1); rc=$?
[ -n "$q" ] && [ $rc = 1 ] && grep -q "^$q  wrong" <<<"$out"
res between_the_conventions_is_wrong $? "(exit $rc: $(grep "^$q " <<<"$out"))"

# ulysses' questions (every seventh): the key against the formulas recomputed here from the question text
# alone: the all-to-all's 8 B (T/S) C (S-1)/S elements per block and rank, and the largest S that divides
# the heads, the ranks and the tokens (ulysses/train.cpp's three refusals); seed 11, 150 questions
$est --quiz --seed 11 --count 150 >"$tmp/quiz60.txt" 2>&1
$est --quiz --seed 11 --count 150 --key >"$tmp/key60.txt" 2>&1
python3 - "$tmp/quiz60.txt" "$tmp/key60.txt" <<'PY'
import re, sys
qs = dict(re.findall(r"^Q(\d+)\. (.*)$", open(sys.argv[1]).read(), re.M))
key = {k: float(v) for k, v in re.findall(r"^Q(\d+) (\S+)", open(sys.argv[2]).read(), re.M)}
elems = largest = bad = 0
for n, q in qs.items():
    shape = re.search(r"DeepSpeed-Ulysses on .*?\((\d+) blocks of width C = (\d+), (\d+) heads\)", q)
    if not shape:
        continue
    L, C, NH = map(int, shape.groups())
    m = re.search(r"S = (\d+) ranks per sequence, micro-batches of (\d+) sequences? of (\d+) tokens", q)
    if m:
        S, B, T = map(int, m.groups())
        want, elems = 8 * B * (T // S) * C * (S - 1) / S / 1e6, elems + 1
        ok = abs(key.get(n, -1) - want) <= 1e-5 * want
    else:
        T, N = map(int, re.search(r"sequences of (\d+) tokens, (\d+) ranks in all", q).groups())
        want, largest = max(S for S in range(1, N + 1) if NH % S == 0 and N % S == 0 and T % S == 0), largest + 1
        ok = key.get(n) == want
    if not ok:
        bad += 1
        print(f"  Q{n}: key {key.get(n)}, recomputed {want}")
good = elems >= 2 and largest >= 2 and bad == 0
print(f"NZRESULT {'PASS' if good else 'FAIL'} quiz.ulysses_answers_agree_with_their_formulas "
      f"({elems} all-to-all questions, {largest} largest-S questions, {bad} differ)")
PY

# --explain: a worked answer (an indented line) under each wrong answer, none under a right one.
out=$($est --quiz --seed 11 --count 20 --check "$tmp/all_off.txt" --explain 2>&1)
explained=$(grep -c '^    [^ ]' <<<"$out")
right_out=$($est --quiz --seed 11 --count 20 --check "$tmp/key.txt" --explain 2>&1)
[ "$explained" = 20 ] && ! grep -q '^    ' <<<"$right_out" && grep -q '^Q1  wrong' <<<"$out" &&
  [ "$(grep -A1 '^Q1  wrong' <<<"$out" | tail -1 | cut -c1-4)" = "    " ]
res explain_shows_a_worked_answer_under_each_wrong_one $? "($explained explanations for 20 wrong answers)"

# --result and --verify: the result line of a graded quiz verifies; its check code is FNV-1a over the
# line, recomputed here; an edited score, or an edited answer with the code recomputed to match, is
# not verified (exit 1); a line that is not a result line is one line, exit 2.
line=$($est --quiz --seed 11 --count 20 --check "$tmp/off.txt" --result 2>&1 | sed -n 's/^result: //p')
fnv() { python3 -c 'import sys
h = 2166136261
for c in sys.argv[1].encode(): h = ((h ^ c) * 16777619) % 2**32
print(f"{h:08x}")' "$1"; }
body=${line% code=*}
[ -n "$line" ] && [ "${line##* code=}" = "$(fnv "$body")" ] && grep -q ' score=19/20 ' <<<"$line"
res result_line_has_the_score_and_fnv_code $? "($line)"
out=$($est --verify "$line" 2>&1); rc=$?
[ $rc = 0 ] && [ "$out" = "verified: --seed 11 --count 20, 19 of 20 right (a self-study line: its code is a checksum, not a signature)" ]; res verify_accepts_its_line $? "(exit $rc: $out)"
out=$($est --verify "${line/score=19/score=20}" 2>&1); rc=$?
[ $rc = 1 ] && grep -q 'not verified: the check code' <<<"$out"; res verify_refuses_an_edited_score $? "(exit $rc: $out)"
forged="${body/score=19/score=20}"
forged=$(awk -v q="$(awk '$1 == "Q3" { print $2 }' "$tmp/key.txt")" '{ split($0, a, "answers="); split(a[2], b, " ");
  n = split(b[1], v, ","); v[3] = q; s = v[1]; for (i = 2; i <= n; i++) s = s "," v[i]; sub(b[1], s); print }' <<<"$forged")
out=$($est --verify "$forged code=$(fnv "$forged")" 2>&1); rc=$?
[ $rc = 0 ] && grep -q '20 of 20' <<<"$out"; res verify_regrades_the_answers $? "(Q3 corrected, score 20 claimed: exit $rc: $out)"
forged=${body/score=19/score=20}
out=$($est --verify "$forged code=$(fnv "$forged")" 2>&1); rc=$?
[ $rc = 1 ] && grep -q 'its answers grade 19 of 20' <<<"$out"; res verify_refuses_a_score_its_answers_do_not_earn $? "(exit $rc: $out)"
out=$($est --verify "nzquiz1 seed=11 count=20 answers=1 score=0/20" 2>&1); rc=$?
[ $rc = 2 ] && [ "$(wc -l <<<"$out")" = 1 ]; res verify_of_a_bad_line_is_one_line_exit_2 $? "(exit $rc: $out)"
out=$($est --quiz --explain 2>&1); rc=$?
[ $rc = 2 ] && [ "$(wc -l <<<"$out")" = 1 ]; res explain_without_check_is_a_usage_error $? "(exit $rc: $out)"

# ---- the answers file: a small file or pipe is read, nothing else (one line, exit 2, within 10 s each) ----
# A FIFO blocked in open, /dev/zero was read without end, and a directory was graded as "no answer".
# A FIFO nothing writes to is given up after 3 s of silence; one a program writes to, or a pipe on
# /dev/stdin, is graded; one fed from /dev/zero stops at 1 MiB.
mkfifo "$tmp/fifo"
out=$(timeout 10 $est --quiz --check "$tmp/fifo" 2>&1); rc=$?
[ $rc = 2 ] && [ "$(wc -l <<<"$out")" = 1 ] && grep -q 'FIFO or pipe with nothing written' <<<"$out"
res check_of_a_fifo_nothing_writes_to_ends $? "(exit $rc: $out)"
(timeout 10 cat "$tmp/key_values.txt" >"$tmp/fifo" &)
out=$(timeout 10 $est --quiz --seed 11 --count 20 --check "$tmp/fifo" 2>&1); rc=$?
out2=$(timeout 10 $est --quiz --seed 11 --count 20 --check /dev/stdin <"$tmp/key_values.txt" 2>&1); rc2=$?
out3=$(cat "$tmp/key_values.txt" | timeout 10 $est --quiz --seed 11 --count 20 --check /dev/stdin 2>&1); rc3=$?
[ $rc = 0 ] && [ $rc2 = 0 ] && [ $rc3 = 0 ] && grep -q 'score: 20 of 20' <<<"$out" && grep -q 'score: 20 of 20' <<<"$out3"
res check_reads_a_fifo_and_a_pipe_written_to $? "(exit $rc, $rc2, $rc3: $(tail -1 <<<"$out"))"
(timeout 10 cat /dev/zero >"$tmp/fifo" 2>/dev/null &)
out=$( (ulimit -v 1000000; timeout 10 $est --quiz --check "$tmp/fifo") 2>&1); rc=$?
[ $rc = 2 ] && [ "$(wc -l <<<"$out")" = 1 ] && grep -q 'more than' <<<"$out"; res check_of_a_fifo_fed_from_dev_zero_stops $? "(exit $rc: ${out:0:200})"
out=$( (ulimit -v 1000000; timeout 10 $est --quiz --check /dev/zero) 2>&1); rc=$?
[ $rc = 2 ] && [ "$(wc -l <<<"$out")" = 1 ] && grep -q 'device' <<<"$out"; res check_of_dev_zero_is_refused $? "(exit $rc: ${out:0:200})"
out=$(timeout 10 $est --quiz --check "$tmp" 2>&1); rc=$?
[ $rc = 2 ] && [ "$(wc -l <<<"$out")" = 1 ] && grep -q 'directory' <<<"$out"; res check_of_a_directory_is_refused $? "(exit $rc: ${out:0:200})"
{ cat "$tmp/key_values.txt"; yes '# a comment line of an answers file far too long to be one' | head -c 2000000; } >"$tmp/long.txt"
out=$(timeout 10 $est --quiz --seed 11 --count 20 --check "$tmp/long.txt" 2>&1); rc=$?
[ $rc = 2 ] && [ "$(wc -l <<<"$out")" = 1 ] && grep -q 'more than' <<<"$out"; res check_of_a_file_over_1_MiB_is_refused $? "(exit $rc: ${out:0:200})"

# --verify reads the seed as --seed does: "-1" and a 23-digit seed (read as 2^64 - 1 by strtoull), 0
# and 2^30 + 1, each with its check code recomputed to match, are one line, exit 2; 2^30 verifies.
bad=""
for s in -1 12345678901234567890123 0 1073741825 +5; do
  l="nzquiz1 seed=$s count=1 answers=- score=0/1"
  out=$($est --verify "$l code=$(fnv "$l")" 2>&1); rc=$?
  { [ $rc = 2 ] && [ "$(wc -l <<<"$out")" = 1 ] && grep -q "seed=$s is not" <<<"$out"; } || bad+=" [seed=$s: exit $rc: $out]"
done
l="nzquiz1 seed=1073741824 count=1 answers=- score=0/1"
out=$($est --verify "$l code=$(fnv "$l")" 2>&1); rc=$?
[ $rc = 0 ] || bad+=" [seed=2^30: exit $rc: $out]"
[ -z "$bad" ]; res verify_reads_only_a_seed_that_seed_takes $? "($bad)"

# self-study says what its line is: a checksum, not a signature
out=$($est --quiz --seed 11 --count 20 --check "$tmp/off.txt" --result 2>&1)
grep -q 'checksum, not a signature' <<<"$out"; res self_study_result_says_it_is_a_checksum $? "($(tail -1 <<<"$out"))"

# ---- a course's certificates (docs/certificates.md), checked against tests/tools/ed25519_ref.py, an
# Ed25519 in plain Python independent of libsodium, and the seed against SHA-256 from hashlib ----
ed() { python3 tests/tools/ed25519_ref.py "$@"; }
ed selftest; res ed25519_reference_passes_rfc8032_test_1 $? "(tests/tools/ed25519_ref.py disagrees with RFC 8032)"
sum() { sha256sum "$@" 2>/dev/null | awk '{ print $1 }' | tr '\n' ' '; }

keys=$tmp/course
out=$($est --course-keys "$keys" 2>&1); rc=$?
sk_seed=$(awk '{ print substr($2, 1, 64) }' "$keys/course.key" 2>/dev/null)
pub=$(awk '{ print $2 }' "$keys/course.pub" 2>/dev/null)
[ $rc = 0 ] && [ "$(stat -c %a "$keys/course.key")" = 600 ] && [ "$(stat -c %a "$keys")" = 700 ] &&
  [ "$(ed public "$sk_seed")" = "$pub" ] && [ "$(awk '{ print substr($2, 65) }' "$keys/course.key")" = "$pub" ]
res course_keys_make_an_ed25519_pair_mode_0600 $? "(exit $rc, key mode $(stat -c %a "$keys/course.key" 2>&1): $out)"
before=$(sum "$keys"/*)
out=$($est --course-keys "$keys" 2>&1); rc=$?
[ $rc = 2 ] && [ "$(wc -l <<<"$out")" = 1 ] && grep -q 'course.key exists' <<<"$out" && [ -n "$pub" ] &&
  [ "$(sum "$keys"/*)" = "$before" ]
res course_keys_never_overwrite_a_key $? "(exit $rc: $out)"
mkdir "$tmp/half" && cp "$keys/course.pub" "$tmp/half/"
out=$($est --course-keys "$tmp/half" 2>&1); rc=$?
[ $rc = 2 ] && [ "$(wc -l <<<"$out")" = 1 ] && [ ! -e "$tmp/half/course.key" ] && cmp -s "$keys/course.pub" "$tmp/half/course.pub"
res course_keys_refuse_beside_a_public_key $? "(exit $rc: $out)"
if [ -z "${NZ_BIN_DIR:-}" ]; then  # the Makefile's target, where the build is this checkout's
  out=$(timeout 300 make -s --no-print-directory course-keys KEYS="$tmp/made" 2>&1); rc=$?
  [ $rc = 0 ] && [ "$(stat -c %a "$tmp/made/course.key" 2>&1)" = 600 ] && [ -s "$tmp/made/course.pub" ]
  res make_course_keys_writes_the_pair $? "(exit $rc: $(tail -1 <<<"$out"))"
fi

# The seed of a student's quiz: SHA-256("nzquiz-seed1\0" + public key + id), 8 bytes big-endian, mod 2^30, + 1.
seed_of() { python3 -c 'import hashlib, sys
h = hashlib.sha256(b"nzquiz-seed1\0" + bytes.fromhex(sys.argv[1]) + sys.argv[2].encode()).digest()
print(1 + int.from_bytes(h[:8], "big") % 2**30)' "$pub" "$1"; }
cq() { $est --quiz --course-pub "$keys/course.pub" "$@"; }
alice=$(seed_of alice); bob=$(seed_of bob)
cq --student alice >"$tmp/alice_quiz.txt" 2>&1
cq --student alice --key | grep '^Q[0-9]* ' | awk '{ print $1, $2 }' >"$tmp/alice_key.txt"
$est --quiz --seed "$alice" --count 10 --key | grep '^Q[0-9]* ' | awk '{ print $1, $2 }' >"$tmp/alice_seed_key.txt"
grep -qx "  nzquiz-answers2 student=alice seed=$alice count=10" "$tmp/alice_quiz.txt" && [ "$alice" != "$bob" ] &&
  [ "$(wc -l <"$tmp/alice_key.txt")" = 10 ] && cmp -s "$tmp/alice_key.txt" "$tmp/alice_seed_key.txt"
res a_students_seed_is_sha256_of_key_and_id $? "(alice $alice, bob $bob: $(head -2 "$tmp/alice_quiz.txt" | tail -1))"

# Alice answers: Q3 wrong first, then the "expected" value the check printed (the page shows the
# same); every other answer right at once. The first attempt counts: 9 of 10, Q3 tried twice.
q3_right=$(awk '$1 == "Q3" { print $2 }' "$tmp/alice_key.txt")
q3_wrong=$(awk -v v="$q3_right" 'BEGIN { print v * 1.5 }')
{ echo "nzquiz-answers2 student=alice seed=$alice count=10"; grep -v '^Q3 ' "$tmp/alice_key.txt"; echo "Q3 $q3_wrong"; } >"$tmp/alice.txt"
expected=$(cq --check "$tmp/alice.txt" 2>&1 | sed -n 's/^Q3  wrong: .*, expected \([0-9.e+-]*\) within.*/\1/p')
echo "Q3 $expected" >>"$tmp/alice.txt"
out=$(cq --check "$tmp/alice.txt" 2>&1); rc=$?
[ -n "$expected" ] && [ $rc = 1 ] && grep -q '^score: 9 of 10 right at the first attempt (11 attempts' <<<"$out" &&
  grep -q "^Q3  wrong: .*first of 2 attempts, the one graded; the latest, $expected, is right" <<<"$out"
res expected_value_after_a_wrong_first_try_does_not_count $? "(expected '$expected', exit $rc: $(grep -E '^Q3|^score' <<<"$out"))"

answers_sum=$(sum "$tmp/alice.txt")
day0=$(date -u +%Y-%m-%d)
cert=$($est --quiz --sign "$tmp/alice.txt" --student alice --signing-key "$keys/course.key" 2>&1 | sed -n 's/^certificate: //p')
body=${cert% sig=*}; sig=${cert##* sig=}
day1=$(date -u +%Y-%m-%d)  # the signing day: $day0, or $day1 if it was signed as midnight passed
want="nzcert2 student=alice seed=$alice count=10 date=\($day0\|$day1\)T[0-9:]*Z first=[^ ]* attempts=1,1,2,1,1,1,1,1,1,1 score=9/10 key=${pub:0:16}"
first3=$(sed 's/.* first=//; s/ .*//' <<<"$body" | cut -d, -f3)
[ -n "$cert" ] && grep -qx "$want" <<<"$body" && [ "$first3" = "$q3_wrong" ] && ed verify "$pub" "$sig" "$body" &&
  [ "$(sum "$tmp/alice.txt")" = "$answers_sum" ]
res sign_makes_a_certificate_ed25519_verifies $? "($cert)"
out=$($est --verify "$cert" --course-pub "$keys/course.pub" 2>&1); rc=$?
[ $rc = 0 ] && grep -q "^verified: student alice, 9 of 10 right at the first attempt (11 attempts in all), signed \($day0\|$day1\)T" <<<"$out"
res verify_accepts_a_signed_certificate $? "(exit $rc: $out)"

# Forgeries, each one line, exit 1.
refused() {  # NAME LINE PATTERN: --verify says "not verified" and PATTERN, in one line, exit 1
  local out rc
  out=$($est --verify "$2" --course-pub "$keys/course.pub" 2>&1); rc=$?
  [ $rc = 1 ] && [ "$(wc -l <<<"$out")" = 1 ] && grep -q "^not verified: .*$3" <<<"$out"
  res "$1" $? "(exit $rc: $out)"
}
field() { sed "s| $1=[^ ]*| $1=$2|" <<<"$3"; }  # replace field $1 of line $3 with $2
refused forged_score_is_refused "$(field score 10/10 "$cert")" 'signature does not match'
answers=$(sed 's/.* first=//; s/ .*//' <<<"$cert")
refused forged_answer_is_refused "$(field first "${answers/$q3_wrong/$q3_right}" "$(field score 10/10 "$cert")")" 'signature does not match'
refused another_students_id_is_refused "$(field student bob "$cert")" 'signature does not match'
other_seed=$(python3 -c 'import os; print(os.urandom(32).hex())')
other_pub=$(ed public "$other_seed")
forged=$(field key "${other_pub:0:16}" "$body"); refused another_keys_certificate_is_refused "$forged sig=$(ed sign "$other_seed" "$forged")" 'signed with key'
refused another_key_under_this_keys_id_is_refused "$body sig=$(ed sign "$other_seed" "$body")" 'signature does not match'
# Signed with the course's own key (as only a stolen key could): a seed that is not the student's,
# with answers right for that seed (bob's quiz certified as alice's), and a score the first answers
# do not earn, are refused all the same.
$est --quiz --seed "$bob" --count 10 --key | awk '/^Q[0-9]* / { printf "%s%s", sep, $2; sep = "," }' >"$tmp/bob_answers"
forged=$(field first "$(cat "$tmp/bob_answers")" "$(field seed "$bob" "$(field score 10/10 "$body")")")
forged=$(field attempts 1,1,1,1,1,1,1,1,1,1 "$forged")
refused replayed_seed_is_refused "$forged sig=$(ed sign "$sk_seed" "$forged")" "seed $bob is not student alice's"
forged=$(field score 10/10 "$body")
refused unearned_score_signed_by_the_key_is_refused "$forged sig=$(ed sign "$sk_seed" "$forged")" 'its first answers grade 9 of 10'
# the certificate's text itself: a field out of its form is one line, exit 2; no public key, exit 2
out=$($est --verify "$(field seed -1 "$cert")" --course-pub "$keys/course.pub" 2>&1); rc=$?
[ $rc = 2 ] && [ "$(wc -l <<<"$out")" = 1 ] && grep -q 'seed=-1 in the certificate' <<<"$out"
res certificate_with_seed_minus_1_is_one_line_exit_2 $? "(exit $rc: $out)"
out=$($est --verify "$cert" 2>&1); rc=$?
[ $rc = 2 ] && [ "$(wc -l <<<"$out")" = 1 ] && grep -q -- '--course-pub' <<<"$out"
res certificate_without_public_key_is_one_line_exit_2 $? "(exit $rc: $out)"

# Signing refuses answers that are not the named student's own: bob's file, or alice's file
# answering bob's quiz (a replayed seed), one line, exit 2, no certificate.
{ echo "nzquiz-answers2 student=bob seed=$bob count=10"; cat "$tmp/alice_key.txt"; } >"$tmp/bob.txt"
{ echo "nzquiz-answers2 student=alice seed=$bob count=10"; cat "$tmp/alice_key.txt"; } >"$tmp/replay.txt"
bad=""
for f in bob replay; do
  out=$($est --quiz --sign "$tmp/$f.txt" --student alice --signing-key "$keys/course.key" 2>&1); rc=$?
  want="the answers of student bob, not of --student alice"
  [ $f = replay ] && want="the quiz of seed $bob, but student alice's quiz is seed $alice"
  { [ $rc = 2 ] && [ "$(wc -l <<<"$out")" = 1 ] && grep -q "$want" <<<"$out"; } || bad+=" [$f: exit $rc: $out]"
done
[ -z "$bad" ]; res sign_refuses_another_students_answers_and_seed $? "($bad)"

# Bad input: a student id with spaces or path characters, a missing, unreadable, damaged or
# too-open key, each one line, exit 2; nothing is written and the keys are unchanged.
before=$(sum "$keys"/* "$tmp/alice.txt")
cp "$keys/course.key" "$tmp/open.key" && chmod 644 "$tmp/open.key"
# damaged: the public half's last hex digit changed (0 -> 1, any other -> 0)
cp "$keys/course.key" "$tmp/damaged.key" && chmod 600 "$tmp/damaged.key" && sed -i 's/0$/x/; s/[1-9a-f]$/0/; s/x$/1/' "$tmp/damaged.key"
[ "$(sed 's/.$//' "$tmp/damaged.key")" = "$(sed 's/.$//' "$keys/course.key")" ] && ! cmp -s "$tmp/damaged.key" "$keys/course.key"
damaged_ok=$?
bad=""
check_bad() {  # LABEL PATTERN ARGS...: one line, exit 2, that names what was wrong (PATTERN)
  local out rc
  out=$("${@:3}" 2>&1); rc=$?
  { [ $rc = 2 ] && [ "$(wc -l <<<"$out")" = 1 ] && grep -q "^error: .*$2" <<<"$out"; } || bad+=" [$1: exit $rc: $out]"
}
for id in "alice smith" "../alice" "a/b" 'a\b' ".alice" ""; do
  want="not a student id"; [ -z "$id" ] && want="add --student ID"
  check_bad "questions for '$id'" "$want" cq --student "$id"
  check_bad "sign for '$id'" "$want" $est --quiz --sign "$tmp/alice.txt" --student "$id" --signing-key "$keys/course.key"
done
check_bad "missing key" "cannot read it" $est --quiz --sign "$tmp/alice.txt" --student alice --signing-key "$tmp/none.key"
check_bad "a folder as key" "is a directory" $est --quiz --sign "$tmp/alice.txt" --student alice --signing-key "$keys"
check_bad "public key as private" "not a course.s private key" $est --quiz --sign "$tmp/alice.txt" --student alice --signing-key "$keys/course.pub"
check_bad "key readable by others" "readable by others" $est --quiz --sign "$tmp/alice.txt" --student alice --signing-key "$tmp/open.key"
check_bad "damaged key" "damaged" $est --quiz --sign "$tmp/alice.txt" --student alice --signing-key "$tmp/damaged.key"
check_bad "missing public key" "cannot read it" cq --student alice --course-pub "$tmp/none.pub"
check_bad "private key as public" "not a course.s public key" $est --quiz --student alice --course-pub "$keys/course.key"
check_bad "sign without key" "signing-key" $est --quiz --sign "$tmp/alice.txt" --student alice
check_bad "sign without student" "add --student" $est --quiz --sign "$tmp/alice.txt" --signing-key "$keys/course.key"
check_bad "seed in a course" "drop --seed" cq --student alice --seed 3
check_bad "result in a course" "drop --result" cq --check "$tmp/alice.txt" --result
[ -z "$bad" ] && [ $damaged_ok = 0 ] && [ "$(sum "$keys"/* "$tmp/alice.txt")" = "$before" ]
res bad_ids_and_keys_are_one_line_exit_2 $? "($bad)"

# ---- editions (zero_quiz.h, docs/certificates.md "Editions"): tests/tools/quiz_edition1/ holds what the
# quiz made before the rungs' questions (edition 1; its README says how): a course's public key, a
# certificate, a student's answers file with the grading printed then, a self-study result line and an
# answer key. They verify and grade as they did; edition 2's lines and files name their edition, and an
# edited edition is refused like any other edited field. ----
e1=tests/tools/quiz_edition1
out=$($est --quiz --seed 2026 --count 20 --key --quiz-edition 1 2>&1); rc=$?
[ $rc = 0 ] && [ "$out" = "$(cat $e1/key_seed2026_count20.txt)" ] &&
  ! cmp -s <($est --quiz --seed 2026 --count 20 --key) $e1/key_seed2026_count20.txt
res edition1_key_is_the_key_printed_before_editions $? "(exit $rc: $(diff <(echo "$out") $e1/key_seed2026_count20.txt | head -3))"
out=$($est --verify "$(cat $e1/certificate_carol.txt)" --course-pub $e1/course.pub 2>&1); rc=$?
[ $rc = 0 ] && grep -qx 'verified: student carol, 13 of 14 right at the first attempt (15 attempts in all), signed .* (seed 515235003, quiz edition 1)' <<<"$out"
res edition1_certificate_still_verifies $? "(exit $rc: $out)"
out=$($est --verify "$(cat $e1/result_line.txt)" 2>&1); rc=$?
[ $rc = 0 ] && [ "$out" = "verified: --seed 2026 --count 14 --quiz-edition 1, 13 of 14 right (a self-study line: its code is a checksum, not a signature)" ]
res edition1_result_line_still_verifies $? "(exit $rc: $out)"
out=$($est --quiz --student carol --course-pub $e1/course.pub --check $e1/answers_carol.txt 2>&1); rc=$?
out2=$($est --quiz --student carol --course-pub $e1/course.pub --check $e1/answers_carol.txt --quiz-edition 2 2>&1); rc2=$?
[ $rc = 1 ] && [ "$out" = "$(cat $e1/check_carol.txt)" ] && [ $rc2 = 2 ] && [ "$(wc -l <<<"$out2")" = 1 ] &&
  grep -q 'answers to an edition-1 quiz' <<<"$out2"
res edition1_answers_file_is_graded_against_edition1 $? "(exit $rc, $rc2: $(diff <(echo "$out") $e1/check_carol.txt | head -3) $out2)"
# the edition is signed: an edition-1 certificate renamed nzcert2 (whose first answers would grade 4 of
# 14 in edition 2) and alice's edition-2 certificate renamed nzcert1 are refused by the signature; a
# result line's edition is under its check code; an edition never made, and --quiz-edition beside
# --verify (which reads the line's own), are one line, exit 2
e1cert=$(cat $e1/certificate_carol.txt)
out=$($est --verify "${e1cert/nzcert1/nzcert2}" --course-pub $e1/course.pub 2>&1); rc=$?
out2=$($est --verify "${cert/nzcert2/nzcert1}" --course-pub "$keys/course.pub" 2>&1); rc2=$?
e1line=$(cat $e1/result_line.txt)
out3=$($est --verify "${e1line/nzquiz1/nzquiz2}" 2>&1); rc3=$?
out4=$($est --verify "${e1cert/nzcert1/nzcert3}" --course-pub $e1/course.pub 2>&1); rc4=$?
out5=$($est --quiz --quiz-edition 3 2>&1); rc5=$?
out6=$($est --verify "$e1line" --quiz-edition 1 2>&1); rc6=$?
[ $rc6 = 2 ] && [ "$(wc -l <<<"$out6")" = 1 ] && grep -q 'reads the edition from the line' <<<"$out6" || rc6=x
[ $rc = 1 ] && [ $rc2 = 1 ] && [ $rc6 = 2 ] && grep -q '^not verified: the signature does not match' <<<"$out" &&
  grep -q '^not verified: the signature does not match' <<<"$out2" && [ -n "$cert" ] &&
  [ $rc3 = 1 ] && grep -q '^not verified: the check code' <<<"$out3" &&
  [ $rc4 = 2 ] && [ "$(wc -l <<<"$out4")" = 1 ] && [ $rc5 = 2 ] && [ "$(wc -l <<<"$out5")" = 1 ]
res an_edited_edition_is_refused $? "(exit $rc, $rc2, $rc3, $rc4, $rc5, $rc6: $out | $out2 | $out3 | $out4 | $out5 | $out6)"
# an instructor prints the old quiz for a student: its first line says edition 1, and its key is
# edition 1's key of the student's seed
out=$(cq --student carol --course-pub $e1/course.pub --count 14 --quiz-edition 1 2>&1)
$est --quiz --seed 515235003 --count 14 --key --quiz-edition 1 >"$tmp/carol_seed_key.txt"
grep -qx '  nzquiz-answers student=carol seed=515235003 count=14' <<<"$out" &&
  cmp -s <(cq --student carol --course-pub $e1/course.pub --count 14 --quiz-edition 1 --key) "$tmp/carol_seed_key.txt"
res course_quiz_edition1_names_its_edition $? "($(sed -n 2p <<<"$out"))"

# docs/certificates.md's example: its certificate verifies with its course.pub line, in the words shown there
doc=docs/certificates.md
grep -o 'nzcourse-pub1 [0-9a-f]*' "$doc" | head -1 >"$tmp/doc.pub"
doc_cert=$(grep -o 'certificate: nzcert[0-9] .*' "$doc" | head -1)
out=$($est --verify "$doc_cert" --course-pub "$tmp/doc.pub" 2>&1); rc=$?
[ $rc = 0 ] && [ -n "$doc_cert" ] && grep -qxF "   $out" "$doc"
res the_docs_example_certificate_verifies_as_shown $? "(exit $rc: $out)"

# ---- Muon's questions (tools/zero_quiz.cpp, muon_question): each answer recomputed here from the question
# text alone, with the layout written out (one unit for the embedding and the positions, one per block of
# 12 C^2 + 13 C, one for the final norm, each padded to a multiple of N; the hidden matrices 12 C^2 a block):
# stage1's optimizer state per rank on average, (8P - 4M)/N bytes, and gather-all's all-gathers,
# L (N - 1) S_block elements; each question's worked answer under a wrong answer ----
for s in 1 2 3 4 5 6; do
  $est --quiz --seed $s --count 30 >"$tmp/muon_q$s.txt" 2>&1
  $est --quiz --seed $s --count 30 --key | grep '^Q[0-9]* ' >"$tmp/muon_k$s.txt"
  seq 1 30 | awk '{ print "Q" $1 " 1" }' >"$tmp/muon_a$s.txt"
  $est --quiz --seed $s --count 30 --check "$tmp/muon_a$s.txt" --explain >"$tmp/muon_e$s.txt" 2>&1
done
out=$(python3 - "$tmp" <<'EOF2'
import re, sys
tmp, seen, bad = sys.argv[1], 0, []
for s in range(1, 7):
    key = {int(l.split()[0][1:]): float(l.split()[1]) for l in open(f"{tmp}/muon_k{s}.txt")}
    explained = open(f"{tmp}/muon_e{s}.txt").read()
    for m in re.finditer(r"^Q(\d+)\. GPT-2 \w+ \((\d+) layers, width (\d+), .*?\), (stage1|stage2) on (\d+) ranks, "
                         r"--optimizer muon", open(f"{tmp}/muon_q{s}.txt").read(), re.M):
        n, layers, C, stage, N = int(m[1]), int(m[2]), int(m[3]), m[4], int(m[5])
        pad = lambda x: (x + N - 1) // N * N
        units = [50257 * C + 1024 * C] + [12 * C * C + 13 * C] * layers + [2 * C]
        P, M = sum(pad(u) for u in units), 12 * C * C * layers
        want = (8 * P - 4 * M) / N / 1e9 if stage == "stage1" else layers * (N - 1) * (pad(units[1]) // N) / 1e6
        seen += 1
        if abs(key[n] - want) > 1e-5 * want:
            bad.append(f"seed {s} Q{n}: key {key[n]}, recomputed {want:.6g}")
        if not re.search(rf"^Q{n}  wrong: .*\n    .*\(8P - 4M\)/N|^Q{n}  wrong: .*\n    A block is 12 C\^2", explained, re.M):
            bad.append(f"seed {s} Q{n}: no worked answer under a wrong one")
print(seen, "; ".join(bad))
EOF2
)
[ "${out%% *}" -ge 6 ] && [ "$out" = "${out%% *} " ]
res muon_questions_match_the_layout_recomputed_here $? "(${out%% *} Muon questions; ${out#* })"

# ---- the explorer's certificate box, in each browser installed, against --verify word for word
# (tests/tools/certificate_page_check.py: the browser's WebCrypto Ed25519) ----
page=${NZ_EXPLORER_DIR:-$(dirname "$est")/../explorer}
browsers=()
command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1 && browsers+=(chromium)
{ command -v firefox-esr >/dev/null 2>&1 || command -v firefox >/dev/null 2>&1; } && browsers+=(firefox)
if [ ! -f "$page/zero_estimate.js" ]; then
  echo "NZRESULT SKIP quiz.page (no page in $page: make explorer builds it, with em++ from emscripten," \
       "which bash scripts/install_deps.sh --explorer installs)"
elif [ ${#browsers[@]} = 0 ]; then
  echo "NZRESULT SKIP quiz.page (neither chromium with chromium-driver nor firefox-esr installed;" \
       "bash scripts/install_deps.sh --explorer installs them)"
else
  timeout -k 10 240 python3 tests/tools/certificate_page_check.py "$page" "$est" "${browsers[@]}" ||
    echo "NZRESULT FAIL quiz.page.browser_run (certificate_page_check.py exited with $?)"
fi
