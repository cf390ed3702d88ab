#!/usr/bin/env bash
# uses_toolkit.sh CUDA_HOME DEPFILE... — whether an object of the real build includes a header of the
# CUDA toolkit (exit 0) or not (exit 1), read from its dependency files (-MMD; a test object's and the
# precompiled header's). The emulator's build (dev/emu.mk) compiles the first kind again, against the
# emulator's headers (dev/emu/include/), and takes the real build's object for the second.
# Two ways to see it, because -MMD leaves out every header found in a system folder: a toolkit under
# one (/usr/local/include, where CUDA_HOME is /usr/local) never appears in the dependency file. So a
# path under CUDA_HOME is one sign, and the other is a file the dependency file names (the source, or
# a header of the project) with an #include of a header the emulator stands in for.
set -u
[ $# -ge 2 ] || { echo "uses_toolkit.sh: expected: uses_toolkit.sh CUDA_HOME DEPFILE... (CUDA_HOME may be empty)" >&2; exit 2; }
home=$1
shift
for d in "$@"; do
  [ -r "$d" ] || { echo "uses_toolkit.sh: $d: no such dependency file; expected the real build's OBJ.d (make all tests first)" >&2; exit 2; }
done
[ -n "$home" ] && grep -qF "$home/" "$@" && exit 0
here=$(cd "$(dirname "$0")" && pwd)
names=$(cd "$here/include" && ls -- *.h | sed 's/\./\\./g' | paste -sd'|')
# the files named: each line's words after the target's colon, less the line continuations
mapfile -t files < <(sed -e 's/^[^:]*://' -e 's/\\$//' "$@" | tr ' \t' '\n\n' | grep -v '^$' | sort -u)
[ ${#files[@]} -gt 0 ] || exit 1
# (a file that is gone counts as no include: the real object was compiled before it went, and make
# compiles that one again first)
grep -qsE "^[[:space:]]*#[[:space:]]*include[[:space:]]*<($names)>" -- "${files[@]}" && exit 0
exit 1
