#!/usr/bin/env bash
# build_check.sh — the Makefile's choice of backend and its rebuild on a changed configuration,
# where a first-time user meets them (a few seconds: one small object compiled a few times, in a
# build folder of its own):
#   cuda_home_without_nvcc  a CUDA_HOME (from a container image or a shell profile) that holds no
#                           nvcc, and no nvcc on PATH: the CPU backend, said in one line on stderr;
#                           nothing of the CUDA backend in the flags or the commands
#   cuda_home_with_nvcc     a toolkit whose bin/ is not on PATH, named by CUDA_HOME: the CUDA
#                           backend, with that toolkit's nvcc and headers (SKIP without a toolkit)
#   config_change_rebuilds  an object compiled for one configuration is up to date for the same one
#                           and recompiled, with the new flags, for another (-march; CUDA on/off
#                           where nvcc runs); the stamp names the configuration
#   dry_run_and_flags_keep  make -n and make print-build-flags with other settings leave the stamp
#   plain_make_means_all    `make` with no goal, in a build folder that already holds objects, builds
#                           the programs (a rule whose targets are the objects found must not become
#                           the default goal)
# Prints NZRESULT lines (tests/run_all.sh).
set -u
cd "$(dirname "$0")/../.." || exit 1
# make as a user's shell starts it, not as a sub-make of `make test` (whose MAKELEVEL and MAKEFLAGS
# the environment carries here)
unset MAKELEVEL MAKEFLAGS MFLAGS
tmp=$(mktemp -d /tmp/nanozero-buildcheck.XXXXXX)
trap 'rm -rf "$tmp"' EXIT

pass() { echo "NZRESULT PASS BuildCheck.$1"; }
fail() { echo "NZRESULT FAIL BuildCheck.$1: $2"; }
skip() { echo "NZRESULT SKIP BuildCheck.$1 ($2)"; }

# A PATH with the MPI compiler wrapper and the usual tools but no nvcc: the folders of PATH that
# hold no nvcc.
nonvcc_path=$(tr ':' '\n' <<<"$PATH" | while read -r d; do [ -n "$d" ] && [ ! -e "$d/nvcc" ] && echo "$d"; done | paste -sd: -)
mk() { make --no-print-directory "$@"; }

# ---- a CUDA_HOME without nvcc ----
mkdir -p "$tmp/empty-cuda"
out=$(env PATH="$nonvcc_path" CUDA_HOME="$tmp/empty-cuda" make --no-print-directory -s BUILD="$tmp/b0" print-build-flags 2>"$tmp/err")
cmds=$(env PATH="$nonvcc_path" CUDA_HOME="$tmp/empty-cuda" make --no-print-directory -n BUILD="$tmp/b0" "$tmp/b0/bin/stage0_ddp" 2>/dev/null)
lines=$(grep -c . "$tmp/err")
if grep -q -- '-DNZ_HAVE_CUDA' <<<"$out"; then
  fail cuda_home_without_nvcc "the CUDA backend is chosen: $(grep '^CXXFLAGS' <<<"$out")"
elif grep -q -e 'nvcc' -e '-lcudart' <<<"$cmds"; then
  fail cuda_home_without_nvcc "the build runs nvcc or links the CUDA runtime: $(grep -m1 -e nvcc -e cudart <<<"$cmds" | cut -c1-160)"
elif [ "$lines" != 1 ] || ! grep -q "CUDA_HOME=$tmp/empty-cuda holds no nvcc.*CPU backend only" "$tmp/err"; then
  fail cuda_home_without_nvcc "expected one line naming CUDA_HOME and the CPU backend on stderr, got $lines: $(head -c 300 "$tmp/err")"
else
  pass cuda_home_without_nvcc
fi

# ---- a toolkit off PATH, named by CUDA_HOME ----
nvcc_bin=$(command -v nvcc 2>/dev/null)
if [ -n "$nvcc_bin" ] && nvcc --version >/dev/null 2>&1; then
  kit=$(dirname "$(dirname "$nvcc_bin")")
  out=$(env PATH="$nonvcc_path" CUDA_HOME="$kit" make --no-print-directory -s BUILD="$tmp/b0" print-build-flags 2>"$tmp/err")
  if grep -q -- "-DNZ_HAVE_CUDA.*-I$kit/include" <<<"$out" && [ ! -s "$tmp/err" ]; then
    pass cuda_home_with_nvcc
  else
    fail cuda_home_with_nvcc "CUDA_HOME=$kit (nvcc there, not on PATH): $(grep '^CXXFLAGS' <<<"$out" | cut -c1-200) $(head -c 200 "$tmp/err")"
  fi
else
  skip cuda_home_with_nvcc "no CUDA toolkit on this machine"
fi

# ---- a changed configuration recompiles ----
# One small object of the library, in a build folder of its own: -march first (every machine can
# compile for x86-64-v3 and for itself on x86-64; armv8-a and native on ARM), then CUDA on and off.
obj=obj/common/runtime/check.o
case $(uname -m) in
  x86_64) arch_a=x86-64-v3 ;;
  aarch64) arch_a=armv8-a ;;
  *) arch_a="" ;;
esac
B=$tmp/b1
if [ -z "$arch_a" ]; then
  skip config_change_rebuilds "no second -march known for $(uname -m)"
else
  problem=""
  mk BUILD="$B" CUDA=0 HOST_ARCH="$arch_a" "$B/$obj" >"$tmp/log1" 2>&1 || problem="first build failed: $(tail -2 "$tmp/log1")"
  if [ -z "$problem" ]; then
    # the same configuration: up to date (make -q exits 0)
    mk -q BUILD="$B" CUDA=0 HOST_ARCH="$arch_a" "$B/$obj" || problem="the same configuration rebuilds"
  fi
  if [ -z "$problem" ]; then
    # another -march: the object is out of date, and recompiled with the new flag
    mk BUILD="$B" CUDA=0 HOST_ARCH=native "$B/$obj" >"$tmp/log2" 2>&1 || problem="the rebuild failed: $(tail -2 "$tmp/log2")"
    grep -q -- "-c common/runtime/check.cpp" "$tmp/log2" || problem="${problem:-HOST_ARCH $arch_a -> native did not recompile $obj: $(head -c 300 "$tmp/log2")}"
    grep -q "build configuration changed" "$tmp/log2" || problem="${problem:-no line says the configuration changed}"
    grep -q -- "-march=native " "$B/config.flags" 2>/dev/null || problem="${problem:-the stamp does not hold the flags}"
  fi
  if [ -z "$problem" ] && [ -n "$nvcc_bin" ]; then
    # CUDA on, then off again: recompiled each time, -DNZ_HAVE_CUDA following the setting
    mk BUILD="$B" CUDA=1 HOST_ARCH=native "$B/$obj" >"$tmp/log3" 2>&1 || problem="the CUDA=1 build failed: $(tail -2 "$tmp/log3")"
    grep -q -- "-DNZ_HAVE_CUDA.*-c common/runtime/check.cpp" "$tmp/log3" || problem="${problem:-CUDA 0 -> 1 did not recompile $obj with the CUDA backend}"
    mk BUILD="$B" CUDA=0 HOST_ARCH=native "$B/$obj" >"$tmp/log4" 2>&1
    { grep -q -- "-c common/runtime/check.cpp" "$tmp/log4" && ! grep -q -- "-DNZ_HAVE_CUDA" "$tmp/log4"; } ||
      problem="${problem:-CUDA 1 -> 0 did not recompile $obj without the CUDA backend}"
  fi
  if [ -z "$problem" ]; then pass config_change_rebuilds; else fail config_change_rebuilds "$problem"; fi
fi

# ---- what must not rewrite the stamp ----
if [ -f "$B/config.flags" ]; then
  before=$(cat "$B/config.flags")
  mk -n BUILD="$B" CUDA=0 HOST_ARCH="${arch_a:-native}" "$B/$obj" >/dev/null 2>&1
  mk -s BUILD="$B" CUDA=0 HOST_ARCH="${arch_a:-native}" print-build-flags >/dev/null 2>&1
  if [ "$(cat "$B/config.flags")" = "$before" ] && mk -q BUILD="$B" CUDA=0 HOST_ARCH=native "$B/$obj"; then
    pass dry_run_and_flags_keep
  else
    fail dry_run_and_flags_keep "make -n or print-build-flags with other settings changed $B/config.flags (or the object went out of date)"
  fi
else
  skip dry_run_and_flags_keep "no stamp from the previous case"
fi

# ---- `make` alone, once objects exist: the programs ----
if [ -f "$B/$obj" ]; then
  plan=$(mk -n BUILD="$B" CUDA=0 HOST_ARCH=native 2>&1)
  if grep -q -- "-o $B/bin/stage0_ddp" <<<"$plan"; then
    pass plain_make_means_all
  else
    fail plain_make_means_all "make -n with no goal does not build $B/bin/stage0_ddp: $(head -c 200 <<<"$plan")"
  fi
else
  skip plain_make_means_all "no object from the previous cases"
fi
