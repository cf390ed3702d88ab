#!/usr/bin/env bash
# rehearsal.sh — `make gpu-rehearsal`: the GPU bundle's dress rehearsal on this machine, run by hand
# before a GPU slot (about 15-20 minutes on 2 cores the first time; not part of make test). It builds
# the real bundle (make gpu-bundle), copies it to a fresh folder and runs it under the GPU machine's
# conditions as far as a CPU machine allows, in a mount and hostname namespace of its own (root):
#   - a hostname that does not resolve (getent must fail for it);
#   - NCCL from PyTorch's pip wheel (nvidia-nccl-cu13, downloaded once into build/gpu-rehearsal/)
#     unpacked into a Python environment on PATH, the system's libnccl hidden, and the host_libs
#     row must say the wheel's nvidia/nccl/lib;
#   - the system's copies of every library the bundle carries (MPICH, UCX and its modules,
#     OpenBLAS, ...) hidden behind empty files, so that loading one fails instead of passing here;
#   - a minimal environment: env -i, PATH = that Python and a folder of links to /usr/bin, /bin,
#     /usr/sbin and /sbin without any MPI launcher or compiler wrapper;
# and there starts the bundled launcher with 2 ranks training on the CPU (and with each fallback the
# check's preflight may choose), one process without the launcher, the CUDA test binaries (they skip
# without a GPU but initialise MPI, UCX and the CUDA runtime), computes the golden losses of the
# speed rows with the bundle's own stage0_ddp on the CPU (bf16 and fp32, 3 steps each; cached in
# build/gpu-rehearsal/ under the build's key, and copied into build/gpu-bundle), and finally runs
# gpu_check.sh from the copy with OUT set (the GPU rows SKIP; what it leaves in OUT must fit what
# comes back from the GPU machine). One REHEARSAL PASS/FAIL line per step; exit 1 on any FAIL.
#   bash dev/gpu_bundle/rehearsal.sh          (make gpu-rehearsal)
set -u
cd "$(dirname "$0")/../.." || exit 1
repo=$(pwd)
cache=${NZ_REHEARSAL_CACHE:-$repo/build/gpu-rehearsal}

if [ "${1:-}" != --inside ]; then
  [ "$(id -u)" = 0 ] || { echo "error: the rehearsal needs root (a mount and hostname namespace), expected uid 0; run it as root"; exit 2; }
  tmp=$(mktemp -d /tmp/nanozero-rehearsal.XXXXXX)
  trap '[ -z "${NZ_KEEP_TEST_FILES:-}" ] && rm -rf "$tmp"' EXIT
  mkdir -p "$cache"
  : >"$tmp/steps"
  t0=$SECONDS
fi
step() {  # STATUS name detail
  printf 'REHEARSAL %-4s %-20s %s\n' "$1" "$2" "$3"
  printf '%s\t%s\t%s\n' "$1" "$2" "$3" >>"$tmp/steps"
}

if [ "${1:-}" != --inside ]; then
  # ---- here, with the machine as it is: the build, the copy, the wheel ----
  if make --no-print-directory gpu-bundle >"$tmp/build.log" 2>&1; then
    step PASS build "$(grep -m1 '^gpu-bundle: build' "$tmp/build.log")"
  else
    step FAIL build "make gpu-bundle failed: $(grep -m1 -i -e error -e 'expected' "$tmp/build.log" | cut -c1-150)"
    tail -20 "$tmp/build.log"
    exit 1
  fi
  cp -r build/gpu-bundle "$tmp/bundle" && step PASS copy "build/gpu-bundle -> $tmp/bundle"

  whl=$(ls "$cache"/wheels/nvidia_nccl_cu13-*.whl 2>/dev/null | tail -1)
  if [ -z "$whl" ]; then
    pip download --no-deps --only-binary=:all: --platform manylinux_2_18_x86_64 -d "$cache/wheels" nvidia-nccl-cu13 \
      >"$tmp/pip.log" 2>&1
    whl=$(ls "$cache"/wheels/nvidia_nccl_cu13-*.whl 2>/dev/null | tail -1)
  fi
  python3 -m venv --without-pip "$tmp/py" >/dev/null 2>&1
  site=$("$tmp/py/bin/python3" -c 'import site; print(site.getsitepackages()[0])' 2>/dev/null)
  if [ -n "$whl" ] && [ -n "$site" ] && unzip -q -o "$whl" 'nvidia/nccl/lib/*' -d "$site" && [ -e "$site/nvidia/nccl/lib/libnccl.so.2" ]; then
    step PASS nccl_wheel "${whl##*/} unpacked into $site (a Python environment on PATH)"
  else
    step FAIL nccl_wheel "no NCCL wheel (pip download nvidia-nccl-cu13: $(tail -1 "$tmp/pip.log" 2>/dev/null))"
  fi
  echo "$site/nvidia/nccl/lib" >"$tmp/wheel_dir"

  # PATH: links to every program of /usr/bin, /bin, /usr/sbin, /sbin but MPI's launchers and wrappers
  mkdir -p "$tmp/path" "$tmp/home" "$tmp/tmp"
  for d in /usr/bin /bin /usr/sbin /sbin; do
    for f in "$d"/*; do
      n=${f##*/}
      case "$n" in mpi* | hydra* | *mpich* | orte* | ompi* | prun | nvcc | nvidia-smi) continue ;; esac
      [ -e "$tmp/path/$n" ] || ln -s "$f" "$tmp/path/$n"
    done
  done

  unshare --uts --mount --fork bash "$0" --inside "$tmp"
  rc=$?
  echo
  echo "== rehearsal: $((SECONDS - t0)) s; $(grep -c '^PASS' "$tmp/steps") passed, $(grep -c -v '^PASS' "$tmp/steps") failed"
  while IFS=$'\t' read -r st name detail; do printf '   %-5s %-20s %s\n' "$st" "$name" "$detail"; done <"$tmp/steps"
  [ $rc = 0 ] && ! grep -q -v '^PASS' "$tmp/steps"
  exit
fi

# ---- inside the namespace: the GPU machine's conditions ----
tmp=$2
B=$tmp/bundle
wheel_dir=$(cat "$tmp/wheel_dir")
E=(env -i PATH="$tmp/py/bin:$tmp/path" HOME="$tmp/home" TMPDIR="$tmp/tmp" LANG=C.UTF-8)
inenv() { "${E[@]}" bash -c "cd '$B' && source ./bundle_env.sh && bundle_env . && $1"; }  # a command in the bundle's env

name=nz-unresolvable-$$
hostname "$name"
if [ "$(hostname)" = "$name" ] && ! getent hosts "$name" >/dev/null; then
  step PASS hostname "$name (getent hosts: not found)"
else
  step FAIL hostname "could not make an unresolvable hostname ($(hostname))"
fi

# Hide the system's NCCL: its folder replaced by a view of links to everything else in it.
hidden=""
for d in $(ldconfig -p | awk '/libnccl/ {print $NF}' | xargs -r -n1 readlink -f | xargs -r -n1 dirname | sort -u); do
  mkdir -p "$tmp/orig$d" "$tmp/view$d"
  mount --bind "$d" "$tmp/orig$d"
  for f in "$tmp/orig$d"/*; do case "${f##*/}" in libnccl*) ;; *) ln -s "$f" "$tmp/view$d/${f##*/}" ;; esac; done
  mount --bind "$tmp/view$d" "$d" && hidden+="$d/libnccl* "
done
# The system's copies of what the bundle carries: empty files (a load of one fails, loudly), unless
# the tools the check itself uses need them; UCX's modules folder: empty.
: >"$tmp/empty"
mkdir -p "$tmp/emptydir"
needed=$(for t in bash python3 xz tar gzip objdump awk grep sed timeout stdbuf getent unzip ls; do
  ldd "$(command -v $t)" 2>/dev/null; done | awk '$2 == "=>" {print $1}' | sort -u)
n=0
for f in "$B"/lib/*; do
  l=${f##*/}; l=${l%.xz}
  grep -qxF "$l" <<<"$needed" && continue
  for p in $(ldconfig -p | awk -v n="$l" '$1 == n {print $NF}'); do
    mount --bind "$tmp/empty" "$(readlink -f "$p")" && n=$((n + 1))
  done
done
for d in /usr/lib/x86_64-linux-gnu/ucx; do [ -d "$d" ] && mount --bind "$tmp/emptydir" "$d" && hidden+="$d/ "; done
if [ -n "$hidden" ] && ! ldconfig -p | awk '/libnccl.so.2/ {print $NF}' | xargs -r ls 2>/dev/null | grep -q .; then
  step PASS hide_system "${hidden% } and $n system copies of the bundle's libraries (empty files)"
else
  step FAIL hide_system "the system's libnccl is still visible (hidden: ${hidden:-nothing})"
fi

found=$("${E[@]}" bash -c 'command -v mpirun mpiexec mpiexec.hydra hydra_pmi_proxy mpicc')
if [ -z "$found" ]; then step PASS minimal_env "env -i, PATH=$tmp/py/bin:$tmp/path: no MPI launcher on PATH"
else step FAIL minimal_env "MPI visible on the minimal PATH: $found"; fi

out=$(inenv 'printf "%s" "$bundle_lib_dirs"; echo "mpirun=$(command -v mpirun)"' 2>&1)
nccl=$(grep '^libnccl.so.2=' <<<"$out" | cut -d= -f2)
if [ "$nccl" = "$wheel_dir" ] && grep -qxF "mpirun=$B/mpi/mpirun" <<<"$out"; then
  step PASS bundle_env "libnccl.so.2 from the wheel's $nccl; mpirun = the bundle's"
else
  step FAIL bundle_env "libnccl.so.2 from '${nccl}' (expected $wheel_dir), $(grep '^mpirun=' <<<"$out")"
fi

TINY="--device cpu --preset tiny --seq 32 --steps 2 --eval-windows 1"
for t in "" "NZ_MPIRUN_LOCAL=1" "UCX_TLS=self,sm,tcp UCX_POSIX_USE_PROC_LINK=n" "UCX_TLS=self,tcp UCX_NET_DEVICES=lo NZ_MPIRUN_LOCAL=1"; do
  inenv "timeout -k 5 60 env $t mpirun -np 2 bin/stage0_ddp $TINY" >"$tmp/launch.log" 2>&1
  rc=$?
  if [ $rc = 0 ] && grep -q 'ledger matches the formulas on every rank' "$tmp/launch.log"; then
    step PASS "launcher${t:+.fallback}" "mpirun -np 2 stage0_ddp on the CPU${t:+ with $t}: $(grep -m1 -o 'final train loss [0-9.]*' "$tmp/launch.log")"
  else
    step FAIL "launcher${t:+.fallback}" "${t:+with $t: }exit $rc: $(grep -v '^$' "$tmp/launch.log" | tail -1 | cut -c1-150)"
    cp "$tmp/launch.log" "$tmp/launch.fail.$(date +%s%N).log"
  fi
done
inenv "timeout -k 5 60 bin/stage0_ddp $TINY" >"$tmp/single.log" 2>&1
rc=$?
if [ $rc = 0 ] && grep -q 'ledger matches' "$tmp/single.log"; then step PASS singleton "stage0_ddp as one process, no launcher"
else step FAIL singleton "exit $rc: $(grep -v '^$' "$tmp/single.log" | tail -1 | cut -c1-150)"; fi

for t in test_cuda_kernels test_cuda_inference test_cuda_quantize test_cuda_stages test_cuda_comm "mpirun -np 2 tests/test_cuda_comm"; do
  case $t in mpirun*) cmd=$t label=test_cuda_comm.np2 ;; *) cmd=tests/$t label=$t ;; esac
  inenv "timeout -k 5 120 $cmd" >"$tmp/$label.log" 2>&1
  rc=$?
  s=$(grep -c '^NZRESULT SKIP' "$tmp/$label.log") f=$(grep -c '^NZRESULT FAIL' "$tmp/$label.log")
  if [ $rc = 0 ] && [ "$s" -gt 0 ] && [ "$f" = 0 ]; then step PASS "$label" "exit 0, $s tests skipped without a GPU"
  else step FAIL "$label" "exit $rc, $s skipped, $f failed: $(grep -v '^$' "$tmp/$label.log" | tail -1 | cut -c1-150)"; fi
done

# ---- the golden losses: the speed configuration on the CPU, bf16 (as the rows run) and fp32 ----
key=$(cat "$B/golden_key.txt" 2>/dev/null)
golden=$cache/golden-$key.tsv
if [ -n "$key" ] && [ -s "$golden" ]; then
  step PASS golden "cached for build $key ($golden)"
elif [ -z "$key" ]; then
  step FAIL golden "the bundle has no golden_key.txt"
else
  ok=1
  read -r -a SPEED < <(grep -v '^#' "$B/speed_args.txt" | tr '\n' ' ')
  for prec in bf16 fp32; do
    t1=$SECONDS
    inenv "timeout -k 5 900 bin/stage0_ddp ${SPEED[*]} --device cpu --steps 3 --eval-windows 1 --precision $prec \
      --log-json $tmp/golden.$prec.json" >"$tmp/golden.$prec.log" 2>&1 || ok=0
    echo "   golden $prec: $((SECONDS - t1)) s, $(grep -m1 -o 'final train loss [0-9.]*' "$tmp/golden.$prec.log")"
    sed -e 's/.*"steps_log":\[//' -e 's/\],"evals".*//' "$tmp/golden.$prec.json" 2>/dev/null |
      grep -o '"loss":[-0-9.eE+]*' | cut -d: -f2 >"$tmp/golden.$prec"
  done
  if [ $ok = 1 ] && [ "$(wc -l <"$tmp/golden.bf16")" = 3 ] && [ "$(wc -l <"$tmp/golden.fp32")" = 3 ]; then
    {
      echo "# The speed rows' golden losses (gpu_check.sh, \"The golden bound\"): bin/stage0_ddp of bundle build $key"
      echo "# with speed_args.txt, --device cpu --steps 3 --eval-windows 1, as given (bf16) and --precision fp32."
      printf 'step\tbf16\tfp32\n'
      paste "$tmp/golden.bf16" "$tmp/golden.fp32" | awk '{printf "%d\t%s\t%s\n", NR, $1, $2}'
    } >"$golden.part" && mv "$golden.part" "$golden"
    step PASS golden "computed: $(paste -sd' ' "$tmp/golden.bf16") (bf16), $(paste -sd' ' "$tmp/golden.fp32") (fp32)"
  else
    step FAIL golden "the CPU runs failed: $(tail -1 "$tmp/golden.bf16.log" "$tmp/golden.fp32.log" | grep -v '^$' | tr '\n' ' ' | cut -c1-200)"
  fi
fi
if [ -s "$golden" ]; then
  cp "$golden" "$B/golden_losses.tsv" && cp "$golden" "$repo/build/gpu-bundle/golden_losses.tsv"
  b=$(bash "$B/gpu_check.sh" --golden-bound "$B/golden_losses.tsv")
  step PASS golden_bound "$b (bound = max(4 x gap, 0.002) per step; gap = |bf16 - fp32|)"
  sed 's/^/   /' "$golden"
fi

# ---- the check itself, from the copy ----
"${E[@]}" OUT="$tmp/out" bash "$B/gpu_check.sh" 2>&1 | tee "$tmp/gpu_check.out"
rc=${PIPESTATUS[0]}
bad=$(sed -n '/^== gpu_check/,$p' "$tmp/gpu_check.out" | grep -E '^   (FAIL|TIMEOUT) ' | awk '{print $2}' | tr '\n' ' ')
nonskip=$(sed -n '/^== gpu_check/,$p' "$tmp/gpu_check.out" | awk '$1 == "PASS" && $2 ~ /^(device|speed|kernels|comm|stages|memory)/ {print $2}')
if [ $rc = 0 ] && [ -z "$bad" ] && [ -z "$nonskip" ]; then step PASS gpu_check "exit 0, no row failed, the GPU rows SKIP"
else step FAIL gpu_check "exit $rc; failed: ${bad:-none}; GPU rows that did not skip: ${nonskip:-none}"; fi

files=0 problems=""
for f in "$tmp/out"/* "$tmp/out"/.[!.]*; do
  [ -e "$f" ] || continue
  files=$((files + 1))
  [ -f "$f" ] || problems+="${f##*/} is not a plain file; "
  [ -f "$f" ] && [ "$(stat -c %s "$f")" -gt $((16 << 20)) ] && problems+="${f##*/} over 16 MiB; "
  [[ ${f##*/} =~ ^[A-Za-z0-9._-]+$ ]] || problems+="the name ${f##*/}; "
done
[ $files -le 8 ] || problems+="$files files (at most 8); "
for f in table.txt rows.tsv reports.json logs.tar.gz; do [ -s "$tmp/out/$f" ] || problems+="no $f; "; done
if [ -z "$problems" ]; then step PASS out_files "$(cd "$tmp/out" && ls | tr '\n' ' ')($files files, $(du -sk "$tmp/out" | cut -f1) KiB)"
else step FAIL out_files "$problems"; fi
