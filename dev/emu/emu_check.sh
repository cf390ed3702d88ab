#!/usr/bin/env bash
# emu_check.sh — `make emu-check CU=file.cu [ARGS="..."]` (dev/emu.mk): one CUDA program (its kernels
# and a host main using the runtime API) built against nz_emu with every check on and run.
#   - each finding is one line "emu-check: KIND: ..." (race, uninit, bounds, misaligned, barrier,
#     stream-race)
#     and the program exits non-zero (66 for findings, dev/emu/check.h; a fatal one stops it);
#   - a clean program exits with its own status.
# The build happens in a temporary folder removed at the end; ARGS is split into words as the
# shell would (quotes, backslashes) but never evaluated: no expansion, no command runs.
# Set by the make rule: EMU_CHECK_CU, EMU_CHECK_ARGS (raw), EMU_CXX, EMU_FLAGS, EMU_LINK, EMU_LIB,
# EMU_LIBS; EMU_CHECK_TIMEOUT (seconds, default 120) bounds the run.
set -u
cu=${EMU_CHECK_CU:-}
limit=${EMU_CHECK_TIMEOUT:-120}
usage='expected: make emu-check CU=path/to/program.cu [ARGS="arguments"]'
if [ -z "$cu" ]; then echo "make emu-check: no program given (CU is empty); $usage" >&2; exit 2; fi
if [ ! -f "$cu" ]; then echo "make emu-check: $cu: no such file; $usage" >&2; exit 2; fi
case $limit in '' | *[!0-9]*) echo "make emu-check: EMU_CHECK_TIMEOUT=$limit is not a number of seconds" >&2; exit 2 ;; esac

# ARGS as words: Python's shlex splits like a POSIX shell without running anything
args=()
split_args='import shlex, sys; sys.stdout.write("".join(w + "\0" for w in shlex.split(sys.argv[1])))'
if ! python3 -c "$split_args" "${EMU_CHECK_ARGS:-}" >/dev/null 2>&1; then
  echo "make emu-check: ARGS=${EMU_CHECK_ARGS:-} cannot be split into words (an unclosed quote?)" >&2
  exit 2
fi
mapfile -d '' -t args < <(python3 -c "$split_args" "${EMU_CHECK_ARGS:-}")

dir=$(mktemp -d /tmp/nz-emu-check.XXXXXX) || exit 1
child=
cleanup() {
  [ -n "$child" ] && kill -- -"$child" 2>/dev/null
  rm -rf "$dir"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# The rewritten program keeps the file's name (compiled with -x c++), and the temporary folder is
# mapped back to the file's own in the debug information, so findings name file.cu's lines.
name=$(basename "$cu" .cu)
src_dir=$(cd "$(dirname "$cu")" && pwd)
if ! perl dev/emu/cu2cpp.pl "$cu" >"$dir/$(basename "$cu")"; then
  echo "make emu-check: $cu: the emulator cannot rewrite it (see the line above)" >&2
  exit 2
fi
# shellcheck disable=SC2086  # EMU_FLAGS, EMU_LINK, EMU_LIBS are lists of compiler options
if ! $EMU_CXX $EMU_FLAGS -I"$src_dir" -fdebug-prefix-map="$dir=$src_dir" -x c++ -c "$dir/$(basename "$cu")" \
       -o "$dir/$name.o" ||
   ! $EMU_CXX $EMU_LINK "$dir/$name.o" "$EMU_LIB" $EMU_LIBS -o "$dir/$name"; then
  echo "make emu-check: $cu does not compile against the emulator (the compiler's messages are above)" >&2
  exit 2
fi

# the run: its own process group, so a time-out ends everything it started
NZ_EMU_CHECK=all setsid timeout -k 5 "$limit" "$dir/$name" "${args[@]}" &
child=$!
{ wait "$child"; } 2>/dev/null  # no "Aborted" line from the shell: the program said why
rc=$?
child=
if [ $rc = 124 ] || [ $rc = 137 ]; then
  echo "make emu-check: $cu did not finish within $limit s and was stopped (a hang: a barrier or loop that never" \
       "ends? EMU_CHECK_TIMEOUT=seconds gives it longer)" >&2
fi
exit $rc
