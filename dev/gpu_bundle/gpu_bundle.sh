#!/usr/bin/env bash
# gpu_bundle.sh — gathers what tests/cuda/gpu_check.sh runs on a GPU machine into one folder (make
# gpu-bundle calls it after building the binaries with NZ_BUNDLE=1). That machine has the NVIDIA
# driver, the CUDA toolkit (cuBLAS) and PyTorch's Python environment (NCCL as a pip package), but no
# MPI and no GoogleTest, and can install nothing, so the folder carries the rest:
#   bin/      the trainers           tests/   test_cuda_{kernels,comm,stages,inference,quantize}
#                                               (GoogleTest linked in),
#             all xz-compressed, unpacked beside themselves on first use by bundle_env.sh
#   mpi/      MPICH's launcher (mpiexec.hydra, hydra_pmi_proxy) behind mpi/mpirun
#   lib/      every shared library those need that is not in host_libs.txt; the two large ones
#             (MPICH, OpenBLAS) xz-compressed, unpacked at run time by bundle_env.sh
#   data/     the corpus             scripts/ tour_table.py (the memory table, with the machine's Python)
#   gpu_check.sh speed_args.txt gtest_run.sh bundle_env.sh bundle_check.sh host_libs.txt
#   golden_losses.tsv (the speed rows' losses on the CPU, when make gpu-rehearsal has computed them
#             for this build: golden_key.txt names the build)
# and ends by running bundle_check.sh: every binary's libraries resolve inside the bundle or to a
# library host_libs.txt says the GPU machine provides.
#   bash dev/gpu_bundle/gpu_bundle.sh BUILD_DIR OUT_DIR
set -euo pipefail
cd "$(dirname "$0")/../.."  # the repository
src=${1:?usage: gpu_bundle.sh BUILD_DIR OUT_DIR}
out=${2:?usage: gpu_bundle.sh BUILD_DIR OUT_DIR}
max_mib=${NZ_BUNDLE_MAX_MIB:-48}
compress_over=$((4 * 1024 * 1024))  # libraries larger than this travel xz-compressed

tests="test_cuda_kernels test_cuda_comm test_cuda_stages test_cuda_inference test_cuda_quantize"
rm -rf "$out.tmp" && mkdir -p "$out.tmp"/{bin,tests,mpi,lib,data,scripts}
for f in "$src"/bin/*; do strip -o "$out.tmp/bin/${f##*/}" "$f"; done
for t in $tests; do strip -o "$out.tmp/tests/$t" "$src/tests/$t"; done
# The programs travel xz-compressed too: each carries the whole library and the kernels for sm_90
# (about 4 MiB, 1 compressed). bundle_env.sh unpacks each beside itself on first use.
for f in "$out.tmp"/bin/* "$out.tmp"/tests/*; do
  xz -9 -T2 -c "$f" >"$f.xz" && touch -r "$f" "$f.xz" && rm "$f"
done

# MPICH's launcher: mpiexec.hydra starts one hydra_pmi_proxy per host, found beside itself.
hydra=$(readlink -f "$(command -v mpiexec.hydra || command -v mpiexec)")
cp "$hydra" "$out.tmp/mpi/mpiexec.hydra"
cp "$(dirname "$hydra")/hydra_pmi_proxy" "$out.tmp/mpi/"
cat >"$out.tmp/mpi/mpirun" <<'EOF'
#!/usr/bin/env bash
# mpirun of the bundle: MPICH's hydra launcher with the bundle's libraries. Hydra starts ranks on
# this host by fork (no ssh), and unlike Open MPI it needs no flag to run as root. Where this
# machine's own name does not resolve (a container's made-up hostname), or NZ_MPIRUN_LOCAL=1, the
# launcher and its proxy meet on 127.0.0.1 over lo instead of looking the name up.
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
export LD_LIBRARY_PATH=$here/../lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export HYDRA_LAUNCHER=${HYDRA_LAUNCHER:-fork}
name=${HOSTNAME:-$(uname -n 2>/dev/null)}
if [ "${NZ_MPIRUN_LOCAL:-0}" = 1 ] || ! getent hosts "$name" >/dev/null 2>&1; then
  export HYDRA_HOST_FILE=${HYDRA_HOST_FILE:-$here/hosts.local} HYDRA_IFACE=${HYDRA_IFACE:-lo}
fi
exec "$here/mpiexec.hydra" "$@"
EOF
echo 127.0.0.1 >"$out.tmp/mpi/hosts.local"
chmod +x "$out.tmp/mpi/mpirun"

cp stages.txt tests/cuda/gpu_check.sh tests/cuda/speed_args.txt tests/lib/gtest_run.sh dev/gpu_bundle/bundle_env.sh dev/gpu_bundle/bundle_check.sh dev/gpu_bundle/host_libs.txt "$out.tmp/"
cp data/corpus.txt "$out.tmp/data/"
cp scripts/tour_table.py "$out.tmp/scripts/"

# The libraries: everything ldd resolves (transitively) that host_libs.txt does not name.
allowed=$(grep -v '^#' dev/gpu_bundle/host_libs.txt | awk 'NF {print $1}')
is_host_lib() { grep -qxF "$1" <<<"$allowed"; }
for f in "$src"/bin/* $(printf "$src/tests/%s " $tests) \
         "$out.tmp"/mpi/mpiexec.hydra "$out.tmp"/mpi/hydra_pmi_proxy; do
  ldd "$f" | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}'
done | sort -u | while read -r name path; do
  is_host_lib "$name" && continue
  [ -e "$out.tmp/lib/$name" ] || [ -e "$out.tmp/lib/$name.xz" ] && continue
  if [ "$(stat -Lc %s "$path")" -gt $compress_over ]; then
    xz -9 -T2 -c "$path" >"$out.tmp/lib/$name.xz"
  else
    cp -L "$path" "$out.tmp/lib/$name"
  fi
done

cat >"$out.tmp/README.txt" <<EOF
nanoZeRO GPU bundle, built $(date -u +%Y-%m-%dT%H:%MZ) from commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')
with $(nvcc --version | grep -o 'release [0-9.]*') for sm_$(echo ${NZ_BUNDLE_ARCH:-90} | tr ' ' ',') and $(mpichversion 2>/dev/null | grep -m1 -o 'MPICH Version:.*' | tr -s ' \t' ' ' || echo MPICH).
Run on the GPU machine:   OUT=dir bash gpu_check.sh   (prints its table whatever happens, within 7 minutes;
                          table.txt, rows.tsv, reports.json and logs.tar.gz in dir)
Check the libraries:      bash bundle_check.sh     (every binary resolves here or to host_libs.txt)
EOF

# The golden losses of the speed rows (tests/cuda/speed_args.txt on the CPU, bf16 and fp32: make
# gpu-rehearsal computes them, minutes) depend on the trainer's code, the flags (not the comments) and
# the data: the key of those, and the losses already computed for it, if any.
key=$(cat "$src/bin/stage0_ddp" <(grep -v '^#' tests/cuda/speed_args.txt) data/corpus.txt | sha256sum | cut -c1-16)
echo "$key" >"$out.tmp/golden_key.txt"
golden=${NZ_GOLDEN_CACHE:-$(dirname "$out")/gpu-rehearsal}/golden-$key.tsv
if [ -s "$golden" ]; then cp "$golden" "$out.tmp/golden_losses.tsv"
else echo "gpu-bundle: no golden losses for this build yet (its speed rows need them: make gpu-rehearsal)"; fi

rm -rf "$out" && mv "$out.tmp" "$out"
mib=$(du -sm "$out" | cut -f1)
echo "gpu-bundle: $out, $mib MiB ($(du -sb "$out" | cut -f1) bytes; at most $max_mib MiB)"
if [ "$mib" -gt "$max_mib" ]; then
  echo "gpu-bundle: $out is $mib MiB, expected at most $max_mib MiB: look at du -a $out | sort -n | tail" >&2
  exit 1
fi
# The check unpacks the programs beside themselves: run it on a copy, so the bundle stays compressed.
check_copy=$(mktemp -d "${TMPDIR:-/tmp}/nanozero-bundle-check.XXXXXX")
trap 'rm -rf "$check_copy"' EXIT
cp -r "$out" "$check_copy/"
bash "$check_copy/${out##*/}/bundle_check.sh"
