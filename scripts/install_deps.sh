#!/usr/bin/env bash
# Installs what nanoZeRO needs and is missing: a C++ compiler and make, MPICH, GoogleTest, OpenBLAS,
# nlohmann-json (header-only: DeepSpeed's config files, --config), and
# Python 3 with the notebook packages (requirements.txt, pinned) in a virtual environment .venv/.
# As root it installs with apt-get; otherwise it prints the exact command to run and stops.
# nvcc is optional: when it is on PATH the CUDA backend is built too.
# --explorer (make test): also the explorer's compiler and browsers (docs/explorer.md): emscripten
# (em++: zero_estimate to WebAssembly); chromium, chromium-driver and firefox-esr (its browser test).
# --explore (make explore): only what the page needs to be built and served: emscripten and python3
# (not the trainers' packages, the test's browsers or the notebooks' .venv).
# --slurm (make slurm-check): only Slurm's controller, node daemon and client, and munge (its
# authentication), to run a private one-node Slurm (tests/cluster/slurm_check.sh, docs/cluster.md).
# apt-get waits up to 2 minutes for a lock another apt holds; when it still fails, its own message is
# shown, with a line saying so where the lock is held.
set -euo pipefail
explorer=0 explore_only=0 slurm=0
case "${1:-}" in
  "") ;;
  --explorer) explorer=1 ;;
  --explore) explorer=1 explore_only=1 ;;
  --slurm) slurm=1 ;;
  *) echo "error: install_deps.sh $1: expected no option, --explorer (make test), --explore (make explore) or --slurm (make slurm-check)" >&2; exit 2 ;;
esac
cd "$(dirname "$0")/.."

# apt-get ARGS..., without its progress: its error lines (E:, W:) are shown, and a lock held by another
# process is said in so many words, so that "did not install" is never the only line.
apt_locked=0
apt_run() {
  local log rc=0
  log=$(mktemp)
  DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=120 "$@" >"$log" 2>&1 || rc=$?
  if [ $rc != 0 ]; then
    grep -E '^(E|W|Err):' "$log" | head -4 >&2 || tail -3 "$log" >&2
    if grep -qi 'could not get lock\|unable to acquire the dpkg\|is held by process' "$log"; then
      echo "apt is locked by another process (above): run the same command again once it is done" >&2
      apt_locked=1
    fi
  fi
  rm -f "$log"
  return $rc
}

# --slurm: Slurm and munge only (the trainers' packages are make's own business); apt-get update first.
if [ $slurm = 1 ]; then
  slurm_missing=()
  for c in slurmctld slurmd; do command -v $c >/dev/null 2>&1 || slurm_missing+=($c); done
  command -v sbatch >/dev/null 2>&1 || slurm_missing+=(slurm-client)
  command -v munged >/dev/null 2>&1 || slurm_missing+=(munge)
  [ ${#slurm_missing[@]} = 0 ] && exit 0
  if [ "$(id -u)" != 0 ]; then
    echo "make slurm-check needs: ${slurm_missing[*]}"
    echo "run as root:  sudo sh -c 'apt-get update && apt-get install -y --no-install-recommends ${slurm_missing[*]}'"
    exit 1
  fi
  echo "installing for make slurm-check: ${slurm_missing[*]}"
  apt_run update -qq || true  # (a failed update: its message, then the install says)
  apt_run install -y -qq --no-install-recommends "${slurm_missing[@]}"
  exit 0
fi

# The Debian name of this machine's architecture's library folder: x86_64-linux-gnu, aarch64-linux-gnu, ...
multiarch=$(gcc -print-multiarch 2>/dev/null || true)
missing=()
optional=()
if [ $explore_only = 0 ]; then
command -v g++ >/dev/null 2>&1 || missing+=(g++)
command -v make >/dev/null 2>&1 || missing+=(make)
command -v mpicxx >/dev/null 2>&1 && command -v mpirun >/dev/null 2>&1 || missing+=(mpich libmpich-dev)
[ -f /usr/include/gtest/gtest.h ] && { [ -f "/usr/lib/$multiarch/libgtest.a" ] || [ -f /usr/lib/libgtest.a ] || ls /usr/lib/*/libgtest.* >/dev/null 2>&1; } || missing+=(libgtest-dev)
command -v python3 >/dev/null 2>&1 || missing+=(python3)
python3 -c 'import venv, ensurepip' >/dev/null 2>&1 || missing+=(python3-venv)
command -v timeout >/dev/null 2>&1 || missing+=(coreutils)
# OpenBLAS, its OpenMP build: the CPU's fast matrix products (see the Makefile's BLAS lines)
[ -f "/usr/include/$multiarch/openblas-openmp/cblas.h" ] || missing+=(libopenblas-openmp-dev)
# oneDNN: bf16 matrix products on the CPU's bf16 instructions, where it has them (common/kernels/gemm_bf16.h).
# Debian builds it for x86-64 and 64-bit ARM, not for every architecture: beyond x86-64 it is optional,
# installed where apt has it, and the Makefile builds without it where it is absent (DNNL=0).
if [ ! -f /usr/include/oneapi/dnnl/dnnl.hpp ]; then
  if [ "$multiarch" = x86_64-linux-gnu ]; then missing+=(libdnnl-dev); else optional+=(libdnnl-dev); fi
fi
# nlohmann-json, header-only: reads DeepSpeed's config files (common/input/ds_config.cpp, --config)
[ -f /usr/include/nlohmann/json.hpp ] || missing+=(nlohmann-json3-dev)
# libsodium: the Ed25519 signatures of a course's quiz certificates (tools/zero_quiz.cpp, make course-keys)
[ -f /usr/include/sodium.h ] || missing+=(libsodium-dev)
else
  command -v python3 >/dev/null 2>&1 || missing+=(python3)  # make explore's server
fi
# --explorer: installed apart from the rest, and not required: where apt cannot install them (on
# Ubuntu `chromium` and `firefox` are snaps, which a container cannot run) the browser test says SKIP.
explorer_missing=()
if [ $explorer = 1 ]; then
  command -v em++ >/dev/null 2>&1 || explorer_missing+=(emscripten)
  if [ $explore_only = 0 ]; then  # the browser test's
    command -v chromium >/dev/null 2>&1 || explorer_missing+=(chromium)
    command -v chromedriver >/dev/null 2>&1 || explorer_missing+=(chromium-driver)
    command -v firefox-esr >/dev/null 2>&1 || command -v firefox >/dev/null 2>&1 || explorer_missing+=(firefox-esr)
  fi
fi

# An optional package is wanted where apt has it (asked again after apt-get update, below).
apt_has() { apt-cache show "$1" >/dev/null 2>&1; }
for p in "${optional[@]}"; do apt_has "$p" && missing+=("$p"); done

if [ ${#missing[@]} -gt 0 ]; then
  cmd="apt-get update && apt-get install -y --no-install-recommends ${missing[*]}"
  if [ "$(id -u)" = 0 ]; then
    export DEBIAN_FRONTEND=noninteractive
    apt_run update -qq
    for p in "${optional[@]}"; do [[ " ${missing[*]} " != *" $p "* ]] && apt_has "$p" && missing+=("$p"); done
    echo "installing: ${missing[*]}"
    apt_run install -y -qq --no-install-recommends "${missing[@]}"
  else
    echo "nanoZeRO needs: ${missing[*]}"
    echo "run as root:  sudo sh -c '$cmd'"
    echo "then run the same make command again."
    exit 1
  fi
fi

if [ ${#explorer_missing[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ]; then
    echo "installing for the explorer: ${explorer_missing[*]}"
    [ ${#missing[@]} -gt 0 ] || apt_run update -qq || true  # (a failed update: its message, then each install says)
    # one at a time: a package apt lacks or cannot set up here costs only its own part of the test
    for p in "${explorer_missing[@]}"; do
      if [ $apt_locked = 1 ]; then  # (no second wait for the same lock)
        echo "$p not installed, apt being locked: the explorer's parts that need it will say SKIP"
      else
        apt_run install -y -qq --no-install-recommends "$p" ||
          echo "$p did not install (apt's message above): the explorer's parts that need it will say SKIP"
      fi
    done
  else
    echo "the explorer needs: ${explorer_missing[*]} (its browser test says SKIP without them)"
    echo "run as root:  sudo sh -c 'apt-get update && apt-get install -y --no-install-recommends ${explorer_missing[*]}'"
  fi
fi

# Python packages for the notebooks and plots, pinned, in .venv (never the system Python); not for make
# explore, whose page runs none of them.
if [ $explore_only = 0 ] && [ -f requirements.txt ]; then
  stamp=.venv/.requirements.stamp
  if [ ! -f "$stamp" ] || ! cmp -s requirements.txt "$stamp"; then
    echo "setting up .venv with requirements.txt (once)"
    python3 -m venv .venv
    .venv/bin/pip install -q --disable-pip-version-check -r requirements.txt
    cp requirements.txt "$stamp"
  fi
fi
exit 0
