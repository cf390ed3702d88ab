#!/usr/bin/env bash
# ptxas_check.sh — the GPU resource gate, where the CUDA toolkit is installed (no GPU needed): every
# kernel of the build's CUDA objects, as the GPU's assembler compiled it (the OBJ.ptxas report the
# Makefile's nvcc rule writes beside each object), must
#   - not spill registers to local memory;
#   - keep its static shared memory within 48 KiB;
#   - fit the register file of an SM (65536): registers x the threads of its __launch_bounds__ (x its
#     minimum blocks per SM), and a kernel without a bound at most 64 registers (so that any block,
#     up to 1024 threads, can launch).
# tests/cuda/ptxas_gate.py applies the rules. The gate is shown to refuse: the project's matrix
# multiply without its __launch_bounds__ (86 registers, unbounded), a kernel whose bound makes it
# spill (tests/cuda/ptxas_mutants/), and a report over the register file and the shared memory
# limit (written here: the assembler itself never gives a bound more registers than fit, and it
# refuses more than 48 KiB of static shared memory outright, so the rules are shown on a report).
# Without nvcc (CI has no CUDA toolkit) there is no report: SKIP.
set -u
cd "$(dirname "$0")/../.." || exit 1
BUILD=${BUILD:-build}
if ! grep -q '| CUDA=1 ' "$BUILD/config.flags" 2>/dev/null; then
  if command -v nvcc >/dev/null 2>&1; then why="the build in $BUILD is CPU-only (CUDA=0)"
  else why="no CUDA toolkit: nvcc is not installed, so no CUDA object and no assembler report exist"; fi
  echo "NZRESULT SKIP ptxas.gate ($why)"
  exit 0
fi
log=$(mktemp -d /tmp/nanozero-ptxas.XXXXXX)
trap 'rm -rf "$log"' EXIT

# The build's reports (made with the objects; made here too where objects predate the rule)
mapfile -t reports < <(ls common/kernels/cuda/*.cu inference/*.cu | sed "s|^|$BUILD/obj/|; s|\.cu\$|.ptxas|")
mutants=("$BUILD/obj/tests/cuda/ptxas_mutants/unbounded.ptxas" "$BUILD/obj/tests/cuda/ptxas_mutants/spill.ptxas")
if ! timeout -k 5 600 make --no-print-directory -s BUILD="$BUILD" "${reports[@]}" "${mutants[@]}" >"$log/make.log" 2>&1; then
  echo "NZRESULT FAIL ptxas.build (the CUDA objects or the mutants did not compile: $(grep -m1 -i 'error' "$log/make.log"))"
  exit 0
fi

rc=0
python3 tests/cuda/ptxas_gate.py "${reports[@]}" >"$log/gate.out" 2>&1 || rc=$?
if [ $rc = 0 ]; then
  echo "NZRESULT PASS ptxas.gate ($(tail -1 "$log/gate.out" | sed 's/^ptxas-gate: //'): no spill, registers and static" \
       "shared memory within an SM's)"
else
  echo "NZRESULT FAIL ptxas.gate (exit $rc: $(tail -1 "$log/gate.out"))"
  grep -m5 '^ptxas-gate: FAIL' "$log/gate.out"
fi

# Each mutant refused, by the rule meant for it, naming the kernel
refused() {  # name, report, pattern the FAIL line must match
  local name=$1 report=$2 pattern=$3 rc=0
  python3 tests/cuda/ptxas_gate.py "$report" >"$log/$name.out" 2>&1 || rc=$?
  if [ $rc = 1 ] && grep -q "^ptxas-gate: FAIL .*$pattern" "$log/$name.out"; then
    echo "NZRESULT PASS ptxas.refuses.$name ($(grep -m1 "^ptxas-gate: FAIL .*$pattern" "$log/$name.out" |
          sed 's/^ptxas-gate: FAIL //; s/ (sm_[0-9]*, [^)]*)//' | cut -c1-150))"
  else
    echo "NZRESULT FAIL ptxas.refuses.$name (exit $rc, no FAIL line matching '$pattern': $(head -1 "$log/$name.out"))"
  fi
}
refused unbounded_matmul "${mutants[0]}" 'matmul_tiled_kernel<nz::bf16> (.*): 86 registers a thread and no __launch_bounds__'
refused spill "${mutants[1]}" 'spilling_kernel (.*): spills ([1-9][0-9]* bytes of spill stores'
# A report as ptxas writes it, for two kernels no real compile gives: one over the register file
# within its bound, one over the static shared memory limit.
cat >"$log/rules.ptxas" <<'EOF'
ptxas info    : Compiling entry function '_Z15too_many_regs_kPf' for 'sm_90'
ptxas info    : Function properties for _Z15too_many_regs_kPf
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 72 registers, used 1 barriers, 360 bytes cmem[0]
ptxas info    : Compiling entry function '_Z17too_much_shared_kPf' for 'sm_90'
ptxas info    : Function properties for _Z17too_much_shared_kPf
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 16 registers, used 1 barriers, 52000 bytes smem, 360 bytes cmem[0]
ptx: .visible .entry _Z15too_many_regs_kPf(
ptx: .maxntid 1024, 1, 1
ptx: .visible .entry _Z17too_much_shared_kPf(
ptx: .maxntid 256, 1, 1
EOF
refused registers "$log/rules.ptxas" 'too_many_regs_k (.*): 72 registers x 1024 threads = 73728 registers'
refused shared "$log/rules.ptxas" 'too_much_shared_k (.*): 52000 bytes of static shared memory'
exit 0
