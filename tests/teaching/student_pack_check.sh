#!/usr/bin/env bash
# The student edition (make student-pack, scripts/exercise_pack.py). Two packs, each built into a fresh
# folder, each then built itself (the cut files' objects are the instructor's, copied into place; this
# build's other objects are reused, so that only those and the links are done), neither a git clone:
#   - an assignment, E="stage1_reduce_scatter stage1_update_and_gather comm_rank_ordered_sum": no line
#     of those exercises' real regions anywhere in it (every file's text, and the strings of every
#     object and program after its build); inside it the real solution of comm_rank_ordered_sum and of
#     stage1_update_and_gather (which shares its file: graded against the real file cut the same way)
#     passes and a wrong one fails with its hint;
#   - every exercise: no line of any exercise's real region anywhere in it either (every file's text,
#     the notebooks, the strings of every object and program), not even where a handed-out trainer
#     repeats a rung below it (stage2's update is stage1's: cut there too, for the learner to write
#     back); inside it the real solution of every exercise whose trainer had such lines cut passes
#     (stage2, stage3's two, the second built on the student's copy of the first, offload, infinity,
#     zeropp), and stage2's region right with the cut lines of stage1 not written back fails.
# Grading runs scripts/exercises.py check (what `make check` runs after its dependency step). Also: an
# OUT that exists and is not empty is refused in one line, exit 2, untouched.
# Prints NZRESULT lines for tests/run_all.sh.
cd "$(dirname "$0")/../.."
tmp=$(mktemp -d /tmp/nanozero-pack.XXXXXX)
trap 'rm -rf "$tmp"' EXIT

make_pack() {  # $1 folder, $2 label, $3 exercises (empty: all); builds it; returns 1 when it could not
  local out rc
  out=$(timeout 300 nice python3 scripts/exercises.py pack "$1" ${3:+--only "$3"} 2>&1); rc=$?
  if [ $rc != 0 ]; then echo "NZRESULT FAIL pack.$2.is_written (exit $rc): $out"; return 1; fi
  echo "NZRESULT PASS pack.$2.is_written ($out)"
  mkdir -p "$1/build"
  cp -a build/obj "$1/build/obj"
  cp -a build/config.flags "$1/build/"  # the configuration those objects were compiled in (the Makefile's stamp)
  rm -rf "$1/build/obj/tests" "$1/build/obj/mutants"
  ( cd "$1/reference/obj" && find . -name '*.o' ! -name '*@*' ) | while read -r o; do rm -f "$1/build/obj/$o"; done
  find "$1" -path "$1/build" -prune -o -type f ! -path "$1/reference/*" -print0 | xargs -0 touch -h -d '2020-01-01'
  if out=$(cd "$1" && timeout 600 nice make -s -j2 all 2>&1); then
    echo "NZRESULT PASS pack.$2.builds"
  else
    echo "NZRESULT FAIL pack.$2.builds: $(tail -5 <<<"$out")"; return 1
  fi
  [ ! -e "$1/.git" ] && echo "NZRESULT PASS pack.$2.is_not_a_git_clone" || echo "NZRESULT FAIL pack.$2.is_not_a_git_clone"
}

leaks() {  # $1 folder, $2 label, $3 exercises (empty: all)
  python3 - "$@" <<'PY'
import os, subprocess, sys
sys.path.insert(0, "scripts")
import exercises as X, exercise_pack as P
pack, label, only = sys.argv[1:4]
code = [e for e in X.EXERCISES if not e.bug and (not only or e.name in only.split())]
lines = P.answer_lines(code)
bad = []
for d, _, names in os.walk(pack):
    for n in names:
        f = os.path.join(d, n)
        rel = os.path.relpath(f, pack)
        if os.path.islink(f) or rel.startswith("build/exercises/"):
            continue
        with open(f, "rb") as h:
            blob = h.read()
        binary = b"\0" in blob
        text = subprocess.run(["strings", "-n", "6", f], capture_output=True, text=True).stdout if binary \
            else blob.decode(errors="replace")
        bad += [f"{rel}: {c!r} ({lines[c]})" for c in P.mentions(text, lines)]
print(f"NZRESULT {'FAIL' if bad else 'PASS'} pack.{label}.holds_no_answer_line"
      f" ({len(lines)} lines of {len(code)} exercises looked for)" + "".join("\n  " + b for b in bad[:20]))
PY
}

grade() {  # $1 pack, $2 label, $3 exercise, $4 real|wrong|uncut, $5 phrase the verdict must hold
  python3 - "$@" <<'PY'
import os, subprocess, sys
sys.path.insert(0, "scripts")
import exercises as X
pack, label, name, kind, phrase = sys.argv[1:6]
ex = X.BY_NAME[name]
real = open(ex.path).read()
body = "\n".join(X.region_body(real, ex.name))
if kind == "wrong":
    body = X.edited(body, ex.wrong[0][2], name) if isinstance(ex.wrong[0][2], list) else ex.wrong[0][2]
# the learner's copy, as the pack's `make exercise` writes it
mk = subprocess.run(["python3", "scripts/exercises.py", "make", name], cwd=pack, capture_output=True, text=True,
                    env=dict(os.environ, FORCE="1"))
copy = os.path.join(pack, "exercises", name, ex.file)
if kind == "uncut":  # the region filled in, the lines of other exercises cut from the trainer not written back
    text = X.with_region(open(copy).read(), name, body.split("\n"))
else:  # every line written: the real file, where the copy has the other exercises of the file as their TODOs
    handed = open(os.path.join(pack, "reference", "exercises.txt")).read().split()
    text = real
    for other in X.EXERCISES:
        if (other.path == ex.path and other is not ex and other.name in handed
                and X.BUILDS_ON.get(ex.name) != other.name):
            text = X.with_region(text, other.name, X.todo_lines(other))
    text = X.with_region(text, name, body.split("\n"))
os.makedirs(os.path.dirname(copy), exist_ok=True)
with open(copy, "w") as h:
    h.write(text)
c = subprocess.run(["python3", "scripts/exercises.py", "check", name], cwd=pack, capture_output=True, text=True,
                   timeout=400)
good = (c.returncode == 0) == (kind == "real") and phrase in c.stdout and (kind != "real" or mk.returncode == 0)
tail = " | ".join(l for l in c.stdout.splitlines() if l.startswith(("FAIL", "PASS")) or "hint" in l)
print(f"NZRESULT {'PASS' if good else 'FAIL'} pack.{label}.grades_{kind}_{name}"
      + ("" if good else f" (exit {c.returncode}): {mk.stderr} {tail} {c.stderr[-300:]}"))
PY
}

a=$tmp/assignment
set_a="stage1_reduce_scatter stage1_update_and_gather comm_rank_ordered_sum"
if make_pack "$a" assignment "$set_a"; then
  leaks "$a" assignment "$set_a"
  grade "$a" assignment comm_rank_ordered_sum real "PASS comm_rank_ordered_sum"
  grade "$a" assignment comm_rank_ordered_sum wrong "rank order"
  grade "$a" assignment stage1_update_and_gather real "PASS stage1_update_and_gather"
  grade "$a" assignment stage1_update_and_gather wrong "all-gather"
fi
b=$tmp/all
if make_pack "$b" all ""; then
  leaks "$b" all ""
  # the notebooks: no folded answer, no answer variants in the metadata, every exercise cell still there
  python3 - "$b" <<'PY'
import glob, json, os, sys
pack = sys.argv[1]
bad, cells = [], 0
for f in sorted(glob.glob("notebooks/*.ipynb")):
    mine, real = json.load(open(os.path.join(pack, f))), json.load(open(f))
    for c in mine["cells"]:
        src = "".join(c["source"])
        meta = c.get("metadata", {}).get("nanozero", {})
        if "<details>" in src or "accept" in meta or "wrong" in meta:
            bad.append(f"{f}: {src[:60]!r}")
        cells += "answer" in c.get("metadata", {}).get("tags", [])
    if len(mine["cells"]) != len(real["cells"]):
        bad.append(f"{f}: {len(mine['cells'])} cells, expected {len(real['cells'])}")
print(f"NZRESULT {'FAIL' if bad or not cells else 'PASS'} pack.all.notebooks_without_answers ({cells} exercise cells)"
      + "".join("\n  " + b for b in bad[:10]))
PY
  # the trainers whose lines of other exercises were cut: right once they are written back
  for e in stage2_reduce_scatter stage3_gather_release stage3_backward offload_optimizer \
           infinity_fetch_write_back zeropp_qgz_reduce; do
    grade "$b" all $e real "PASS $e"
  done
  grade "$b" all stage2_reduce_scatter uncut "still has 2 lines of other exercises to write back"
  # make exercise says where they are
  out=$(cd "$b" && FORCE=1 python3 scripts/exercises.py make stage2_reduce_scatter 2>&1)
  grep -q "also repeats 2 lines of other exercises" <<<"$out" &&
    grep -q "TODO(a line of exercise stage1_update_and_gather, cut from the student edition)" "$b/exercises/stage2_reduce_scatter/train.cpp" &&
    echo "NZRESULT PASS pack.all.make_exercise_names_the_cut_lines" || echo "NZRESULT FAIL pack.all.make_exercise_names_the_cut_lines: $out"
fi

# an OUT that is not empty: one line, exit 2, nothing changed
mkdir -p "$tmp/full" && echo keep >"$tmp/full/x"
out=$(python3 scripts/exercises.py pack "$tmp/full" 2>&1); rc=$?
[ $rc = 2 ] && [ "$(wc -l <<<"$out")" = 1 ] && [ "$(cat "$tmp/full/x")" = keep ] && [ "$(ls "$tmp/full")" = x ] &&
  echo "NZRESULT PASS pack.refuses_a_folder_that_is_not_empty" ||
  echo "NZRESULT FAIL pack.refuses_a_folder_that_is_not_empty (exit $rc): $out"
