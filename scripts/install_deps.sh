#!/usr/bin/env bash
# Installs what nanoZeRO needs and is missing: a C++ compiler and make, MPICH, GoogleTest, OpenBLAS,
# nlohmann-json (header-only: DeepSpeed's config files, --config), and
# Python 3 with the notebook packages (requirements.txt, pinned) in a virtual environment .venv/.
# As root it installs with apt-get; otherwise it prints the exact command to run and stops.
# nvcc is optional: when it is on PATH the CUDA backend is built too.
set -euo pipefail
cd "$(dirname "$0")/.."

missing=()
command -v g++ >/dev/null 2>&1 || missing+=(g++)
command -v make >/dev/null 2>&1 || missing+=(make)
command -v mpicxx >/dev/null 2>&1 && command -v mpirun >/dev/null 2>&1 || missing+=(mpich libmpich-dev)
[ -f /usr/include/gtest/gtest.h ] && { [ -f /usr/lib/x86_64-linux-gnu/libgtest.a ] || [ -f /usr/lib/libgtest.a ] || ls /usr/lib/*/libgtest.* >/dev/null 2>&1; } || missing+=(libgtest-dev)
command -v python3 >/dev/null 2>&1 || missing+=(python3)
python3 -c 'import venv, ensurepip' >/dev/null 2>&1 || missing+=(python3-venv)
command -v timeout >/dev/null 2>&1 || missing+=(coreutils)
# OpenBLAS, its OpenMP build: the CPU's fast matrix products (see the Makefile's BLAS lines)
[ -f "/usr/include/$(gcc -print-multiarch 2>/dev/null)/openblas-openmp/cblas.h" ] || missing+=(libopenblas-openmp-dev)
# oneDNN: bf16 matrix products on the CPU's bf16 instructions, where it has them (common/gemm_bf16.h)
[ -f /usr/include/oneapi/dnnl/dnnl.hpp ] || missing+=(libdnnl-dev)
# nlohmann-json, header-only: reads DeepSpeed's config files (common/ds_config.cpp, --config)
[ -f /usr/include/nlohmann/json.hpp ] || missing+=(nlohmann-json3-dev)

if [ ${#missing[@]} -gt 0 ]; then
  cmd="apt-get update && apt-get install -y --no-install-recommends ${missing[*]}"
  if [ "$(id -u)" = 0 ]; then
    echo "installing: ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq && apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  else
    echo "nanoZeRO needs: ${missing[*]}"
    echo "run as root:  sudo sh -c '$cmd'"
    echo "then run the same make command again."
    exit 1
  fi
fi

# Python packages for the notebooks and plots, pinned, in .venv (never the system Python).
if [ -f requirements.txt ]; then
  stamp=.venv/.requirements.stamp
  if [ ! -f "$stamp" ] || ! cmp -s requirements.txt "$stamp"; then
    echo "setting up .venv with requirements.txt (once)"
    python3 -m venv .venv
    .venv/bin/pip install -q --disable-pip-version-check -r requirements.txt
    cp requirements.txt "$stamp"
  fi
fi
exit 0
