#!/usr/bin/env bash
# The bf16 paths as a laptop CPU without AVX-512 runs them, on whatever CPU runs the tests: oneDNN
# is capped at AVX2 (ONEDNN_MAX_CPU_ISA, read once when a process starts), where oneDNN 2.x has no
# bf16 matmul at all and throws instead of offering one (common/kernels/gemm_bf16.cpp must catch that and
# widen). So a regression in the decision is caught by CI on any machine, not only on an AVX2 one.
#   - the kernel tests of bf16 products pass under the cap (and decline, untouched, every shape);
#   - a bf16 training run under the cap says it widens, exits 0, and trains exactly the model of
#     NZ_CPU_BF16_GEMM=widen (the explicit request for the same path): the same loss lines, the same
#     model file, bit for bit; on 3 ranks with stage3 too (padding, gathers);
#   - an uncaught library exception is one line and a clean exit code, never std::terminate's abort.
# Prints NZRESULT lines for tests/run_all.sh.
cd "$(dirname "$0")/../.."
bin=${NZ_BIN_DIR:-build/bin}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
source tests/lib/check.sh  # pass, fail, expect_error
check_suite cpu_baseline
cap=(env ONEDNN_MAX_CPU_ISA=AVX2 DNNL_MAX_CPU_ISA=AVX2)

# ---- the kernel tests of bf16 products and bf16 kernels, under the cap ----
out=$("${cap[@]}" build/tests/test_kernels --gtest_filter='Bf16*:*bf16*:*Bf16*' 2>&1)
rc=$?
if [ $rc = 0 ] && grep -q "bf16 products on this CPU's bf16 instructions: no" <<<"$out" &&
   grep -q '\[  PASSED  \]' <<<"$out"; then
  pass "kernel_tests_under_avx2_cap ($(grep -c '^\[       OK \]' <<<"$out") ok, $(grep -c '^\[  SKIPPED \]' <<<"$out") skipped with a reason)"
else
  fail kernel_tests_under_avx2_cap "exit $rc; $(grep -E 'FAILED|terminate|error' <<<"$out" | head -3)"
fi

# ---- bf16 training under the cap = bf16 training explicitly widened, bit for bit ----
job="--preset tiny --seq 32 --batch 2 --steps 6 --precision bf16 --eval-every 3 --eval-windows 2"
# The numbers of a run's log (losses, norms), without its timings.
numbers() { grep -oE '(step +[0-9]+/[0-9]+ \| loss [0-9.]+|norm +[0-9.]+|validation loss [0-9.]+|final train loss [0-9.]+)' "$1"; }
train() {  # name, stage, ranks, env...
  local name=$1 stage=$2 np=$3
  shift 3
  env "$@" mpirun -np "$np" "$bin/$stage" $job --save-model "$tmp/$name.model" >"$tmp/$name.log" 2>&1
}
for c in "stage0_ddp 1" "stage3 3"; do
  set -- $c
  stage=$1 np=$2
  train "$stage.capped" "$stage" "$np" ONEDNN_MAX_CPU_ISA=AVX2 DNNL_MAX_CPU_ISA=AVX2
  rc_capped=$?
  train "$stage.widen" "$stage" "$np" NZ_CPU_BF16_GEMM=widen
  rc_widen=$?
  said=$(grep -m1 '^bf16 products:' "$tmp/$stage.capped.log")
  if [ $rc_capped = 0 ] && [ $rc_widen = 0 ] && grep -q 'widened to fp32' <<<"$said" &&
     cmp -s <(numbers "$tmp/$stage.capped.log") <(numbers "$tmp/$stage.widen.log") &&
     cmp -s "$tmp/$stage.capped.model" "$tmp/$stage.widen.model"; then
    pass "bf16_train_under_avx2_cap_equals_widened.$stage.np$np ($said)"
  else
    fail "bf16_train_under_avx2_cap_equals_widened.$stage.np$np" "exits $rc_capped/$rc_widen, header '$said'; $(tail -2 "$tmp/$stage.capped.log")"
  fi
done

# ---- no library exception reaches std::terminate ----
# A config file that is a directory used to end in "terminate called after throwing ... ios_base::failure"
# (exit 6). Whatever the message, the exit must be a clean one (1 or 2) with one line, no core dump.
out=$(mpirun -np 1 "$bin/stage0_ddp" --preset tiny --seq 16 --steps 1 --config "$tmp" 2>&1)
rc=$?
if [ $rc -ge 1 ] && [ $rc -le 2 ] && ! grep -q 'terminate called' <<<"$out" && [ "$(grep -c '^error\|nanozero:' <<<"$out")" -ge 1 ]; then
  pass "no_uncaught_exception (exit $rc: $(grep -m1 '^error\|nanozero:' <<<"$out" | cut -c1-100))"
else
  fail no_uncaught_exception "exit $rc: $(head -3 <<<"$out")"
fi
