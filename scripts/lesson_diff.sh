#!/usr/bin/env bash
# `make diff A=stage1 B=stage2`: the lesson between two stages, as a unified diff. The exercise
# markers (`// begin exercise: NAME`, `// end exercise: NAME`, see scripts/exercises.py) are left
# out: they mark where a learner writes code, not what the stage teaches.
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
  [ -d "$d" ] || { echo "make diff: $d is not a directory; use two of $(sed -n 's/^+//; /^[a-z]/p' stages.txt | tr '\n' ' ')" >&2; exit 2; }
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
  for f in "$d"/*; do
    [ -f "$f" ] && grep -v '// \(begin\|end\) exercise: ' "$f" >"$tmp/$f" || true
  done
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
