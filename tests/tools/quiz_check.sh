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
# lines "Q<n>  wrong", one per question, and a score of 0.
awk '{ v = $2 * 1.05; if (v == $2 + 0 || $2 == int($2) && $2 < 2000) v = $2 + 1; print $1, v }' "$tmp/key.txt" >"$tmp/all_off.txt"
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
[ $rc = 0 ] && [ "$out" = "verified: --seed 11 --count 20, 19 of 20 right" ]; res verify_accepts_its_line $? "(exit $rc: $out)"
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
