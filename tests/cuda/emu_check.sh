#!/usr/bin/env bash
# emu_check.sh — the CUDA backend on nz_emu, the CPU emulator of CUDA in dev/emu/ (no GPU and no
# CUDA toolkit needed): every CUDA kernel, the cuBLAS and NCCL call sites, and every trainer with
# --device cuda run for real, with the emulator's checks on (guard pages after every device buffer,
# device memory unreachable from host code, poisoned fresh memory, barrier divergence, launch
# limits). What it cannot tell (speed, the GPU's exact bits) tests/cuda/gpu_check.sh measures on a GPU.
#   1. tests of the emulator: a correct kernel works, and so do the emulated tensor cores (WMMA);
#      each deliberately broken kernel is stopped or gives a wrong answer;
#   2. build/emu/tests/test_cuda_kernels: every kernel against the CPU reference, under every check
#      (NZ_EMU_CHECK=all: 0 findings) and a fuzzed schedule (NZ_EMU_SEED=2); the long tests (1024
#      tokens, 70001 rows) in bf16 only and unchecked, the same code at sizes the check covers;
#      build/emu/tests/test_cuda_inference: the KV-cached decode step against the CPU decoder;
#      build/emu/tests/test_cuda_quantize: ZeRO++'s block quantizer against the CPU's, bit for bit;
#   3. build/emu/tests/test_cuda_comm: one rank (device copies, and any NCCL call fatal:
#      NZ_EMU_NO_NCCL), ranks sharing one GPU (the MPI path through pinned buffers, a group's too:
#      no NCCL call either) and one GPU per rank (NZ_EMU_GPUS: the NCCL path, NCCL emulated over
#      MPI, a group on a communicator of its own), under the stream check
#      (NZ_EMU_CHECK=stream: the comm stream's events order every collective, 0 findings);
#   4. build/emu/tests/test_cuda_stages: every stage with --device cuda against stage0_ddp (ulysses
#      --sp 2 and tensor --tensor 2 too, and against their CPU runs; tensor's 3D with sequence
#      parallelism against its CPU run), and the
#      ledger and comm counts against the CPU run (NZ_TEST_QUICK: 2 steps of 16 tokens), and
#      --attention flash's activations (the log-sum-exp formula) and --batch auto, once with
#      one emulated GPU (2 ranks share it: MPI path) and once with two (NCCL path); the runs the
#      GPU count cannot change (one rank, or the CPU) are made once and checked by both
#      (the run cache, NZ_RUN_CACHE: test_cuda_stages.cpp, run_cached_any_gpus);
#   5. stage0_ddp trained with --attention flash against --attention gemm, fp32 and bf16 (head size 8:
#      the CUDA-core kernels), and bf16 with --heads 2 (head size 16: the tensor-core kernels);
#   6. a stuck NCCL collective (a failed peer, or silence) ends the run naming the collective (the
#      world's, and a group's: tensor's), and so does a communicator creation that never completes
#      (NZ_NCCL_INIT_TIMEOUT);
#   7. a one-rank trainer on --device cuda, started without mpirun: no NCCL call (NZ_EMU_NO_NCCL=1),
#      NZ_PROFILE=1's line and JSON from CUDA events, the same losses without it, and the JSON's
#      gpu_memory against the ledger (tests/lib/check_profile.py).
#   8. the checks (NZ_EMU_CHECK, dev/emu/check.h): every case of the catalogue of broken kernels and
#      stream orders (tests/cuda/emu_catalogue.cu) reported by its check, and right with every other
#      check on; the flash attention mutants (dev/emu/flash_mutants.pl) reported by the race check;
#      the trainers' stream mutants (dev/emu/stream_mutants.pl) reported by the stream check and
#      training the same losses without it; every trainer with --device cuda under every check
#      (stream order included; ulysses at S = 2 on NCCL and S = 4 on one shared GPU; tensor at T = 2 with --sequence-parallel),
#      0 findings;
#   9. make emu-check: a clean program (its own exit status, ARGS as words), a broken one (the
#      finding, non-zero), and bad input (no CU, a missing file, a compile error, a hang).
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

# 0. the objects the emulator's build takes from the real build (dev/emu.mk: those that include no
# header of the CUDA toolkit) call nothing of it: no cuda*/cublas*/nccl* symbol left to link. And
# dev/emu/uses_toolkit.sh sees every object that does call it without the toolkit's paths too, as
# where its headers lie in a system folder (/usr/local/include, which -MMD leaves out of the .d files).
# (A build without the CUDA toolkit, CUDA=0 in its configuration: the emulator's build compiles every
# object itself and takes none, so there is nothing to check.)
if ! grep -q ' CUDA=1 ' "$BUILD/config.flags" 2>/dev/null; then
  echo "NZRESULT SKIP emu.reuse.toolkit_callers_compiled (a build without the CUDA toolkit: the emulator's build takes no object from it)"
elif [ -d "$BUILD/obj/common" ]; then
  copied=0 compiled=0 bad=""
  while read -r e; do
    rel=${e#"$EMU"/obj/}; real=$BUILD/obj/$rel
    [ -f "$real" ] && [ -f "${real%.o}.d" ] || continue
    calls=$(nm -u "$real" 2>/dev/null | grep -cE ' (cuda|cublas|nccl)[A-Z]')
    pch=""; case $rel in tests/*) pch=$BUILD/obj/tests/lib/precompiled.h.d;; esac
    if cmp -s "$e" "$real"; then
      copied=$((copied + 1)); [ "$calls" = 0 ] || bad+=" $rel(copied, calls the toolkit)"
    else compiled=$((compiled + 1)); fi
    if [ "$calls" != 0 ] && ! bash dev/emu/uses_toolkit.sh "" "${real%.o}.d" $pch; then
      bad+=" $rel(not seen without the toolkit's paths)"
    fi
  done < <(find "$EMU/obj" -name '*.o' -not -path "$EMU/obj/gen/*")
  if [ -z "$bad" ] && [ $copied -gt 0 ]; then
    echo "NZRESULT PASS emu.reuse.toolkit_callers_compiled ($copied objects taken from the real build, $compiled compiled again)"
  else
    echo "NZRESULT FAIL emu.reuse.toolkit_callers_compiled ($copied taken, $compiled compiled;${bad:- none taken})"
  fi
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
selftest mask_syncwarp "__syncwarp by lane 0 with mask 0xffff0000, which leaves the lane out"
selftest mask_shuffle "a shuffle by lane 0 with mask 0xffff0000, which leaves the lane out"

# 2-4. the GoogleTest suites, their NZRESULT lines renamed emu.<label>.<test> (tests/lib/gtest_run.sh)
source tests/lib/gtest_run.sh
gtest() { run_gtest emu "$1" "$log" "${@:2}"; }
# The kernels under every check and a fuzzed schedule (NZ_EMU_SEED: threads and blocks released in a
# random order): every test passing, no finding. Unchecked, at a third of what checking them would
# cost: the two long tests (1024 tokens; 70001 rows), which run the same kernels as the short ones
# through more tiles and blocks, in bf16 only (the tensor-core kernels; the column sums' one kernel);
# and the run-to-run tests, which run the kernels checked above a second time, for their bits.
long='*LongSequence*:*ColumnSumsOverManyRows:*RunToRunBitwise'
start=$SECONDS
gtest kernels 600 env NZ_EMU_CHECK=all NZ_EMU_SEED=2 "$EMU/tests/test_cuda_kernels" --gtest_filter="-$long"
n=$(grep -c '^emu-check:' "$log/kernels.log")
# shellcheck disable=SC2154  # n_pass, n_fail: set by run_gtest
if [ "$n" = 0 ] && grep -q '0 findings' "$log/kernels.log" && [ "$n_pass" -gt 40 ] && [ "$n_fail" = 0 ]; then
  echo "NZRESULT PASS emu.kernels_checked ($n_pass tests, every check on, $(grep -o '[0-9]* loads and stores' \
        "$log/kernels.log") checked, 0 findings, $((SECONDS - start)) s)"
else
  echo "NZRESULT FAIL emu.kernels_checked ($n finding lines, $n_fail failed; see $log/kernels.log)"
  grep -m3 '^emu-check:' "$log/kernels.log"
fi
gtest kernels_unchecked 300 env NZ_EMU_SEED=2 "$EMU/tests/test_cuda_kernels" \
  --gtest_filter='CudaKernels/bf16.FlashAttentionLongSequence:CudaKernels/bf16.ColumnSumsOverManyRows:*RunToRunBitwise'
gtest inference 120 "$EMU/tests/test_cuda_inference"
gtest quantize 120 "$EMU/tests/test_cuda_quantize"  # tests/zeropp/test_cuda_quantize.cpp
# The collectives under the stream check (a finding makes the run exit 66: a FAIL line), the busy
# copies of the ordering test at 1 MB (NZ_TEST_QUICK: on the emulator their size proves nothing)
comm=(env NZ_EMU_CHECK=stream NZ_TEST_QUICK=1)
gtest comm_np1_local 120 "${comm[@]}" NZ_EMU_NO_NCCL=1 mpirun -np 1 "$EMU/tests/test_cuda_comm"
gtest comm_np1_mpi 120 "${comm[@]}" NZ_COMM=mpi mpirun -np 1 "$EMU/tests/test_cuda_comm"
gtest comm_np1_nccl 120 "${comm[@]}" NZ_COMM=nccl mpirun -np 1 "$EMU/tests/test_cuda_comm"
gtest comm_np2_shared 120 "${comm[@]}" NZ_EMU_NO_NCCL=1 mpirun -np 2 "$EMU/tests/test_cuda_comm"
gtest comm_np2_nccl 120 "${comm[@]}" NZ_EMU_GPUS=2 mpirun -np 2 "$EMU/tests/test_cuda_comm"
gtest comm_np3_nccl 120 "${comm[@]}" NZ_EMU_GPUS=3 mpirun -np 3 "$EMU/tests/test_cuda_comm"
# the run cache the two stages runs share: tests/run_all.sh's, or one of this check's own
[ -n "${NZ_RUN_CACHE:-}" ] || export NZ_RUN_CACHE=$log/runs
gtest stages_1gpu 600 env NZ_BIN_DIR="$EMU/bin" NZ_TEST_QUICK=1 "$EMU/tests/test_cuda_stages"
gtest stages_2gpus 600 env NZ_BIN_DIR="$EMU/bin" NZ_TEST_QUICK=1 NZ_EMU_GPUS=2 "$EMU/tests/test_cuda_stages"
[ "$NZ_RUN_CACHE" = "$log/runs" ] && rm -rf "$NZ_RUN_CACHE"  # its model files; the logs stay
for l in stages_1gpu stages_2gpus; do grep -E '^NZTABLE (stage .* N=2 |ulysses |tensor )' "$log/$l.log" | sed "s/^NZTABLE /  $l: /"; done

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
    timeout -k 5 120 "$EMU/bin/stage0_ddp" --device cuda --preset tiny --seq 16 --batch 2 --steps 2 --eval-every 0 \
      --eval-windows 2 --precision $prec $heads --attention $a >"$log/attention_$a.$run.log" 2>&1
  done
  worst=$(paste <(grep -o '^step .*| loss [0-9.]*' "$log/attention_gemm.$run.log" | awk '{print $NF}') \
                <(grep -o '^step .*| loss [0-9.]*' "$log/attention_flash.$run.log" | awk '{print $NF}') |
          awk 'BEGIN {w = -1} NF == 2 {d = $1 - $2; if (d < 0) d = -d; if (d > w) w = d} END {print w}')
  steps=$(grep -c '^step ' "$log/attention_flash.$run.log")
  if [ "$steps" = 2 ] && grep -q 'attention flash' "$log/attention_flash.$run.log" &&
     awk -v w="$worst" -v b="$bound" 'BEGIN {exit !(w >= 0 && w <= b)}'; then
    echo "NZRESULT PASS emu.flash_attention_training.$run (2 steps, largest loss difference $worst <= $bound)"
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
# and on a group's communicator (tensor --tensor 2: its tensor and data-parallel groups'): the
# collective named with its group
rc=0
NZ_EMU_GPUS=2 NZ_EMU_NCCL_STUCK=hang NZ_NCCL_TIMEOUT=1 timeout -k 5 60 mpirun -np 2 "$EMU/bin/tensor" --device cuda \
  --tensor 2 --preset tiny --seq 16 --batch 2 --steps 2 --eval-every 0 --eval-windows 2 >"$log/nccl_stuck_group.log" 2>&1 || rc=$?
named='NCCL [a-z-]* #[0-9]* on the \(tensor\|data-parallel\) group ([0-9]* fp32 elements) has not completed after 1 s'
if [ $rc != 0 ] && [ $rc != 124 ] && [ $rc != 137 ] && grep -q "$named" "$log/nccl_stuck_group.log"; then
  echo "NZRESULT PASS emu.nccl_stuck.group (exit $rc: $(grep -o "$named" "$log/nccl_stuck_group.log" | head -1))"
else
  echo "NZRESULT FAIL emu.nccl_stuck.group (exit $rc, expected a non-zero exit naming a group's collective; see $log/nccl_stuck_group.log)"
fi
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
# 8. the checks. The catalogue: each case reported by its check (exit 66, the line "emu-check: KIND:"),
#    and with that check off and every other on: the right answer ("ok:"), exit 0, no finding.
catalogue() {  # case kind
  local c=$1 kind=$2 on="$log/catalogue_$1.on.log" off="$log/catalogue_$1.off.log" rc_on=0 rc_off=0 others line
  others=$(echo race,uninit,bounds,misaligned,stream | tr ',' '\n' | grep -vx "$kind" | paste -sd,)
  line=$([ "$kind" = stream ] && echo stream-race || echo "$kind")  # the finding line's kind
  NZ_EMU_CHECK=$kind timeout -k 5 60 "$EMU/tests/emu_catalogue" "$c" >"$on" 2>&1 || rc_on=$?
  NZ_EMU_CHECK=$others timeout -k 5 60 "$EMU/tests/emu_catalogue" "$c" >"$off" 2>&1 || rc_off=$?
  if [ $rc_on = 66 ] && grep -q "^emu-check: $line: " "$on" && [ $rc_off = 0 ] && grep -q '^ok: ' "$off" &&
     ! grep -q '^emu-check:' "$off"; then
    echo "NZRESULT PASS emu.catalogue.$c ($kind reported; with it off: $(grep '^ok: ' "$off" | cut -c5-))"
  else
    echo "NZRESULT FAIL emu.catalogue.$c (with $kind on: exit $rc_on, $(grep -c "^emu-check: $line: " "$on") findings;" \
         "with it off: exit $rc_off, $(head -1 "$off"); see $on, $off)"
  fi
}
catalogue counter race
catalogue first_phase race
catalogue across_blocks race
catalogue async_double_buffer race
catalogue wmma_no_syncwarp race
catalogue static_accumulator uninit
catalogue fmaxf_hides_nan uninit
catalogue before_start bounds
catalogue in_padding bounds
catalogue misaligned_uint4 misaligned
catalogue misaligned_float misaligned
catalogue copy_no_event stream
catalogue pinned_no_sync stream
catalogue pinned_reuse stream
catalogue comm_no_wait stream
# correct programs (the atomic fix of counter, the warp functions, the four stream cases each with its
# event or synchronisation): right, and silent under every check
for c in atomic_counter warp_api streams_ordered; do
  out="$log/catalogue_$c.log" rc=0
  NZ_EMU_CHECK=all timeout -k 5 60 "$EMU/tests/emu_catalogue" "$c" >"$out" 2>&1 || rc=$?
  if [ $rc = 0 ] && grep -q '^ok: ' "$out" && ! grep -q '^emu-check:' "$out"; then
    echo "NZRESULT PASS emu.catalogue.$c (every check on, no finding: $(grep '^ok: ' "$out" | cut -c5-))"
  else
    echo "NZRESULT FAIL emu.catalogue.$c (exit $rc: $(head -1 "$out"); see $out)"
  fi
done

# The flash attention mutants on the bf16 kernel test (the tensor-core kernels): the race check names
# the mutated kernel. With it off, dq_no_syncwarp passes the test (the emulator's WMMA load orders
# the lanes, a GPU's does not); the other two give wrong answers on the emulator too.
for m in dq_no_syncwarp early_prefetch q_no_barrier; do
  on="$log/mutant_$m.on.log" off="$log/mutant_$m.off.log" rc_on=0 rc_off=0
  NZ_EMU_CHECK=race timeout -k 5 120 "$EMU/tests/flash_mutant_$m" --gtest_filter='CudaKernels/bf16.FlashAttention' >"$on" 2>&1 || rc_on=$?
  # with it off: every other check on where the test passes (dq_no_syncwarp: no other check sees it),
  # none where the test fails anyway
  others=$([ $m = dq_no_syncwarp ] && echo uninit,bounds,misaligned,stream || echo none)
  NZ_EMU_CHECK=$others timeout -k 5 120 "$EMU/tests/flash_mutant_$m" \
    --gtest_filter='CudaKernels/bf16.FlashAttention' >"$off" 2>&1 || rc_off=$?
  want_off=$([ $m = dq_no_syncwarp ] && echo 'NZRESULT PASS' || echo 'NZRESULT FAIL')
  if [ $rc_on != 0 ] && grep -q '^emu-check: race: .* in kernel flash_.*kernels_flash_attention.cu:' "$on" &&
     grep -q "^$want_off CudaKernels/bf16.FlashAttention" "$off" && ! grep -q '^emu-check:' "$off"; then
    echo "NZRESULT PASS emu.flash_mutant.$m (race reported: $(grep -m1 -o 'in kernel flash_[a-z_]*' "$on");" \
         "with it off the kernel test $([ $m = dq_no_syncwarp ] && echo passes || echo fails))"
  else
    echo "NZRESULT FAIL emu.flash_mutant.$m (exit $rc_on, $(grep -c '^emu-check: race:' "$on") race lines; with it off:" \
         "$(grep -m1 'NZRESULT' "$off"); see $on, $off)"
  fi
done

# one training run on the tensor-core flash kernels, every check on: no finding, and the same losses as
# section 5's unchecked run with these flags (attention_flash.bf16.wmma)
checked="$EMU/bin/stage0_ddp --device cuda --preset tiny --seq 16 --batch 2 --steps 2 --eval-every 0 --eval-windows 2
         --precision bf16 --heads 2 --attention flash"
rc=0
NZ_EMU_CHECK=all NZ_EMU_SEED=3 timeout -k 5 300 $checked >"$log/stage_checked.log" 2>&1 || rc=$?
cp "$log/attention_flash.bf16.wmma.log" "$log/stage_unchecked.log"
if [ $rc = 0 ] && ! grep -q '^emu-check:' "$log/stage_checked.log" &&
   [ "$(grep -c '^step ' "$log/stage_checked.log")" = 2 ] &&
   diff <(grep -o '^step .*| loss [0-9.]*' "$log/stage_checked.log") <(grep -o '^step .*| loss [0-9.]*' "$log/stage_unchecked.log") >/dev/null; then
  echo "NZRESULT PASS emu.stage_checked (stage0_ddp bf16 flash, every check on: $(grep -o '[0-9]* loads and stores' \
        "$log/stage_checked.log") checked, 0 findings, the same losses)"
else
  echo "NZRESULT FAIL emu.stage_checked (exit $rc, $(grep -c '^emu-check:' "$log/stage_checked.log") finding lines; see $log/stage_checked.log)"
fi
# every other trainer on 2 ranks and 2 emulated GPUs (the NCCL path; stage3 with its prefetch, the
# offload copy stream, the pipeline's sends, infinity's slices up from the host and back), every check
# on: 2 steps, no finding
for s in stage1 stage2 stage3 offload pipeline infinity; do
  [ -x "$EMU/bin/$s" ] || continue
  out="$log/stage_checked_$s.log" rc=0
  NZ_EMU_GPUS=2 NZ_EMU_CHECK=all timeout -k 5 300 mpirun -np 2 "$EMU/bin/$s" --device cuda --preset tiny --seq 16 --batch 2 \
    --steps 2 --eval-every 0 --eval-windows 2 --precision bf16 --heads 2 --attention flash >"$out" 2>&1 || rc=$?
  if [ $rc = 0 ] && ! grep -q '^emu-check:' "$out" && [ "$(grep -c '^step ' "$out")" = 2 ]; then
    echo "NZRESULT PASS emu.stage_checked.$s (2 ranks, every check on: $(grep -o '[0-9]* loads and stores' "$out" |
          awk '{n += $1} END {print n}') loads and stores checked, 0 findings)"
  else
    echo "NZRESULT FAIL emu.stage_checked.$s (exit $rc, $(grep -c '^emu-check:' "$out") finding lines; see $out)"
  fi
done
# ulysses (--sp S: its all-to-alls on device memory, the layout kernels around them), every check on:
# S = 2 on 2 ranks and 2 emulated GPUs (NCCL's grouped sends and receives), and S = 4 on 4 ranks
# sharing one (MPI through pinned host memory); bf16, the gemm attention (flash is refused for this
# rung), 2 steps, no finding. (Its numbers against stage0_ddp and its CPU run: test_cuda_stages.)
for u in 2:2 4:1; do
  S=${u%%:*} gpus=${u##*:}
  out="$log/stage_checked_ulysses_sp$S.log" rc=0
  NZ_EMU_GPUS=$gpus NZ_EMU_CHECK=all timeout -k 5 300 mpirun -np "$S" "$EMU/bin/ulysses" --device cuda --sp "$S" --preset tiny \
    --seq 16 --batch 2 --steps 2 --eval-every 0 --eval-windows 2 --precision bf16 >"$out" 2>&1 || rc=$?
  path=$([ "$gpus" = 1 ] && echo "sharing one GPU: MPI" || echo "one GPU each: NCCL")
  if [ $rc = 0 ] && ! grep -q '^emu-check:' "$out" && [ "$(grep -c '^step ' "$out")" = 2 ] &&
     [ "$(grep -c '0 findings' "$out")" = "$S" ]; then
    echo "NZRESULT PASS emu.stage_checked.ulysses_sp$S ($S ranks $path, every check on: $(grep -o '[0-9]* loads and stores' "$out" |
          awk '{n += $1} END {print n}') loads and stores checked, 0 findings)"
  else
    echo "NZRESULT FAIL emu.stage_checked.ulysses_sp$S (exit $rc, $(grep -c '^emu-check:' "$out") finding lines; see $out)"
  fi
done
# tensor (--tensor 2 --sequence-parallel: the vocabulary's kernels, the tensor group's all-reduces,
# reduce-scatters and all-gathers on device memory), every check on: 2 ranks and 2 emulated GPUs, bf16,
# the gemm attention (flash is refused for this rung on the GPU), 2 steps, no finding. (Its numbers against stage0_ddp and its CPU run: test_cuda_stages.)
out="$log/stage_checked_tensor.log" rc=0
NZ_EMU_GPUS=2 NZ_EMU_CHECK=all timeout -k 5 300 mpirun -np 2 "$EMU/bin/tensor" --device cuda --tensor 2 --sequence-parallel --preset tiny \
  --seq 16 --batch 2 --steps 2 --eval-every 0 --eval-windows 2 --precision bf16 >"$out" 2>&1 || rc=$?
if [ $rc = 0 ] && ! grep -q '^emu-check:' "$out" && [ "$(grep -c '^step ' "$out")" = 2 ] &&
   [ "$(grep -c '0 findings' "$out")" = 2 ]; then
  echo "NZRESULT PASS emu.stage_checked.tensor_t2_sp (2 ranks, one GPU each, every check on: $(grep -o '[0-9]* loads and stores' \
        "$out" | awk '{n += $1} END {print n}') loads and stores checked, 0 findings)"
else
  echo "NZRESULT FAIL emu.stage_checked.tensor_t2_sp (exit $rc, $(grep -c '^emu-check:' "$out") finding lines; see $out)"
fi
# and on the MPI path (2 ranks sharing one emulated GPU: pinned staging buffers, synchronous copies),
# stage3, offload and infinity under the stream check
for s in stage3 offload infinity; do
  out="$log/stage_streams_$s.log" rc=0
  NZ_EMU_CHECK=stream timeout -k 5 300 mpirun -np 2 "$EMU/bin/$s" --device cuda --preset tiny --seq 16 --batch 2 \
    --steps 2 --eval-every 0 --eval-windows 2 --precision bf16 >"$out" 2>&1 || rc=$?
  if [ $rc = 0 ] && ! grep -q '^emu-check:' "$out" && [ "$(grep -c '^step ' "$out")" = 2 ]; then
    echo "NZRESULT PASS emu.stage_streams.$s (2 ranks on one GPU, the stream check on: $(grep -o '[0-9]* stream operations' \
          "$out" | awk '{n += $1} END {print n}') stream operations ordered, 0 findings)"
  else
    echo "NZRESULT FAIL emu.stage_streams.$s (exit $rc, $(grep -c '^emu-check:' "$out") finding lines; see $out)"
  fi
done
# The trainers' own stream patterns broken (dev/emu/stream_mutants.pl), on the NCCL path with the
# flags of the checked runs above: reported by the stream check, naming the two operations; with it
# off, the run trains the same losses as the real trainer checked above (the bug is silent here).
for m in comm_no_wait:stage2:'ncclReduceScatter.*reads it; kernel' copy_no_wait:offload:'cudaMemcpyAsync (device to host.*reads it;' \
         host_no_sync:offload:'host thread .* accesses it while cudaMemcpyAsync (device to host'; do
  name=${m%%:*} rest=${m#*:}
  trainer=${rest%%:*} want=${rest#*:}
  on="$log/stream_mutant_$name.on.log" off="$log/stream_mutant_$name.off.log" rc_on=0 rc_off=0
  flags="--device cuda --preset tiny --seq 16 --batch 2 --steps 2 --eval-every 0 --eval-windows 2 --precision bf16 --heads 2
         --attention flash"
  # shellcheck disable=SC2086  # flags are words
  NZ_EMU_GPUS=2 NZ_EMU_CHECK=stream timeout -k 5 300 mpirun -np 2 "$EMU/tests/stream_mutant_$name" $flags >"$on" 2>&1 || rc_on=$?
  # shellcheck disable=SC2086
  NZ_EMU_GPUS=2 timeout -k 5 300 mpirun -np 2 "$EMU/tests/stream_mutant_$name" $flags >"$off" 2>&1 || rc_off=$?
  if [ $rc_on = 66 ] && grep -q "^emu-check: stream-race: .*$want" "$on" && [ $rc_off = 0 ] && ! grep -q '^emu-check:' "$off" &&
     [ "$(grep -c '^step ' "$off")" = 2 ] &&
     diff <(grep -o '^step .*| loss [0-9.]*' "$off") <(grep -o '^step .*| loss [0-9.]*' "$log/stage_checked_$trainer.log") >/dev/null; then
    echo "NZRESULT PASS emu.stream_mutant.$name ($trainer: $(grep -m1 '^emu-check: stream-race' "$on" | cut -d: -f3- | cut -c2-110)...;" \
         "with the check off the same losses as the real $trainer)"
  else
    echo "NZRESULT FAIL emu.stream_mutant.$name (with the stream check: exit $rc_on, $(grep -c '^emu-check: stream-race' "$on")" \
         "findings; off: exit $rc_off; see $on, $off)"
  fi
done

# 9. make emu-check
leftovers_before=$(ls -d /tmp/nz-emu-check.* 2>/dev/null | wc -l)
emu_check() {  # name, expected status (ok: 0; findings: non-zero with the line; usage: 2), grep pattern, make args...
  local name=$1 want=$2 pattern=$3 out="$log/emu-check_$1.log" rc=0
  shift 3
  timeout -k 5 180 make --no-print-directory BUILD="$BUILD" emu-check "$@" >"$out" 2>&1 || rc=$?
  local ok=0
  case $want in
    ok) [ $rc = 0 ] && grep -q -- "$pattern" "$out" && ok=1 ;;
    finding) [ $rc != 0 ] && grep -q -- "$pattern" "$out" && ok=1 ;;
    usage) [ $rc = 2 ] && [ "$(grep -c 'emu-check' "$out")" -ge 1 ] && grep -q -- "$pattern" "$out" && ok=1 ;;
  esac
  if [ $ok = 1 ]; then echo "NZRESULT PASS emu.make_emu_check.$name ($(grep -m1 -- "$pattern" "$out" | cut -c1-120))"
  else echo "NZRESULT FAIL emu.make_emu_check.$name (exit $rc, expected $want with '$pattern'; see $out)"; fi
}
# shellcheck disable=SC2016  # the $ and backquotes are the point: they must reach the program as they are
emu_check clean ok '^arg \[two words\]$' CU=tests/cuda/emu_check_clean.cu ARGS='one "two words" $(HOME) `id` ;'
if grep -qx 'arg \[$(HOME)\]' "$log/emu-check_clean.log" && grep -qx 'arg \[`id`\]' "$log/emu-check_clean.log" &&
   grep -qx 'arg \[;\]' "$log/emu-check_clean.log" && grep -q '^ok: 0 of 128' "$log/emu-check_clean.log"; then
  echo "NZRESULT PASS emu.make_emu_check.args_unexpanded (5 words, none expanded)"
else
  echo "NZRESULT FAIL emu.make_emu_check.args_unexpanded (see $log/emu-check_clean.log)"
fi
emu_check race finding '^emu-check: race: .*in kernel count.*tests/cuda/emu_catalogue.cu:' CU=tests/cuda/emu_catalogue.cu ARGS=counter
emu_check no_cu usage 'no program given (CU is empty)'
emu_check missing_file usage 'no_such_file.cu: no such file' CU=tests/cuda/no_such_file.cu
bad=$(mktemp -d /tmp/nanozero-emu-bad.XXXXXX)
printf '#include <cuda_runtime.h>\n__global__ void k(float* x) { x[0] = not_declared; }\nint main() { return 0; }\n' >"$bad/broken.cu"
printf '#include <cuda_runtime.h>\nint main() { volatile int spin = 1; while (spin) {} return 0; }\n' >"$bad/hangs.cu"
emu_check compile_error usage 'broken.cu does not compile against the emulator' CU="$bad/broken.cu"
grep -q "not_declared" "$log/emu-check_compile_error.log" ||
  echo "NZRESULT FAIL emu.make_emu_check.compile_error_messages (the compiler's own lines are missing)"
EMU_CHECK_TIMEOUT=2 emu_check hang finding 'hangs.cu did not finish within 2 s' CU="$bad/hangs.cu"
rm -rf "$bad"
leftovers_after=$(ls -d /tmp/nz-emu-check.* 2>/dev/null | wc -l)
if [ "$leftovers_after" = "$leftovers_before" ] && ! pgrep -f "nz-emu-check\..*/hangs" >/dev/null; then
  echo "NZRESULT PASS emu.make_emu_check.nothing_left (no build folder or process left behind)"
else
  echo "NZRESULT FAIL emu.make_emu_check.nothing_left ($((leftovers_after - leftovers_before)) /tmp/nz-emu-check.* folders left)"
fi
exit 0
