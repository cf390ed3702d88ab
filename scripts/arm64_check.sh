#!/usr/bin/env bash
# arm64_check.sh — nanoZeRO on 64-bit ARM (ARM laptops through containers, ARM servers), proved from
# an x86-64 Debian machine: a cross-build for AArch64 and a smoke test under emulation. make arm64-check.
#   1. tools, once: the AArch64 cross compiler, QEMU's user-mode emulator, mmdebstrap (installed with
#      apt-get as root; otherwise the command to run is printed)
#   2. an arm64 Debian root, once: the arm64 builds of the libraries the project links (MPICH,
#      OpenBLAS, oneDNN, GoogleTest, nlohmann-json), unpacked, never run (build/arm64-check/root,
#      about 600 MB, or $NZ_ARM64_ROOT)
#   3. the build for armv8-a (every 64-bit ARM CPU) against that root, CUDA=0; and, as the reference,
#      the same trainer for this machine
#   4. on each emulated CPU of NZ_ARM64_CPUS: the kernel tests (test_kernels_ref, test_kernels,
#      test_cpu_adam, test_mpi_comm on 2 ranks) and 3 steps of the tiny model on 2 ranks, in fp32,
#      bf16 and fp16; the fp32 run also as stage0_ddp
# Prints NZRESULT PASS/FAIL lines (as tests/run_all.sh's suites do), the runs' loss lines, and ends
# with "arm64-check: N passed, N failed"; exits 1 on any failure.
#
# What emulation proves and what it does not: the code compiles for AArch64 and computes there what
# an ARM CPU computes (QEMU implements ARM's floating point to the bit: rounding, NaNs, FCVT); speeds
# under emulation mean nothing, and QEMU orders memory as strongly as the x86 host does, so a missing
# barrier that only a real ARM CPU would show cannot show here.
set -uo pipefail
cd "$(dirname "$0")/.."
start=$SECONDS

CHECK=build/arm64-check
ROOT=$(realpath -m "${NZ_ARM64_ROOT:-$CHECK/root}")
ARM=$CHECK/arm64  # the AArch64 build (make BUILD=...)
X86=$CHECK/x86    # the reference build for this machine
LOGS=$CHECK/logs
# cortex-a53: ARMv8.0, the oldest 64-bit ARM core (no fp16 arithmetic, no dot products, no SVE, no
# BF16; OpenBLAS takes its Cortex-A53 kernels); neoverse-n1: ARMv8.2, the server core of Graviton2
# and Ampere Altra (OpenBLAS's Neoverse-N1 kernels); max: every extension QEMU knows, SVE and BF16
# among them (OpenBLAS's generic ARMv8 kernels; oneDNN is asked for bf16 products on BF16 hardware).
CPUS=${NZ_ARM64_CPUS:-cortex-a53 neoverse-n1 max}
JOBS=${NZ_JOBS:-$(nproc)}

pass=0 fail=0
result() {  # PASS|FAIL, what
  echo "NZRESULT $1 $2"
  if [ "$1" = PASS ]; then pass=$((pass + 1)); else fail=$((fail + 1)); fi
}
finish() {
  echo "arm64-check: $pass passed, $fail failed ($((SECONDS - start)) s)"
  [ "$fail" = 0 ]
  exit
}

case "$(uname -m)" in
  x86_64) ;;
  aarch64 | arm64)
    echo "this machine is 64-bit ARM itself: make test runs every suite here natively"
    exit 0 ;;
  *)
    echo "error: this machine is $(uname -m), expected x86-64; run make arm64-check on an x86-64 Debian machine"
    exit 2 ;;
esac
rm -rf "$LOGS" && mkdir -p "$LOGS"  # no result of an earlier run can stand in for this one's

# ---- 1. tools ----
need=()
command -v aarch64-linux-gnu-g++ >/dev/null 2>&1 || need+=(g++-aarch64-linux-gnu)
command -v qemu-aarch64-static >/dev/null 2>&1 || need+=(qemu-user-static)
command -v mmdebstrap >/dev/null 2>&1 || need+=(mmdebstrap)
command -v mpirun >/dev/null 2>&1 && command -v python3 >/dev/null 2>&1 || { bash scripts/install_deps.sh || exit 1; }
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ]; then
    echo "installing: ${need[*]}"
    export DEBIAN_FRONTEND=noninteractive
    { apt-get update -qq && apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null; } ||
      { echo "error: apt-get could not install ${need[*]}, expected Debian's packages; install them and run again"; exit 2; }
  else
    echo "arm64-check needs: ${need[*]}"
    echo "run as root:  sudo sh -c 'apt-get update && apt-get install -y --no-install-recommends ${need[*]}'"
    exit 1
  fi
fi

# ---- 2. the arm64 root: the target's libraries, for the compiler (--sysroot) and for QEMU (-L) ----
# The same Debian release as this machine, so that its libstdc++ matches the cross compiler's GCC.
gcc_major=$(aarch64-linux-gnu-g++ -dumpversion | cut -d. -f1)
suite=$(. /etc/os-release && echo "${VERSION_CODENAME:-}")
packages="libc6-dev,libstdc++-$gcc_major-dev,libmpich-dev,libopenblas-openmp-dev,libgtest-dev,nlohmann-json3-dev,libdnnl-dev,libsodium-dev"
stamp="$suite $packages"
if [ "$(cat "$ROOT/.nanozero-root" 2>/dev/null)" != "$stamp" ]; then
  [ -n "$suite" ] || { echo "error: /etc/os-release names no Debian release, expected e.g. bookworm; run this on Debian"; exit 2; }
  echo "== making the arm64 root ($suite: ${packages//,/ }) in $ROOT, once"
  t=$SECONDS
  rm -rf "$ROOT.part" "$ROOT"
  mkdir -p "$(dirname "$ROOT")"
  # extract: unpacked, no package scripts run (nothing arm64 runs here but what the check runs)
  if ! mmdebstrap --variant=extract --arch=arm64 --include="$packages" "$suite" "$ROOT.part" >"$LOGS/root.log" 2>&1; then
    tail -5 "$LOGS/root.log"
    result FAIL "arm64 root: mmdebstrap failed (log: $LOGS/root.log)"
    finish
  fi
  echo "$stamp" >"$ROOT.part/.nanozero-root"
  mv "$ROOT.part" "$ROOT"
  echo "   $(du -sh "$ROOT" | cut -f1), $((SECONDS - t)) s"
fi

# ---- 3. the builds ----
arm_make=(make --no-print-directory -j"$JOBS" BUILD="$ARM" CUDA=0 HOST_ARCH=armv8-a
  CXX="aarch64-linux-gnu-g++ --sysroot=$ROOT" SYSROOT="$ROOT"
  MPI_CFLAGS="-I$ROOT/usr/include/aarch64-linux-gnu/mpich" MPI_LIBS=-lmpich)
arm_programs=("$ARM"/bin/stage0_ddp "$ARM"/bin/stage1 "$ARM"/tests/test_kernels_ref "$ARM"/tests/test_kernels
  "$ARM"/tests/test_cpu_adam "$ARM"/tests/test_mpi_comm)
arm_targets=("${arm_programs[@]}")
# NZ_ARM64_ALL=1: the whole tree, as make test builds it (every trainer, tool and test, the broken
# trainers, the CUDA emulator's build), though only the programs above run
[ "${NZ_ARM64_ALL:-0}" = 1 ] && arm_targets=(all emu)
echo "== building for AArch64 (armv8-a, CUDA=0) into $ARM: ${arm_targets[*]##*/}"
t=$SECONDS
if "${arm_make[@]}" "${arm_targets[@]}" >"$LOGS/build-arm64.log" 2>&1; then
  [ "${NZ_ARM64_ALL:-0}" = 1 ] && arm_programs=($(find "$ARM/bin" "$ARM/tests" "$ARM/emu/bin" "$ARM/emu/tests" -type f -perm -u+x))
  not_arm=()
  for p in "${arm_programs[@]}"; do
    readelf -h "$p" 2>/dev/null | grep -q 'Machine:.*AArch64' || not_arm+=("$p")
  done
  warnings=$(grep -c 'warning:' "$LOGS/build-arm64.log")
  compiled=$(grep -c 'aarch64-linux-gnu-g++.* -c ' "$LOGS/build-arm64.log")
  if [ ${#not_arm[@]} = 0 ] && [ "$warnings" = 0 ]; then
    result PASS "arm64 build: ${#arm_programs[@]} programs, AArch64 executables, $compiled files compiled, no warnings ($((SECONDS - t)) s)"
  else
    result FAIL "arm64 build: not AArch64: ${not_arm[*]:-none}; $warnings warnings (log: $LOGS/build-arm64.log)"
  fi
else
  grep -m5 -E 'error|Error' "$LOGS/build-arm64.log"
  result FAIL "arm64 build (log: $LOGS/build-arm64.log)"
  finish
fi
# The Makefile's choices on an ARM machine, which this cross-build does not take: GCC's flag for the
# machine's own CPU there is -mcpu=native, and a root without oneDNN builds without it (DNNL=0).
native_flags=$(make -s --no-print-directory CUDA=0 CXX=aarch64-linux-gnu-g++ print-build-flags | grep '^CXXFLAGS')
no_dnnl_flags=$(make -s --no-print-directory CUDA=0 CXX=aarch64-linux-gnu-g++ SYSROOT="$CHECK/empty-root" print-build-flags | grep '^CXXFLAGS')
if [[ " $native_flags " == *" -mcpu=native "* ]] && [[ " $no_dnnl_flags " != *NZ_HAVE_DNNL* ]]; then
  result PASS "arm64 build flags: -mcpu=native on an ARM machine; without oneDNN installed, built without it"
else
  result FAIL "arm64 build flags: $native_flags | without oneDNN: $no_dnnl_flags"
fi

echo "== building the x86-64 reference trainer (CUDA=0) into $X86"
t=$SECONDS
if make --no-print-directory -j"$JOBS" BUILD="$X86" CUDA=0 "$X86"/bin/stage1 >"$LOGS/build-x86.log" 2>&1; then
  echo "   $((SECONDS - t)) s"
else
  grep -m5 -E 'error|Error' "$LOGS/build-x86.log"
  result FAIL "x86-64 reference build (log: $LOGS/build-x86.log)"
  finish
fi

# ---- 4. the runs ----
# QEMU runs each AArch64 process, its libraries found under $ROOT. mpirun is this machine's (the same
# MPICH release, so its launcher and the arm64 library speak the same PMI). UCX_TLS=self,sm: the ranks
# talk through shared memory only, as on one real machine; UCX's TCP transport, also on by default,
# hangs now and then under QEMU (a plain MPI program of a few collectives does it too; natively
# never).
arm_env=(env QEMU_LD_PREFIX="$ROOT" UCX_TLS=self,sm)
TRAIN=(--preset tiny --seq 32 --steps 3 --eval-windows 8)

gtest() {  # cpu, binary, ranks
  local cpu=$1 bin=$2 np=$3 name log rc=0 t=$SECONDS p f
  name=$(basename "$bin")
  log=$LOGS/$cpu.$name.log
  if [ "$np" -gt 1 ]; then
    timeout -k 10 900 "${arm_env[@]}" QEMU_CPU="$cpu" mpirun -np "$np" qemu-aarch64-static "$bin" >"$log" 2>&1 || rc=$?
  else
    timeout -k 10 900 "${arm_env[@]}" QEMU_CPU="$cpu" qemu-aarch64-static "$bin" >"$log" 2>&1 || rc=$?
  fi
  p=$(grep -c '^NZRESULT PASS' "$log")
  f=$(grep -c '^NZRESULT FAIL' "$log")
  local what="arm64 $cpu $name: $p tests passed"
  [ "$np" -gt 1 ] && what="arm64 $cpu $name, $np ranks: $p tests passed"
  if [ "$rc" = 0 ] && [ "$f" = 0 ] && [ "$p" -gt 0 ]; then
    result PASS "$what ($((SECONDS - t)) s)"
  else
    result FAIL "$what, $f failed$(grep '^NZRESULT FAIL' "$log" | sed 's/^NZRESULT FAIL / /' | tr '\n' ',' | sed 's/,$//'), exit $rc (log: $log)"
  fi
  # what the binaries say about the path they took on this CPU
  grep -h -E '^\[ bf16 +\]|SIMD lanes' "$log" | sed 's/^/     /'
}

train() {  # cpu|x86, stage, precision, json; prints the run's loss lines
  local cpu=$1 stage=$2 prec=$3 json=$4 log="${4%.json}.log" rc=0
  if [ "$cpu" = x86 ]; then
    # the widened bf16 products, as on ARM (where oneDNN has no bf16 matmul): the same path on both
    timeout -k 10 300 env NZ_CPU_BF16_GEMM=widen mpirun -np 2 "$X86/bin/$stage" "${TRAIN[@]}" --precision "$prec" \
      --device cpu --log-json "$json" >"$log" 2>&1 || rc=$?
  else
    timeout -k 10 300 "${arm_env[@]}" QEMU_CPU="$cpu" mpirun -np 2 qemu-aarch64-static "$ARM/bin/$stage" "${TRAIN[@]}" \
      --precision "$prec" --log-json "$json" >"$log" 2>&1 || rc=$?
  fi
  # step lines without the time and speed columns (under emulation they mean nothing); fp16's loss scale
  grep -E '^(step|done|bf16 products)' "$log" | awk -F' [|] ' '
    /^step/ {print "     " $1 " | " $2 " | " $4 ($NF ~ /loss scale/ ? " | " $NF : ""); next}
    /^done/ {print "     " $1 " | " $2 " | " $3; next} {print "     " $0}'
  return $rc
}

# compare A B exact|TOL: every step's loss and gradient norm and the final validation loss; prints
# the largest relative difference. A step skipped for an fp16 overflow (its norm null) must be
# skipped in both.
compare() {
  python3 - "$@" <<'EOF'
import json, sys
a, b, how = json.load(open(sys.argv[1])), json.load(open(sys.argv[2])), sys.argv[3]
pairs = [(x[k], y[k]) for x, y in zip(a["steps_log"], b["steps_log"]) for k in ("loss", "grad_norm")]
pairs += [(a["final_val_loss"], b["final_val_loss"])]
ok = len(a["steps_log"]) == len(b["steps_log"]) > 0 and all((x is None) == (y is None) for x, y in pairs)
pairs = [(x, y) for x, y in pairs if x is not None and y is not None]
worst = max(abs(x - y) / max(abs(y), 1e-30) for x, y in pairs)
ok = ok and (all(x == y for x, y in pairs) if how == "exact" else worst <= float(how))
print(f"largest relative difference {worst:.1e}")
sys.exit(0 if ok else 1)
EOF
}

echo "== x86-64 reference: stage1, 2 ranks, tiny model, 3 steps"
for prec in fp32 bf16 fp16; do
  echo "   $prec"
  train x86 stage1 "$prec" "$LOGS/x86.stage1.$prec.json" || result FAIL "x86-64 reference stage1 $prec (log: $LOGS/x86.stage1.$prec.log)"
done

# The bound for "the same numbers": the two machines sum in fp32 in another order (other BLAS
# kernels, another libm; bf16 products widened on both): a dot product of K terms may then differ by
# K·2^-24 relative, 7.6e-6 at this model's largest K = 128, so fp32 runs must agree within 1e-5.
# In bf16 and fp16 a sum that differs in its last fp32 bit may round a stored value to the neighbour,
# one unit of the 16-bit type: those runs must agree within that unit, 2^-8 and 2^-11.
# (Observed here: 1.1e-8 in fp32, 3.5e-11 in bf16, 1.0e-5 in fp16.)
declare -A TOL=([fp32]=1e-5 [bf16]=3.9e-3 [fp16]=4.9e-4)
for cpu in $CPUS; do
  echo "== emulated $cpu"
  for bin in test_kernels_ref test_kernels test_cpu_adam; do gtest "$cpu" "$ARM/tests/$bin" 1; done
  gtest "$cpu" "$ARM/tests/test_mpi_comm" 2
  for prec in fp32 bf16 fp16; do
    json=$LOGS/$cpu.stage1.$prec.json t=$SECONDS
    echo "   stage1, 2 ranks, $prec:"
    if train "$cpu" stage1 "$prec" "$json"; then
      if agreement=$(compare "$json" "$LOGS/x86.stage1.$prec.json" "${TOL[$prec]}"); then
        result PASS "arm64 $cpu stage1 $prec trains: every step's loss and norm as on x86-64, $agreement (<= ${TOL[$prec]}) ($((SECONDS - t)) s)"
      else
        result FAIL "arm64 $cpu stage1 $prec: not as on x86-64: $agreement (bound ${TOL[$prec]}) (log: ${json%.json}.log)"
      fi
    else
      result FAIL "arm64 $cpu stage1 $prec: the run failed (log: ${json%.json}.log)"
    fi
  done
  # the ladder's contract on ARM: stage0_ddp and stage1 bit for bit (fp32, accumulation 1)
  json=$LOGS/$cpu.stage0_ddp.fp32.json t=$SECONDS agreement=""
  if train "$cpu" stage0_ddp fp32 "$json" >/dev/null && agreement=$(compare "$json" "$LOGS/$cpu.stage1.fp32.json" exact); then
    result PASS "arm64 $cpu stage0_ddp fp32 = stage1 fp32 bit for bit ($((SECONDS - t)) s)"
  else
    result FAIL "arm64 $cpu stage0_ddp fp32 differs from stage1: ${agreement:-the run failed} (log: ${json%.json}.log)"
  fi
done
finish
