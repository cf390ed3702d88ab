#!/usr/bin/env bash
# gpu_check.sh — everything that needs a CUDA GPU, run from the GPU bundle (make gpu-bundle builds
# it on any machine with nvcc; the GPU machine needs only the driver, cuBLAS and NCCL, see
# host_libs.txt) in at most 7 minutes, and a table that is printed whatever happens:
#   bash build/gpu-bundle/gpu_check.sh
# Every row is printed as it completes (an NZRESULT line, tests/run_all.sh) and appended to
# rows.txt in the log folder; a trap prints the table on any exit (a failure, a timeout, Ctrl-C, a
# kill); every command runs under a timeout that is also capped by the global deadline.
#   preflight  bundle (complete, every library resolves: bundle_check.sh), gpu (visible),
#              compute_mode (Default: several processes may share the GPU), mpirun (2 ranks start,
#              as whatever user this is: MPICH's launcher needs no flag for root), device (a
#              trainer runs one step on the GPU)
#   kernels    test_cuda_kernels: every CUDA kernel against the CPU reference
#   comm.*     test_cuda_comm on device buffers: 1 rank (NCCL), 1 rank (MPI path), 4 ranks sharing
#              the GPU (MPI path through pinned host buffers)
#   stages     test_cuda_stages: every stage vs stage0_ddp on the GPU within the stated bound, and
#              the ledger and comm counts vs the CPU run
#   memory.*   the gpt2 preset on 4 ranks sharing the GPU, 3 steps, per stage: the ledger matches its
#              formulas; the ledger's peak beside what cudaMemGetInfo says is in use
#   speed.*    gpt2, bf16, batch 8 x seq 1024, 1 rank: tokens/s and MFU of stage0_ddp and stage3
#              (--attention gemm), and of stage0_ddp with --attention flash
#   sanitizer.* compute-sanitizer memcheck and racecheck on the kernel tests, if it is installed and
#              time is left
# Run from the repository (tests/cuda/gpu_check.sh, as `make test` does) without a visible GPU, it
# prints one SKIP line; with a GPU it first builds the bundle (a row like the others).
# For testing the check itself (tests/cuda/gpu_report_check.sh), never for results:
#   NZ_GPU_CHECK_DEADLINE=s   the global deadline (default 420)
#   NZ_GPU_CHECK_ROW_LIMIT=s  a cap on every row's own timeout
#   NZ_GPU_CHECK_SIMULATE="hang:ROW fail:ROW ..."  that row sleeps forever, or fails at once
#   NZ_GPU_CHECK_FAKE_GPU=1   act as if a GPU were visible (the binaries must be fakes then)
#   NZ_COMPUTE_SANITIZER=path compute-sanitizer to use (empty: none)
set -u
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
deadline=${NZ_GPU_CHECK_DEADLINE:-420}
row_cap=${NZ_GPU_CHECK_ROW_LIMIT:-100000}
simulate=" ${NZ_GPU_CHECK_SIMULATE:-} "
log=$(mktemp -d "${TMPDIR:-/tmp}/nanozero-gpu.XXXXXX")
rows=$log/rows.txt
: >"$rows"
t0=$SECONDS
child=""   # the row command running now (killed with the check)
watchdog=""

gpu_visible() {
  [ "${NZ_GPU_CHECK_FAKE_GPU:-0}" = 1 ] && return 0
  case "${CUDA_VISIBLE_DEVICES-unset}" in "" | -1 | none | NoDevFiles) return 1 ;; esac
  if command -v nvidia-smi >/dev/null 2>&1; then
    nvidia-smi -L 2>/dev/null | grep -q '^GPU '
    return
  fi
  ls /proc/driver/nvidia/gpus/* >/dev/null 2>&1
}

# ---- the rows: appended to rows.txt and printed the moment they are known ----
row() {  # STATUS (PASS FAIL TIMEOUT SKIP) name detail
  local secs=$((SECONDS - t0))
  printf '%s|%s|%s|%s\n' "$1" "$2" "$3" "$secs" >>"$rows"
  case "$1" in PASS) r=PASS ;; SKIP) r=SKIP ;; *) r=FAIL ;; esac
  echo "NZRESULT $r gpu.$2 ($1 at ${secs}s: $3)"
}

printed=0
print_table() {
  [ $printed = 1 ] && return
  printed=1
  local n_pass n_fail n_skip
  n_pass=$(grep -c '^PASS|' "$rows") n_skip=$(grep -c '^SKIP|' "$rows")
  n_fail=$(grep -c -v -e '^PASS|' -e '^SKIP|' "$rows")
  echo
  echo "== gpu_check: $((SECONDS - t0)) s of the ${deadline} s deadline; logs in $log"
  [ -n "${gpu_name:-}" ] && echo "   $gpu_name"
  printf '   %-8s %-22s %5s  %s\n' status row "at s" detail
  while IFS='|' read -r st name detail secs; do
    printf '   %-8s %-22s %5s  %s\n' "$st" "$name" "$secs" "$detail"
  done <"$rows"
  echo "   $n_pass passed, $n_fail failed, $n_skip skipped"
}

on_exit() {
  local rc=$?
  [ -n "$watchdog" ] && kill "$watchdog" 2>/dev/null
  print_table
  exit $rc
}
on_signal() {  # a kill, Ctrl-C, or the global deadline's watchdog
  [ -n "$child" ] && kill -TERM "$child" 2>/dev/null
  row FAIL aborted "got $1 during ${current:-?} (the global deadline is ${deadline} s)"
  exit 2
}
trap on_exit EXIT
trap 'on_signal SIGTERM' TERM
trap 'on_signal SIGINT' INT
trap 'on_signal SIGHUP' HUP
# The global deadline: every row's timeout is capped by the time left, and this watchdog ends the
# check (the table still printed) if anything outside a row hangs.
(trap 'kill $s 2>/dev/null; exit 0' TERM; sleep $((deadline + 15)) & s=$!; wait $s && kill -TERM $$) 2>/dev/null &
watchdog=$!

# run_row NAME LIMIT COMMAND... : the command's output in $log/NAME.log, its exit code in $rc.
# Returns 3 (and writes a SKIP row) when the deadline leaves too little time to start it; a
# timeout writes a TIMEOUT row and returns 2; otherwise returns 0 and the caller writes the row.
run_row() {
  local name=$1 limit=$2
  shift 2
  current=$name
  local left=$((deadline - (SECONDS - t0) - 5))
  if [ "$left" -lt 5 ]; then
    row SKIP "$name" "not started: $((left + 5)) s left of the ${deadline} s deadline"
    return 3
  fi
  [ "$limit" -gt "$row_cap" ] && limit=$row_cap
  [ "$limit" -gt "$left" ] && limit=$left
  case "$simulate" in
    *" hang:$name "*) set -- sleep 100000 ;;
    *" fail:$name "*) set -- bash -c 'echo "simulated failure (NZ_GPU_CHECK_SIMULATE)"; exit 1' ;;
  esac
  rc=0
  timeout -k 5 "$limit" "$@" >"$log/$name.log" 2>&1 &
  child=$!
  wait "$child" || rc=$?
  child=""
  if [ $rc = 124 ] || [ $rc = 137 ]; then
    row TIMEOUT "$name" "killed after ${limit} s; last line: $(tail -1 "$log/$name.log" | cut -c1-80)"
    return 2
  fi
  return 0
}

# A GoogleTest binary's row: its NZRESULT lines counted.
gtest_row() {  # NAME LIMIT COMMAND...
  local name=$1
  run_row "$@" || return 0
  local p f s
  p=$(grep -c '^NZRESULT PASS' "$log/$name.log") f=$(grep -c '^NZRESULT FAIL' "$log/$name.log")
  s=$(grep -c '^NZRESULT SKIP' "$log/$name.log")
  local what="$p passed, $f failed, $s skipped"
  if [ $rc = 0 ] && [ "$f" = 0 ] && [ "$p" -gt 0 ]; then row PASS "$name" "$what"
  else row FAIL "$name" "$what; exit $rc; see $log/$name.log"; fi
}

skip_rest() {  # why, rows...
  local why=$1 r
  shift
  for r in "$@"; do row SKIP "$r" "$why"; done
}
GPU_ROWS=(device kernels comm.np1.nccl comm.np1.mpi comm.np4.shared stages
          memory.stage0_ddp memory.stage1 memory.stage2 memory.stage3 memory.offload
          speed.stage0_ddp speed.stage3 speed.stage0_ddp.flash sanitizer.memcheck sanitizer.racecheck)

# ---- where the bundle is: beside this script, or built from the repository ----
if [ -f "$here/bundle_env.sh" ]; then
  B=$here
else
  repo=$(cd "$here/../.." && pwd)  # tests/cuda/ of the repository
  if ! gpu_visible; then
    trap - EXIT
    kill "$watchdog" 2>/dev/null
    echo "NZRESULT SKIP gpu_check (no CUDA GPU visible; on a GPU machine run bash build/gpu-bundle/gpu_check.sh)"
    exit 0
  fi
  B=${NZ_BUNDLE:-$repo/build/gpu-bundle}
  if run_row build 300 make -C "$repo" -j"$(nproc)" gpu-bundle; then
    if [ $rc = 0 ]; then row PASS build "$(grep -m1 '^gpu-bundle: ' "$log/build.log")"
    else row FAIL build "make gpu-bundle: exit $rc; $(grep -m1 -i error "$log/build.log" | cut -c1-100)"; fi
  fi
  [ -f "$B/bundle_env.sh" ] || { skip_rest "no bundle" bundle host_libs gpu compute_mode mpirun "${GPU_ROWS[@]}"; exit 1; }
fi
cd "$B" || exit 1

# ---- preflight ----
missing=""
source ./bundle_env.sh
if bundle_env "$B"; then env_ok=1; else env_ok=0; fi  # (unpacks the programs: then look for them)
for f in bin/stage0_ddp tests/test_cuda_kernels tests/test_cuda_comm tests/test_cuda_stages mpi/mpirun data/corpus.txt host_libs.txt; do
  [ -e "$f" ] || missing+="$f "
done
if [ $env_ok = 0 ]; then
  row FAIL bundle "$bundle_problem"
elif [ -n "$missing" ]; then
  row FAIL bundle "incomplete, missing: $missing(rebuild: make gpu-bundle)"
elif run_row bundle 60 bash ./bundle_check.sh; then
  if [ $rc = 0 ]; then row PASS bundle "$(tail -1 "$log/bundle.log" | sed -e 's/^bundle_check: OK: //' -e 's/; host libraries:.*//')"
  else row FAIL bundle "$(grep -v '^bundle_check: FAIL' "$log/bundle.log" | head -1 | cut -c1-150); see $log/bundle.log"; fi
fi
# Where the machine's cuBLAS and NCCL were found (bundle_env.sh: the toolkit, ldconfig, or a Python
# environment's site-packages/nvidia/*/lib).
if [ -n "${bundle_missing:-}" ]; then
  row FAIL host_libs "not found: ${bundle_missing}(looked in NZ_LIB_DIRS, LD_LIBRARY_PATH, the CUDA toolkit, ldconfig, site-packages/nvidia/*/lib: set NZ_LIB_DIRS)"
elif [ -n "${bundle_lib_dirs:-}" ]; then
  row PASS host_libs "$(printf '%s' "$bundle_lib_dirs" | sed -E 's/^(lib[a-zA-Z]*)[^=]*=/\1 in /' | tr '\n' ';' | sed 's/;$//; s/;/; /g')"
fi

gpu_name=""
if ! gpu_visible; then
  row SKIP gpu "no CUDA GPU visible (nvidia-smi -L lists none)"
  row SKIP compute_mode "no GPU"
else
  if [ "${NZ_GPU_CHECK_FAKE_GPU:-0}" = 1 ]; then gpu_name="GPU 0: simulated (NZ_GPU_CHECK_FAKE_GPU=1)" mode=Default
  else
    gpu_name=$(nvidia-smi -L 2>/dev/null | head -1)
    mode=$(nvidia-smi --query-gpu=compute_mode --format=csv,noheader 2>/dev/null | head -1)
  fi
  row PASS gpu "${gpu_name:-visible in /proc/driver/nvidia}; driver $(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -1)"
  case "$mode" in
    Default) row PASS compute_mode "Default: the 4-rank rows may share the GPU" ;;
    *) row FAIL compute_mode "${mode:-unknown}: expected Default, or 4 processes cannot share the GPU (nvidia-smi -c DEFAULT as root)" ;;
  esac
fi

if run_row mpirun 30 mpirun -np 2 tests/test_cuda_comm --gtest_list_tests; then
  if [ $rc = 0 ]; then row PASS mpirun "2 ranks started by $(command -v mpirun) as uid $(id -u) (MPICH hydra, HYDRA_LAUNCHER=${HYDRA_LAUNCHER:-})"
  else row FAIL mpirun "exit $rc: $(grep -v '^$' "$log/mpirun.log" | tail -1 | cut -c1-120)"; fi
fi

if ! gpu_visible; then
  skip_rest "no GPU" "${GPU_ROWS[@]}"
  ! grep -q -v -e '^PASS|' -e '^SKIP|' "$rows"
  exit
fi
if grep -q -e '^FAIL|bundle' -e '^FAIL|host_libs' -e '^FAIL|mpirun' -e '^TIMEOUT|mpirun' "$rows"; then
  skip_rest "preflight failed" "${GPU_ROWS[@]}"
  exit 1
fi

if run_row device 60 mpirun -np 1 bin/stage0_ddp --device cuda --preset tiny --seq 32 --steps 1 --eval-windows 1; then
  if [ $rc = 0 ] && grep -q '^cuda: ' "$log/device.log"; then row PASS device "$(grep -m1 '^cuda: ' "$log/device.log" | cut -c7-130)"
  else row FAIL device "stage0_ddp --device cuda did not run on the GPU: exit $rc: $(tail -1 "$log/device.log" | cut -c1-100)"; fi
fi
if ! grep -q '^PASS|device' "$rows"; then
  skip_rest "the device probe failed" "${GPU_ROWS[@]:1}"
  exit 1
fi

# ---- the GPU rows ----
gtest_row kernels 90 tests/test_cuda_kernels
gtest_row comm.np1.nccl 60 mpirun -np 1 tests/test_cuda_comm
gtest_row comm.np1.mpi 60 env NZ_COMM=mpi mpirun -np 1 tests/test_cuda_comm
gtest_row comm.np4.shared 60 mpirun -np 4 tests/test_cuda_comm
gtest_row stages 150 env NZ_BIN_DIR="$B/bin" tests/test_cuda_stages
grep -h '^NZTABLE' "$log/stages.log" 2>/dev/null | sed 's/^NZTABLE /   /'

# The speed rows before the memory rows: MFU is the number the 7 minutes are most wanted for.
SPEED="--preset gpt2 --precision bf16 --batch 8 --seq 1024 --steps 20 --eval-every 0 --eval-windows 8 --device cuda --kernels fast --quiet"
for run in "stage0_ddp gemm speed.stage0_ddp" "stage3 gemm speed.stage3" "stage0_ddp flash speed.stage0_ddp.flash"; do
  set -- $run
  s=$1 r=$3
  run_row $r 90 mpirun -np 1 bin/$s $SPEED --attention $2 || continue
  line=$(grep -m1 '^throughput:' "$log/$r.log")
  if [ $rc = 0 ] && [ -n "$line" ]; then
    row PASS $r "$(sed -E 's/^throughput: ([0-9]+ tokens\/s) \| (MFU [^ ]+).*/\1, \2/' <<<"$line"), $(grep -o '[0-9.]* ms/step' "$log/$r.log" | head -1), attention $2"
  else
    row FAIL $r "exit $rc: $(tail -1 "$log/$r.log" | cut -c1-100)"
  fi
done

TOUR="--preset gpt2 --batch 2 --seq 128 --steps 3 --lr 3e-4 --eval-every 0 --eval-windows 4 --device cuda --quiet"
jsons=()
for s in $(grep '^[a-z]' stages.txt); do
  [ -x bin/$s ] || { row SKIP memory.$s "not in the bundle"; continue; }
  run_row memory.$s 60 mpirun -np 4 bin/$s $TOUR --log-json "$log/memory.$s.json" || continue
  mem=$(grep -m1 '^GPU memory' "$log/memory.$s.log" | sed -E 's/.*ledger peak ([^,]*), now [^|]*\| in use ([^(]*)\(.*/ledger peak \1, cudaMemGetInfo in use \2/')
  if [ $rc = 0 ] && grep -q 'ledger matches the formulas' "$log/memory.$s.log"; then
    row PASS memory.$s "ledger matches its formulas; ${mem:-no GPU memory line}"
    jsons+=("$log/memory.$s.json")
  else
    row FAIL memory.$s "exit $rc or the ledger does not match its formulas; see $log/memory.$s.log"
  fi
done
py=$(bundle_pythons | head -1)
[ ${#jsons[@]} -gt 0 ] && [ -n "$py" ] && timeout 30 "$py" scripts/tour_table.py "${jsons[@]}" >"$log/memory_table.txt" 2>&1 &&
  sed 's/^/   /' "$log/memory_table.txt"

san=${NZ_COMPUTE_SANITIZER-$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null | head -1)}
for tool in memcheck racecheck; do
  if [ -z "$san" ]; then row SKIP sanitizer.$tool "compute-sanitizer not found"; continue; fi
  run_row sanitizer.$tool 90 "$san" --tool $tool --error-exitcode 9 tests/test_cuda_kernels || continue
  errs=$(grep -m1 -o 'ERROR SUMMARY: [0-9]* error' "$log/sanitizer.$tool.log")
  if [ $rc = 0 ]; then row PASS sanitizer.$tool "${errs:-no error summary}"
  else row FAIL sanitizer.$tool "exit $rc, ${errs:-no error summary}; see $log/sanitizer.$tool.log"; fi
done

! grep -q -v -e '^PASS|' -e '^SKIP|' "$rows"
