#!/usr/bin/env bash
# `make diff A=stage1 B=stage2`: the lesson between two stages, as a unified diff of their train.cpp,
# then B's own files (a rung is a folder: its plan, its store, its formulas beside its train.cpp),
# each with its line count and its first line, the file's purpose. The exercise markers
# (`// begin exercise: NAME`, `// end exercise: NAME`, see scripts/exercises.py) are left out: they
# mark where a learner writes code, not what the stage teaches.
#   COLOR=auto|always|never   colour the lines that changed (default auto: on a terminal only;
#                             `COLOR=always ... | less -R` keeps the colours in a pager)
#   WORDS=1                   the words that changed, in colour, inside whole lines (git's
#                             --word-diff): clearest where a line changed by a word or two
set -euo pipefail
A=${1:?usage: make diff A=stage1 B=stage2}
B=${2:?usage: make diff A=stage1 B=stage2}
COLOR=${COLOR:-auto}
WORDS=${WORDS:-}
cd "$(dirname "$0")/.."
for d in "$A" "$B"; do
  [ -d "$d" ] || { echo "make diff: $d is not a directory; use two of $(sed -n 's/^+//; s/^\([a-z][a-z0-9_]*\).*/\1/p' stages.txt | tr '\n' ' ')" >&2; exit 2; }
done
case "$COLOR" in
  auto | always | never) ;;
  *) echo "error: COLOR=$COLOR, expected auto, always or never; e.g. make diff A=$A B=$B COLOR=always" >&2; exit 2 ;;
esac
case "$WORDS" in
  "" | 0) WORDS= ;;
  1) command -v git >/dev/null 2>&1 || { echo "error: WORDS=1 needs git, expected it on PATH; install git or drop WORDS=1" >&2; exit 2; } ;;
  *) echo "error: WORDS=$WORDS, expected 1 or 0; e.g. make diff A=$A B=$B WORDS=1" >&2; exit 2 ;;
esac
# auto: decided here, where stdout is still the terminal (diff and git below write into a pipe)
if [ "$COLOR" = auto ]; then
  if [ -t 1 ]; then COLOR=always; else COLOR=never; fi
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for d in "$A" "$B"; do
  mkdir -p "$tmp/$d"
  [ -f "$d/train.cpp" ] && grep -v '// \(begin\|end\) exercise: ' "$d/train.cpp" >"$tmp/$d/train.cpp" || true
done
# B's own files: every file of B but its train.cpp that A does not hold the same
own=()
for f in "$B"/*; do
  n=${f##*/}
  [ -f "$f" ] && [ "$n" != train.cpp ] && ! cmp -s "$f" "$A/$n" && own+=("$f")
done
cd "$tmp"
if [ -n "$WORDS" ]; then
  # WORDS=1 is for reading on a screen: coloured unless COLOR=never, which marks the words
  # [-removed-]{+added+} instead
  if [ "$COLOR" = never ]; then words=(--color=never --word-diff=plain); else words=(--color=always --word-diff=color); fi
  git -c core.pager=cat diff --no-index "${words[@]}" "$A" "$B" || true
elif [ "$COLOR" = always ] && diff --color=always /dev/null /dev/null >/dev/null 2>&1; then
  diff -ru --color=always "$A" "$B" || true
else  # plain, or a diff without --color (not GNU diffutils)
  diff -ru "$A" "$B" || true
fi
cd - >/dev/null
if [ ${#own[@]} -gt 0 ]; then
  echo
  echo "$B's own files (the rung's code beside its train.cpp):"
  for f in "${own[@]}"; do
    echo "  $f ($(wc -l <"$f") lines)"
    echo "      $(head -n 1 "$f" | sed 's,^// [^ ]* — ,,')"
  done
fi
