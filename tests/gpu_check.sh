#!/usr/bin/env bash
# gpu_check.sh — everything that needs a CUDA GPU, in one run of about 5 minutes on one H100 or
# H200 (the budget is 8). It builds, then runs:
#   1. build/tests/test_cuda_kernels   every CUDA kernel against the CPU reference;
#   2. build/tests/test_cuda_comm      the collectives on GPU buffers: 1 rank (NCCL), 1 rank with
#                                      NZ_COMM=mpi, 2 and 4 ranks (on one GPU: the MPI path);
#   3. build/tests/test_cuda_stages    every stage on the GPU vs stage0_ddp within the stated bound
#                                      (tiny, 1 and 2 ranks), the ledger and comm counts vs the CPU;
#   4. the tour's memory table: the gpt2 preset, 4 ranks sharing one GPU, 3 steps, every stage built;
#   5. tokens per second and MFU on one rank: gpt2, bf16, batch 8 x seq 1024, 20 steps, for
#      stage0_ddp and stage3 with cuBLAS (--kernels fast), and stage0_ddp with the hand-written
#      tiled kernels (--kernels reference).
# and prints a short table last. Every check also prints an NZRESULT line (tests/run_all.sh).
#
# Without a visible GPU it prints one SKIP line and exits 0: tests/run_all.sh runs every
# tests/*_check.sh, and `make test` must stay harmless on machines without a GPU.
#   bash tests/gpu_check.sh                  (BUILD=dir for another build directory)
set -u
cd "$(dirname "$0")/.." || exit 1

gpu_visible() {
  case "${CUDA_VISIBLE_DEVICES-unset}" in "" | -1 | none | NoDevFiles) return 1 ;; esac
  if command -v nvidia-smi >/dev/null 2>&1; then
    nvidia-smi -L 2>/dev/null | grep -q '^GPU '
    return
  fi
  ls /proc/driver/nvidia/gpus/* >/dev/null 2>&1
}
if ! gpu_visible; then
  echo "NZRESULT SKIP gpu_check (no CUDA GPU visible)"
  exit 0
fi

BUILD=${BUILD:-build}
BIN=$BUILD/bin
log=$(mktemp -d /tmp/nanozero-gpu.XXXXXX)
t0=$SECONDS
pass=0 fail=0
summary=()  # rows of the final table: "check|result"

result() {  # PASS|FAIL name [why]
  echo "NZRESULT $1 gpu.$2${3:+ ($3)}"
  if [ "$1" = PASS ]; then pass=$((pass + 1)); else fail=$((fail + 1)); fi
}
row() { summary+=("$1|$2"); }

# A GoogleTest binary: its NZRESULT lines renamed gpu.<label>.<test> (tests/gtest_run.sh), counted.
source tests/gtest_run.sh
gtest() {  # label, timeout, command...
  run_gtest gpu "$1" "$log" "${@:2}"
  pass=$((pass + n_pass)) fail=$((fail + n_fail))
}

command -v nvcc >/dev/null 2>&1 || [ ! -x /usr/local/cuda/bin/nvcc ] || export PATH=/usr/local/cuda/bin:$PATH
echo "== build ($BUILD, $(command -v nvcc || echo 'no nvcc: CPU only'))"
if ! make -j"$(nproc)" BUILD="$BUILD" all >"$log/build.log" 2>&1; then
  tail -20 "$log/build.log"
  echo "NZRESULT FAIL gpu.build (see $log/build.log)"
  exit 1
fi
probe=$(timeout 120 mpirun -np 1 "$BIN/stage0_ddp" --device cuda --preset tiny --seq 32 --steps 1 --eval-windows 1 2>&1)
if ! grep -q '^cuda: ' <<<"$probe"; then
  echo "$probe" | tail -5
  echo "NZRESULT FAIL gpu.device (stage0_ddp --device cuda did not run on the GPU: $BUILD built without nvcc? make clean, then rerun with nvcc on PATH)"
  exit 1
fi
gpu_line=$(grep '^cuda: ' <<<"$probe" | head -1)
echo "$gpu_line"

echo "== 1. CUDA kernels vs the CPU reference"
gtest kernels 300 "$BUILD/tests/test_cuda_kernels"
row "kernel tests (test_cuda_kernels)" "$n_pass passed, $n_fail failed"

echo "== 2. collectives on GPU buffers"
comm_row=""
for np in 1 1mpi 2 4; do  # 1mpi: one rank, NZ_COMM=mpi (the MPI path where NCCL would be chosen)
  label=comm_np$np
  if [ $np = 1mpi ]; then
    gtest $label 120 env NZ_COMM=mpi mpirun -np 1 "$BUILD/tests/test_cuda_comm"
  else
    gtest $label 120 mpirun -np $np "$BUILD/tests/test_cuda_comm"
  fi
  path=$(grep -o 'collectives on the GPU: [A-Za-z]*' "$log/$label.log" | head -1)
  comm_row+="np=${np/1mpi/1} ${path##* }: $n_pass/$((n_pass + n_fail)); "
done
row "collectives on GPU buffers (test_cuda_comm)" "${comm_row%; }"

echo "== 3. every stage on the GPU vs stage0_ddp (tiny), ledger and comm counts vs the CPU"
gtest stages 420 env NZ_BIN_DIR="$BIN" "$BUILD/tests/test_cuda_stages"
grep '^NZTABLE' "$log/stages.log" | sed 's/^NZTABLE /  /'
n_cmp=$(grep -c '^NZTABLE stage ' "$log/stages.log")
n_bit=$(grep '^NZTABLE stage ' "$log/stages.log" | grep -c 'bitwise')
n_out=$(grep '^NZTABLE stage ' "$log/stages.log" | grep -c 'OUTSIDE')
row "stages vs stage0_ddp on the GPU (tiny, N=1,2)" "$n_cmp comparisons: $n_bit bitwise, $((n_cmp - n_bit - n_out)) within bound, $n_out outside"
n_led=$(grep -c '^NZTABLE ledger ' "$log/stages.log")
n_same=$(grep '^NZTABLE ledger ' "$log/stages.log" | grep -c 'identical')
row "ledger model state + comm counts, GPU vs CPU" "$n_same of $n_led runs identical"
row "test_cuda_stages" "$n_pass passed, $n_fail failed"

stages=()
for s in stage0_ddp stage1 stage2 stage3 offload; do [ -x "$BIN/$s" ] && stages+=("$s"); done

echo "== 4. the tour's memory table: gpt2, 4 ranks on one GPU"
TOUR="--preset gpt2 --batch 2 --seq 128 --steps 3 --lr 3e-4 --eval-every 0 --eval-windows 4 --device cuda"
tour_ok=0
jsons=()
for s in "${stages[@]}"; do
  rc=0
  timeout -k 10 180 mpirun -np 4 "$BIN/$s" $TOUR --quiet --log-json "$log/tour_$s.json" >"$log/tour_$s.log" 2>&1 || rc=$?
  if [ $rc = 0 ] && grep -q 'ledger matches the formulas' "$log/tour_$s.log"; then
    result PASS "tour.$s"
    tour_ok=$((tour_ok + 1))
    jsons+=("$log/tour_$s.json")
  else
    result FAIL "tour.$s" "exit $rc or ledger does not match its formulas; see $log/tour_$s.log"
  fi
  grep -E '^(cuda|GPU memory):' "$log/tour_$s.log" | sed "s/^/  $s: /"
done
if [ ${#jsons[@]} -gt 0 ] && command -v python3 >/dev/null 2>&1; then
  python3 scripts/tour_table.py "${jsons[@]}" | tee "$log/tour_table.txt"
else
  for s in "${stages[@]}"; do sed -n '/^per-rank memory/,/^ledger /p' "$log/tour_$s.log"; done
fi
row "gpt2 memory table, 4 ranks on one GPU" "$tour_ok of ${#stages[@]} stages ran and match their formulas"

echo "== 5. throughput on one rank: gpt2, bf16, batch 8 x seq 1024, 20 steps"
SPEED="--preset gpt2 --precision bf16 --batch 8 --seq 1024 --steps 20 --eval-every 0 --eval-windows 8 --device cuda"
speed_rows=()
for run in "stage0_ddp fast" "stage3 fast" "stage0_ddp reference"; do
  set -- $run
  [ -x "$BIN/$1" ] || continue
  out="$log/speed_$1_$2.log" rc=0
  timeout -k 10 240 mpirun -np 1 "$BIN/$1" $SPEED --kernels "$2" --quiet >"$out" 2>&1 || rc=$?
  line=$(grep '^throughput:' "$out" | head -1)
  if [ $rc = 0 ] && [ -n "$line" ]; then
    result PASS "speed.$1.$2"
    tok=$(sed -E 's/^throughput: ([0-9]+) tokens\/s.*/\1/' <<<"$line")
    mfu=$(grep -oE 'MFU [0-9.]+%' <<<"$line" | cut -d' ' -f2)
    ms=$(grep -o '[0-9.]* ms/step' "$out" | head -1)
    speed_rows+=("$(printf '%-11s %-9s %9s tokens/s  MFU %6s  (%s)' "$1" "$2" "$tok" "${mfu:-?}" "$ms")")
  else
    result FAIL "speed.$1.$2" "exit $rc; see $out"
    speed_rows+=("$(printf '%-11s %-9s FAILED (see %s)' "$1" "$2" "$out")")
  fi
  grep -E '^(throughput|GPU memory):' "$out" | sed "s/^/  $1 $2: /"
done

echo
echo "== gpu_check summary ($((SECONDS - t0)) s; logs in $log)"
echo "${gpu_line#cuda: }"
for r in "${summary[@]}"; do printf '  %-48s %s\n' "${r%%|*}" "${r#*|}"; done
echo "  tokens/s and MFU, gpt2 bf16, batch 8 x seq 1024, 1 rank:"
for r in "${speed_rows[@]}"; do echo "    $r"; done
echo "$pass passed, $fail failed"
[ "$fail" = 0 ]
