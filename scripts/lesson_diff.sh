#!/usr/bin/env bash
# `make diff A=stage1 B=stage2`: the lesson between two stages, as a unified diff. The exercise
# markers (`// begin exercise: NAME`, `// end exercise: NAME`, see scripts/exercises.py) are left
# out: they mark where a learner writes code, not what the stage teaches.
set -euo pipefail
A=${1:?usage: make diff A=stage1 B=stage2}
B=${2:?usage: make diff A=stage1 B=stage2}
cd "$(dirname "$0")/.."
for d in "$A" "$B"; do
  [ -d "$d" ] || { echo "make diff: $d is not a directory; use two of stage0_ddp stage1 stage2 stage3 offload" >&2; exit 2; }
done
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for d in "$A" "$B"; do
  mkdir -p "$tmp/$d"
  for f in "$d"/*; do
    [ -f "$f" ] && grep -v '// \(begin\|end\) exercise: ' "$f" >"$tmp/$f" || true
  done
done
cd "$tmp" && diff -ru "$A" "$B" || true
