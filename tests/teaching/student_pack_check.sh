#!/usr/bin/env bash
# The student edition (make student-pack, scripts/exercise_pack.py): a pack is built into a fresh
# folder; no line of any code exercise's real region is in it (every file's text, and the strings of
# every object and program in it, after its own build); it builds (the cut files' objects are the
# instructor's, copied into place: this build's other objects are reused, so that only those and the
# links are done); and inside it the real solution of two exercises passes and a wrong one fails with
# its hint (scripts/exercises.py check: what `make check` runs after its dependency step), one of
# them an exercise that shares its file (graded against the real file cut the same
# way). Also: an OUT that exists and is not empty is refused in one line, exit 2, untouched.
# Prints NZRESULT lines for tests/run_all.sh.
cd "$(dirname "$0")/../.."
root=$PWD
tmp=$(mktemp -d /tmp/nanozero-pack.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
pack=$tmp/pack

out=$(timeout 300 nice python3 scripts/exercises.py pack "$pack" 2>&1); rc=$?
if [ $rc != 0 ]; then echo "NZRESULT FAIL pack.builds (exit $rc): $out"; exit 0; fi
echo "NZRESULT PASS pack.is_written ($out)"

# the build: this tree's objects reused (older than the pack's sources), the cut files' from reference/
mkdir -p "$pack/build"
cp -a build/obj "$pack/build/obj"
rm -rf "$pack/build/obj/tests" "$pack/build/obj/mutants"
( cd "$pack/reference/obj" && find . -name '*.o' ! -name '*@*' ) | while read -r o; do rm -f "$pack/build/obj/$o"; done
find "$pack" -path "$pack/build" -prune -o -type f ! -path "$pack/reference/*" -print0 | xargs -0 touch -h -d '2020-01-01'
if out=$(cd "$pack" && timeout 600 nice make -s -j2 all 2>&1); then
  echo "NZRESULT PASS pack.builds"
else
  echo "NZRESULT FAIL pack.builds: $(tail -5 <<<"$out")"; exit 0
fi

# no answer line anywhere: sources, docs, notebooks, scripts, and the strings of its binaries
python3 - "$pack" <<'PY'
import os, subprocess, sys
sys.path.insert(0, "scripts")
import exercises as X, exercise_pack as P
pack = sys.argv[1]
lines = P.answer_lines([e for e in X.EXERCISES if not e.bug])
leaks = []
for d, _, names in os.walk(pack):
    for n in names:
        f = os.path.join(d, n)
        if os.path.islink(f):
            continue
        with open(f, "rb") as h:
            blob = h.read()
        if b"\0" in blob:  # an object, a program, an archive: its strings
            text = subprocess.run(["strings", "-n", "6", f], capture_output=True, text=True).stdout
        else:
            text = blob.decode(errors="replace")
        for c in P.mentions(text, lines):
            leaks.append(f"{os.path.relpath(f, pack)}: {c!r} ({lines[c]})")
n_ex = len({v for v in lines.values()})
print(f"NZRESULT {'FAIL' if leaks else 'PASS'} pack.holds_no_answer_line ({len(lines)} lines of {n_ex} exercises looked for)"
      + ("".join("\n  " + l for l in leaks[:20]) if leaks else ""))
print("NZRESULT " + ("PASS" if not os.path.exists(os.path.join(pack, ".git")) else "FAIL") + " pack.is_not_a_git_clone")
PY

# grading inside the pack: the real region passes, a wrong one fails with its hint
grade() {  # $1 exercise, $2 real|wrong, $3 phrase the verdict must hold
  python3 - "$pack" "$@" <<'PY'
import os, subprocess, sys
sys.path.insert(0, "scripts")
import exercises as X
pack, name, kind, phrase = sys.argv[1:5]
ex = X.BY_NAME[name]
real = open(ex.path).read()
body = "\n".join(X.region_body(real, ex.name))
if kind == "wrong":
    body = X.edited(body, ex.wrong[0][2], name) if isinstance(ex.wrong[0][2], list) else ex.wrong[0][2]
# the learner's copy, as the pack's `make exercise` writes it, with the region filled in
mk = subprocess.run(["python3", "scripts/exercises.py", "make", name], cwd=pack, capture_output=True, text=True)
copy = os.path.join(pack, "exercises", name, ex.file)
text = X.with_region(open(copy).read(), name, body.split("\n"))
open(copy, "w").write(text)
c = subprocess.run(["python3", "scripts/exercises.py", "check", name], cwd=pack, capture_output=True, text=True, timeout=400)
good = (c.returncode == 0) == (kind == "real") and phrase in c.stdout
tail = " | ".join(l for l in c.stdout.splitlines() if l.startswith(("FAIL", "PASS")) or "hint" in l)
print(f"NZRESULT {'PASS' if good else 'FAIL'} pack.grades_{kind}_{name}" + ("" if good else f" (exit {c.returncode}): {mk.stderr} {tail} {c.stderr[-300:]}"))
if kind == "wrong":
    os.remove(copy)
PY
}
grade comm_rank_ordered_sum real "PASS comm_rank_ordered_sum"
grade comm_rank_ordered_sum wrong "rank order"
grade stage1_update_and_gather real "PASS stage1_update_and_gather"
grade stage1_update_and_gather wrong "all-gather"

# an OUT that is not empty: one line, exit 2, nothing changed
mkdir -p "$tmp/full" && echo keep >"$tmp/full/x"
out=$(python3 scripts/exercises.py pack "$tmp/full" 2>&1); rc=$?
[ $rc = 2 ] && [ "$(wc -l <<<"$out")" = 1 ] && [ "$(cat "$tmp/full/x")" = keep ] && [ "$(ls "$tmp/full")" = x ] &&
  echo "NZRESULT PASS pack.refuses_a_folder_that_is_not_empty" ||
  echo "NZRESULT FAIL pack.refuses_a_folder_that_is_not_empty (exit $rc): $out"
