#!/usr/bin/env bash
# make_mutant.sh — the one recipe of every deliberately broken copy of a source (the mutants of
# tests/*/*mutants.mk and tests/compress/compress.mk): SRC with sed's changes, written to OUT only
# when sed changed exactly LINES lines of it. Otherwise the build stops and names the mutant: a
# refactor that makes a pattern miss (or hit twice) can never silently turn a mutant back into the
# real code. Prints the lines it changed.
#   make_mutant.sh MKFILE NAME LINES SRC OUT SED_ARG...
set -u
[ $# -ge 6 ] || { echo "usage: make_mutant.sh MKFILE NAME LINES SRC OUT SED_ARG... (got $# arguments)" >&2; exit 2; }
mk=$1 name=$2 lines=$3 src=$4 out=$5
shift 5
sed "$@" "$src" >"$out.tmp" || { rm -f "$out.tmp"; exit 1; }
n=$(diff "$src" "$out.tmp" | grep -c '^>')
if [ "$n" != "$lines" ]; then
  echo "$mk: $name must change $lines line(s) of $src, but its sed changed $n: $src was changed;" \
       "update the sed of $name in $mk"
  rm -f "$out.tmp"
  exit 1
fi
mv "$out.tmp" "$out"
echo "$name:"
diff "$src" "$out" | grep '^>' | sed 's/^> */  /'
