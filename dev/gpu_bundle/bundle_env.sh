# bundle_env.sh — sourced (not run) by the GPU bundle's gpu_check.sh and bundle_check.sh:
#   source bundle_env.sh; bundle_env BUNDLE_DIR
# Makes the bundle runnable where it lies:
#   - unpacks its xz-compressed programs (bin/*.xz, tests/*.xz) beside themselves, once;
#   - unpacks its xz-compressed libraries (lib/*.xz) once into a cache outside the bundle
#     ($NZ_BUNDLE_CACHE, default /tmp/nanozero-bundle-libs.<size of the bundle's lib/>), with xz or,
#     where xz is missing, Python's lzma;
#   - finds the libraries host_libs.txt says come from the machine (cuBLAS, NCCL) in the usual places:
#     $NZ_LIB_DIRS, LD_LIBRARY_PATH, ldconfig's cache, the CUDA toolkit, and every Python
#     environment's site-packages/nvidia/*/lib (PyTorch's NCCL: nvidia-nccl-cu13 -> nvidia/nccl/lib);
#     with NZ_LIB_DIRS_ONLY=1, only in $NZ_LIB_DIRS;
#   - puts the bundle's mpirun first on PATH and all those folders on LD_LIBRARY_PATH.
# Sets bundle_lib_dirs (where each host library was found, "name=dir" lines) and bundle_missing
# (the host libraries found nowhere); returns 1 when something could not be done (bundle_problem
# says what).

bundle_pythons() {  # every Python interpreter worth asking for its site-packages
  local p
  for p in python3 python /opt/conda/bin/python /usr/local/bin/python3 /usr/bin/python3 "$HOME/.local/bin/python3"; do
    command -v "$p" 2>/dev/null
  done | awk '!seen[$0]++'
}

bundle_candidate_dirs() {  # folders that may hold a host library, most specific first
  local d py
  # NZ_LIB_DIRS_ONLY=1: $NZ_LIB_DIRS and nothing else (the check's own tests: what they find must
  # not depend on what the machine they run on happens to have installed)
  [ "${NZ_LIB_DIRS_ONLY:-}" = 1 ] && { tr ':' '\n' <<<"${NZ_LIB_DIRS:-}"; return 0; }
  tr ':' '\n' <<<"${NZ_LIB_DIRS:-}:${LD_LIBRARY_PATH:-}"
  [ -n "${CUDA_HOME:-}" ] && echo "$CUDA_HOME/lib64"
  d=$(command -v nvcc 2>/dev/null) && echo "$(dirname "$(dirname "$d")")/lib64"
  echo /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib /usr/lib/x86_64-linux-gnu /usr/lib64 | tr ' ' '\n'
  for py in $(bundle_pythons); do
    timeout 20 "$py" - 2>/dev/null <<'EOF'
import glob, os, site, sys
roots = list(getattr(site, "getsitepackages", lambda: [])()) + [site.getusersitepackages()] + sys.path
for r in dict.fromkeys(roots):
    for d in sorted(glob.glob(os.path.join(r, "nvidia", "*", "lib"))):
        print(d)
EOF
  done
  ls -d /usr/local/lib/python3*/dist-packages/nvidia/*/lib /usr/local/lib/python3*/site-packages/nvidia/*/lib \
    /opt/conda/lib/python3*/site-packages/nvidia/*/lib /usr/lib/python3/dist-packages/nvidia/*/lib 2>/dev/null
}

bundle_find_lib() {  # soname -> the folder that holds it (first match), or nothing
  local name=$1 d
  while read -r d; do
    [ -n "$d" ] && [ -e "$d/$name" ] && { echo "$d"; return 0; }
  done < <(bundle_candidate_dirs)
  [ "${NZ_LIB_DIRS_ONLY:-}" = 1 ] && return 1
  d=$(ldconfig -p 2>/dev/null | awk -v n="$name" '$1 == n && /x86-64/ {print $NF; exit}')
  [ -n "$d" ] && { dirname "$d"; return 0; }
  return 1
}

bundle_unxz() {  # file.xz -> out (atomically: a killed unpack leaves nothing half-written)
  if command -v xz >/dev/null 2>&1; then
    xz -dc "$1" >"$2.part" && mv "$2.part" "$2" && return 0
  fi
  local py
  for py in $(bundle_pythons); do
    "$py" -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], "wb"))' \
      "$1" "$2.part" 2>/dev/null && mv "$2.part" "$2" && return 0
  done
  rm -f "$2.part"
  return 1
}

bundle_env() {
  local dir name d f cache
  dir=$(cd "$1" && pwd) || { bundle_problem="no bundle at $1"; return 1; }
  export NZ_BUNDLE_DIR=$dir
  bundle_problem="" bundle_lib_dirs="" bundle_missing=""
  for f in "$dir"/bin/*.xz "$dir"/tests/*.xz; do
    [ -e "$f" ] || continue
    [ -s "${f%.xz}" ] && continue
    { bundle_unxz "$f" "${f%.xz}" && chmod +x "${f%.xz}"; } ||
      { bundle_problem="cannot unpack $f beside itself (a read-only bundle? copy it somewhere writable)"; return 1; }
  done
  cache=${NZ_BUNDLE_CACHE:-${TMPDIR:-/tmp}/nanozero-bundle-libs.$(cat "$dir"/lib/* 2>/dev/null | cksum | cut -d' ' -f1)}
  mkdir -p "$cache" || { bundle_problem="cannot create $cache (set NZ_BUNDLE_CACHE to a writable folder)"; return 1; }
  for f in "$dir"/lib/*.xz; do
    [ -e "$f" ] || continue
    name=${f##*/}; name=${name%.xz}
    [ -s "$cache/$name" ] && continue
    bundle_unxz "$f" "$cache/$name" || { bundle_problem="cannot unpack $f (neither xz nor Python's lzma works)"; return 1; }
  done
  export NZ_BUNDLE_CACHE=$cache
  local path_dirs="$cache:$dir/lib"
  while read -r name; do
    case "$name" in libcublas* | libnccl*) ;; *) continue ;; esac  # the driver (libcuda) is found by the CUDA runtime itself
    if d=$(bundle_find_lib "$name"); then
      bundle_lib_dirs+="$name=$d"$'\n'
      case ":$path_dirs:" in *":$d:"*) ;; *) path_dirs+=":$d" ;; esac
    else
      bundle_missing+="$name "
    fi
  done < <(grep -v '^#' "$dir/host_libs.txt" | awk 'NF {print $1}')
  export LD_LIBRARY_PATH=$path_dirs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  export PATH=$dir/mpi:$PATH
  export HYDRA_LAUNCHER=${HYDRA_LAUNCHER:-fork}
  return 0
}
