#!/usr/bin/env bash
# emu_check.sh — the CUDA backend on nz_emu, the CPU emulator of CUDA in dev/emu/ (no GPU and no
# CUDA toolkit needed): every CUDA kernel, the cuBLAS and NCCL call sites, and every trainer with
# --device cuda run for real, with the emulator's checks on (guard pages after every device buffer,
# device memory unreachable from host code, poisoned fresh memory, barrier divergence, launch
# limits). What it cannot tell (speed, the GPU's exact bits) tests/cuda/gpu_check.sh measures on a GPU.
#   1. tests of the emulator: a correct kernel works, and so do the emulated tensor cores (WMMA);
#      each deliberately broken kernel is stopped or gives a wrong answer;
#   2. build/emu/tests/test_cuda_kernels: every kernel against the CPU reference;
#      build/emu/tests/test_cuda_inference: the KV-cached decode step against the CPU decoder;
#      build/emu/tests/test_cuda_quantize: ZeRO++'s block quantizer against the CPU's, bit for bit;
#   3. build/emu/tests/test_cuda_comm: one rank (device copies, and any NCCL call fatal:
#      NZ_EMU_NO_NCCL), ranks sharing one GPU (the MPI path through pinned buffers) and one GPU per
#      rank (NZ_EMU_GPUS: the NCCL path, NCCL emulated over MPI);
#   4. build/emu/tests/test_cuda_stages: every stage with --device cuda against stage0_ddp, and the
#      ledger and comm counts against the CPU run (NZ_TEST_QUICK: 4 steps of 16 tokens), and
#      --attention flash's activations (the log-sum-exp formula) and --batch auto, once with
#      one emulated GPU (2 ranks share it: MPI path) and once with two (NCCL path); the runs the
#      GPU count cannot change (one rank, or the CPU) are made once and checked by both
#      (the run cache, NZ_RUN_CACHE: test_cuda_stages.cpp, run_cached_any_gpus);
#   5. stage0_ddp trained with --attention flash against --attention gemm, fp32 and bf16 (head size 8:
#      the CUDA-core kernels), and bf16 with --heads 2 (head size 16: the tensor-core kernels);
#   6. a stuck NCCL collective (a failed peer, or silence) ends the run naming the collective, and so
#      does a communicator creation that never completes (NZ_NCCL_INIT_TIMEOUT);
#   7. a one-rank trainer on --device cuda, started without mpirun: no NCCL call (NZ_EMU_NO_NCCL=1),
#      NZ_PROFILE=1's line and JSON from CUDA events, the same losses without it, and the JSON's
#      gpu_memory against the ledger (tests/lib/check_profile.py).
# Prints NZRESULT lines (tests/run_all.sh); about 3 CPU-minutes after the build.
set -u
cd "$(dirname "$0")/../.." || exit 1
BUILD=${BUILD:-build}
EMU=$BUILD/emu
log=$(mktemp -d /tmp/nanozero-emu.XXXXXX)

if ! make -j"$(nproc)" BUILD="$BUILD" emu >"$log/build.log" 2>&1; then
  tail -20 "$log/build.log"
  echo "NZRESULT FAIL emu.build (see $log/build.log)"
  exit 1
fi

# 1. the emulator's own tests: "ok:" and exit 0, or stopped with the expected message
selftest() {  # case, expected message (empty: the case must succeed)
  local out="$log/selftest_$1.log" rc=0
  (timeout -k 5 60 "$EMU/tests/emu_selftest" "$1" >"$out" 2>&1; exit $?) 2>/dev/null || rc=$?  # no "Aborted" line
  if [ -z "$2" ]; then
    if [ $rc = 0 ] && grep -q '^ok: ' "$out"; then echo "NZRESULT PASS emu.selftest.$1"
    else echo "NZRESULT FAIL emu.selftest.$1 ($(head -1 "$out"))"; fi
  elif [ $rc != 0 ] && grep -q "^nz_emu: .*$2" "$out"; then
    echo "NZRESULT PASS emu.selftest.$1 (stopped: $(grep -o "$2" "$out" | head -1))"
  else
    echo "NZRESULT FAIL emu.selftest.$1 (not stopped with '$2'; exit $rc: $(head -1 "$out"))"
  fi
}
selftest good ""
selftest bad_launch ""
selftest bad_lda ""
selftest poisoned ""
selftest missing_sync ""
selftest wmma ""
selftest wmma_missing_syncwarp ""
selftest async_copy ""
selftest async_missing_wait ""
selftest out_of_bounds "past the end of a 4000-byte device buffer"
selftest host_deref "from host code"
selftest divergent_sync "__syncthreads after some threads of the block exited"
selftest partial_shuffle "a warp operation that not every lane reaches"
selftest wmma_divergent "a warp operation that not every lane reaches"
selftest wmma_bad_ldm "requires a multiple of 16 bytes"
selftest wmma_misaligned "requires a 32-byte (256-bit) aligned pointer"
selftest async_misaligned "requires both 16-byte aligned"

# 2-4. the GoogleTest suites, their NZRESULT lines renamed emu.<label>.<test> (tests/lib/gtest_run.sh)
source tests/lib/gtest_run.sh
gtest() { run_gtest emu "$1" "$log" "${@:2}"; }
gtest kernels 300 "$EMU/tests/test_cuda_kernels"
gtest inference 120 "$EMU/tests/test_cuda_inference"
gtest quantize 120 "$EMU/tests/test_cuda_quantize"  # tests/zeropp/test_cuda_quantize.cpp
gtest comm_np1_local 120 env NZ_EMU_NO_NCCL=1 mpirun -np 1 "$EMU/tests/test_cuda_comm"
gtest comm_np1_mpi 120 env NZ_COMM=mpi mpirun -np 1 "$EMU/tests/test_cuda_comm"
gtest comm_np1_nccl 120 env NZ_COMM=nccl mpirun -np 1 "$EMU/tests/test_cuda_comm"
gtest comm_np2_shared 120 mpirun -np 2 "$EMU/tests/test_cuda_comm"
gtest comm_np2_nccl 120 env NZ_EMU_GPUS=2 mpirun -np 2 "$EMU/tests/test_cuda_comm"
gtest comm_np3_nccl 120 env NZ_EMU_GPUS=3 mpirun -np 3 "$EMU/tests/test_cuda_comm"
# the run cache the two stages runs share: tests/run_all.sh's, or one of this check's own
[ -n "${NZ_RUN_CACHE:-}" ] || export NZ_RUN_CACHE=$log/runs
gtest stages_1gpu 600 env NZ_BIN_DIR="$EMU/bin" NZ_TEST_QUICK=1 "$EMU/tests/test_cuda_stages"
gtest stages_2gpus 600 env NZ_BIN_DIR="$EMU/bin" NZ_TEST_QUICK=1 NZ_EMU_GPUS=2 "$EMU/tests/test_cuda_stages"
[ "$NZ_RUN_CACHE" = "$log/runs" ] && rm -rf "$NZ_RUN_CACHE"  # its model files; the logs stay
for l in stages_1gpu stages_2gpus; do grep '^NZTABLE stage .* N=2 ' "$log/$l.log" | sed "s/^NZTABLE /  $l: /"; done

# 5. flash attention in a whole training run: stage0_ddp --attention flash against --attention gemm,
#    every step's loss within the bound test_cuda_stages grants a change of summation order
#    (fp32 1e-5, bf16 2e-2): the same model, trained through the other kernel. bf16.wmma runs the
#    tensor-core kernels, which also round P and dS to bf16: one more rounding of relative size 2^-8,
#    the size of those that bf16 storage makes in every activation, so the same bound holds.
for run in fp32 bf16 bf16.wmma; do
  prec=${run%%.*}
  heads=$([ $run = bf16.wmma ] && echo "--heads 2" || echo "")  # tiny's width 32: head size 16, else 8
  bound=$([ $prec = fp32 ] && echo 1e-5 || echo 2e-2)
  for a in gemm flash; do
    timeout -k 5 120 "$EMU/bin/stage0_ddp" --device cuda --preset tiny --seq 16 --batch 2 --steps 4 --eval-every 0 \
      --eval-windows 2 --precision $prec $heads --attention $a >"$log/attention_$a.$run.log" 2>&1
  done
  worst=$(paste <(grep -o '^step .*| loss [0-9.]*' "$log/attention_gemm.$run.log" | awk '{print $NF}') \
                <(grep -o '^step .*| loss [0-9.]*' "$log/attention_flash.$run.log" | awk '{print $NF}') |
          awk 'BEGIN {w = -1} NF == 2 {d = $1 - $2; if (d < 0) d = -d; if (d > w) w = d} END {print w}')
  steps=$(grep -c '^step ' "$log/attention_flash.$run.log")
  if [ "$steps" = 4 ] && grep -q 'attention flash' "$log/attention_flash.$run.log" &&
     awk -v w="$worst" -v b="$bound" 'BEGIN {exit !(w >= 0 && w <= b)}'; then
    echo "NZRESULT PASS emu.flash_attention_training.$run (4 steps, largest loss difference $worst <= $bound)"
  else
    echo "NZRESULT FAIL emu.flash_attention_training.$run ($steps steps, largest loss difference $worst, bound $bound; see $log/attention_flash.$run.log)"
  fi
done

# 6. a collective that never completes (nccl::wait_joined): NZ_EMU_NCCL_STUCK makes the emulated
#    NCCL report a failed peer (error) or nothing at all (hang); either way the run must end, non-zero,
#    naming the collective, instead of hanging (2 ranks on 2 emulated GPUs: the NCCL path).
for m in error hang; do
  want=$([ $m = error ] && echo 'NCCL error 6 (remote process exited' || echo 'has not completed after 1 s')
  rc=0
  NZ_EMU_GPUS=2 NZ_EMU_NCCL_STUCK=$m NZ_NCCL_TIMEOUT=1 timeout -k 5 60 mpirun -np 2 "$EMU/bin/stage0_ddp" --device cuda \
    --preset tiny --seq 16 --batch 2 --steps 2 --eval-every 0 --eval-windows 2 >"$log/nccl_stuck_$m.log" 2>&1 || rc=$?
  if [ $rc != 0 ] && [ $rc != 124 ] && [ $rc != 137 ] && grep -q "$want.*all-reduce #[0-9]\|all-reduce #[0-9].*$want" "$log/nccl_stuck_$m.log"; then
    echo "NZRESULT PASS emu.nccl_stuck.$m (exit $rc: $(grep -o 'NCCL [ea].*' "$log/nccl_stuck_$m.log" | head -1 | cut -c1-90))"
  else
    echo "NZRESULT FAIL emu.nccl_stuck.$m (exit $rc, expected a non-zero exit naming the collective with '$want'; see $log/nccl_stuck_$m.log)"
  fi
done
# 6b. NZ_EMU_NCCL_STUCK=init: ncclCommInitRankConfig (non-blocking) never completes; the run must end
#     within NZ_NCCL_INIT_TIMEOUT with the line that names the creation.
rc=0
NZ_EMU_GPUS=2 NZ_EMU_NCCL_STUCK=init NZ_NCCL_INIT_TIMEOUT=1 timeout -k 5 60 mpirun -np 2 "$EMU/bin/stage0_ddp" --device cuda \
  --preset tiny --seq 16 --batch 2 --steps 2 --eval-every 0 --eval-windows 2 >"$log/nccl_stuck_init.log" 2>&1 || rc=$?
if [ $rc != 0 ] && [ $rc != 124 ] && [ $rc != 137 ] &&
   grep -q 'NCCL communicator creation (ncclCommInitRankConfig, rank [01] of 2) has not completed after 1 s' "$log/nccl_stuck_init.log"; then
  echo "NZRESULT PASS emu.nccl_stuck.init (exit $rc: $(grep -o 'NCCL communicator creation.*after 1 s' "$log/nccl_stuck_init.log" | head -1))"
else
  echo "NZRESULT FAIL emu.nccl_stuck.init (exit $rc, expected a non-zero exit naming the communicator creation; see $log/nccl_stuck_init.log)"
fi

# 7. one rank on --device cuda, without mpirun (the GPU check's speed rows): no NCCL call at all
#    (NZ_EMU_NO_NCCL=1 makes one fatal), NZ_PROFILE=1 on and off with the same losses, and the
#    report's profile and gpu_memory checked against each other and the ledger.
one_rank="$EMU/bin/stage0_ddp --device cuda --preset tiny --seq 16 --batch 2 --steps 5 --eval-every 0 --eval-windows 2"
NZ_EMU_NO_NCCL=1 NZ_PROFILE=1 timeout -k 5 120 $one_rank --log-json "$log/one_rank_profiled.json" >"$log/one_rank_profiled.log" 2>&1
NZ_EMU_NO_NCCL=1 timeout -k 5 120 $one_rank --log-json "$log/one_rank_plain.json" >"$log/one_rank_plain.log" 2>&1
python3 tests/lib/check_profile.py emu.one_rank cuda_events "3-5 of 5" "$log/one_rank_profiled.log" "$log/one_rank_profiled.json" \
  "$log/one_rank_plain.log" "$log/one_rank_plain.json" --gpu-memory
# and on NCCL (2 ranks, 2 emulated GPUs, 2 steps: all timed): collectives are the compute stream's waits
two="$EMU/bin/stage0_ddp --device cuda --preset tiny --seq 16 --batch 2 --steps 2 --eval-every 0 --eval-windows 2"
NZ_EMU_GPUS=2 NZ_PROFILE=1 timeout -k 5 120 mpirun -np 2 $two --log-json "$log/nccl_profiled.json" >"$log/nccl_profiled.log" 2>&1
NZ_EMU_GPUS=2 timeout -k 5 120 mpirun -np 2 $two --log-json "$log/nccl_plain.json" >"$log/nccl_plain.log" 2>&1
python3 tests/lib/check_profile.py emu.nccl_profile cuda_events "1-2 of 2" "$log/nccl_profiled.log" "$log/nccl_profiled.json" \
  "$log/nccl_plain.log" "$log/nccl_plain.json"
exit 0
