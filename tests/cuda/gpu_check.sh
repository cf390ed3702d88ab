#!/usr/bin/env bash
# gpu_check.sh — everything that needs a CUDA GPU, run from the GPU bundle (make gpu-bundle builds
# it on any machine with nvcc; the GPU machine needs only the driver, cuBLAS and NCCL, see
# host_libs.txt) in at most 7 minutes, and a table that is printed whatever happens:
#   OUT=dir bash build/gpu-bundle/gpu_check.sh
# Every row is printed as it completes (an NZRESULT line, tests/run_all.sh) and appended to
# rows.tsv; a trap prints the table on any exit (a failure, a timeout, Ctrl-C, a kill); every
# command runs under a timeout that is also capped by the global deadline. What stays behind, in
# $OUT when it is set (else in the log folder), at most 8 plain files of letters, digits, '.', '_'
# and '-' in one folder: table.txt (the table), rows.tsv (status, row, seconds, detail),
# reports.json (every row's --log-json report, by row), logs.tar.gz (every row's output).
# The rows, most wanted first (a row that needs the launcher runs after every row that does not):
#   bundle     complete, every library resolves (bundle_check.sh); host_libs: where cuBLAS and NCCL
#              were found; gpu (visible); compute_mode (Default: several processes may share the GPU)
#   device     a trainer runs one step on the GPU, started directly (one process, no launcher: an MPI
#              singleton, whose one-rank communicator makes no NCCL call)
#   speed.*    the configuration of speed_args.txt (gpt2, bf16, batch 8 x seq 1024, 1 process) with
#              NZ_PROFILE=1: tokens/s, MFU, the per-phase profile, device memory, and the first steps'
#              losses against golden_losses.tsv (the CPU's, see "The golden bound" below) for
#              stage0_ddp and stage3 (--attention gemm), and stage0_ddp --attention flash, whose
#              losses must also agree with gemm's
#   kernels, inference, quantize   test_cuda_{kernels,inference,quantize}: every CUDA kernel, the
#              decode path and the block quantizer against the CPU, one process each
#   comm.np1.* test_cuda_comm on device buffers, one process: local (device copies, no NCCL call),
#              NZ_COMM=nccl (NCCL on one rank: its only run on a one-GPU machine), NZ_COMM=mpi
#   mpirun     the bundle's launcher starts 2 ranks that train a step on the CPU; when that fails it
#              tries again with UCX's transports narrowed (self,sm,tcp, no /proc links) and with the
#              launcher on 127.0.0.1 over lo, and the later rows use what worked (the row says)
#   comm.np4.shared  4 ranks sharing the GPU (MPI path through pinned host buffers)
#   stages     test_cuda_stages: every stage vs stage0_ddp on the GPU within the stated bound, and
#              the ledger and comm counts vs the CPU run
#   ulysses    test_cuda_stages' Ulysses tests: --sp 2 on 2 ranks, --sp 4 on 4 (all-to-alls on the device) vs
#              stage0_ddp on the GPU (the step-1 loss within two summation orders, the rest within the
#              stage bound) and vs its CPU run (ledger and comm counts identical); ring refused
#   tensor     test_cuda_stages' tensor tests: --tensor 2 on 2 ranks vs stage0_ddp on the GPU (within the
#              tensor suite's derived bound) and vs its CPU run, and 3D with --sequence-parallel on 4 vs
#              its CPU run (ledger and comm counts identical); --attention flash refused on the GPU
#   memory.*   the gpt2 preset on 4 ranks sharing the GPU, 3 steps, per stage: the ledger matches its
#              formulas; the ledger's peak beside cudaMemGetInfo and the device memory report
#   sanitizer.* compute-sanitizer's racecheck, synccheck, initcheck and memcheck, one row each, right
#              after the kernels row, on a small set of bf16 kernel tests that finishes in seconds
#              (flash attention, layer norm, column sums, softmax cross-entropy: shared memory,
#              barriers, warp shuffles, tensor cores), if compute-sanitizer is installed
# Run from the repository (tests/cuda/gpu_check.sh, as `make test` does) without a visible GPU, it
# prints one SKIP line; with a GPU it first builds the bundle (a row like the others).
#   bash gpu_check.sh --golden-bound FILE   prints the golden file's gaps and bounds, and exits
# For testing the check itself (tests/cuda/gpu_report_check.sh), never for results:
#   NZ_GPU_CHECK_DEADLINE=s   the global deadline (default 420)
#   NZ_GPU_CHECK_ROW_LIMIT=s  a cap on every row's own timeout
#   NZ_GPU_CHECK_SIMULATE="hang:ROW fail:ROW ..."  that row sleeps forever, or fails at once
#   NZ_GPU_CHECK_FAKE_GPU=1   act as if a GPU were visible (the binaries must be fakes then)
#   NZ_COMPUTE_SANITIZER=path compute-sanitizer to use (empty: none)
set -u
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

# ---- The golden bound ----
# A speed row's first steps' losses must agree with the CPU's (golden_losses.tsv, written by
# dev/gpu_bundle/rehearsal.sh with the bundle's own stage0_ddp, --device cpu and speed_args.txt).
# Not bit for bit: bf16 on a GPU adds in other orders (cuBLAS's split sums, the kernels' reductions)
# and computes exp/log with fast-math instructions, so its bits differ from the CPU's. But both round
# at the same places to the same format, so each bf16 run lies within the effect of bf16's rounding
# of the exact trajectory L(s): |L_gpu(s) - L(s)| = |e_gpu(s)| and |L_cpu(s) - L(s)| = |e_cpu(s)|.
# The CPU measures that effect: an fp32 run's own error is about 2^16 times smaller (24 against 8
# bits of significand), so gap(s) = |L_bf16(s) - L_fp32(s)| is |e_cpu(s)| to a good approximation.
# Then |L_gpu - L_cpu| <= |e_gpu| + |e_cpu|. Another order of the same roundings gives an error of
# the same size, not the same error: we grant each of the two runs twice the CPU's gap at that step,
# so bound(s) = 4 x gap(s), step by step (the gap grows with the steps, 2.5e-4 at the first and
# 1.3e-2 at the third for speed_args.txt: one bound for all would let the first steps drift by the
# third's), and never less than GOLDEN_FLOOR = 0.002 (about
# 2^-9, bf16's half-ulp relative rounding of a logit of size 1: what one token's loss may move by
# rounding alone, before the mean over the batch's 8192 tokens shrinks it), so that a gap that is
# small by cancellation does not give a bound below what rounding can move. Flash against gemm: two GPU
# runs, the same argument, the same bound. A wrong kernel misses it by far: a loss that does not
# fall, or moves by tenths.
GOLDEN_FACTOR=4
GOLDEN_FLOOR=0.002
golden_bound() {  # golden_losses.tsv -> "steps N gaps g1,g2,.. bounds b1,b2,.." (nothing if unreadable)
  awk -v k=$GOLDEN_FACTOR -v floor=$GOLDEN_FLOOR '
    !/^#/ && $1 ~ /^[0-9]+$/ && NF >= 3 { n++; g = $2 - $3; if (g < 0) g = -g; b = k * g; if (b < floor) b = floor
                                         gaps = gaps sep sprintf("%.6f", g); bounds = bounds sep sprintf("%.6f", b); sep = "," }
    END { if (n == 0) exit 1; printf "steps %d gaps %s bounds %s\n", n, gaps, bounds }' "$1"
}
if [ "${1:-}" = --golden-bound ]; then
  golden_bound "${2:?usage: gpu_check.sh --golden-bound golden_losses.tsv}" || { echo "no losses in $2"; exit 1; }
  exit 0
fi

deadline=${NZ_GPU_CHECK_DEADLINE:-420}
row_cap=${NZ_GPU_CHECK_ROW_LIMIT:-100000}
simulate=" ${NZ_GPU_CHECK_SIMULATE:-} "
log=$(mktemp -d "${TMPDIR:-/tmp}/nanozero-gpu.XXXXXX")
save=${OUT:-$log}  # what comes back from the GPU machine: the files under $OUT
mkdir -p "$save" 2>/dev/null || save=$log
rows=$save/rows.tsv
: >"$rows"
t0=$SECONDS
child=""   # the row command running now (killed with the check)
watchdog=""
# Unbuffered: this script's lines are written as they come (bash's echo); the programs' output goes
# to their logs line by line (stdbuf), so a row killed at its timeout keeps every line it printed.
export PYTHONUNBUFFERED=1
LB=()
command -v stdbuf >/dev/null 2>&1 && LB=(stdbuf -oL -eL)

gpu_visible() {
  [ "${NZ_GPU_CHECK_FAKE_GPU:-0}" = 1 ] && return 0
  case "${CUDA_VISIBLE_DEVICES-unset}" in "" | -1 | none | NoDevFiles) return 1 ;; esac
  if command -v nvidia-smi >/dev/null 2>&1; then
    nvidia-smi -L 2>/dev/null | grep -q '^GPU '
    return
  fi
  ls /proc/driver/nvidia/gpus/* >/dev/null 2>&1
}

T=$'\t'
# ---- the rows: appended to rows.tsv and printed the moment they are known ----
row() {  # STATUS (PASS FAIL TIMEOUT SKIP) name detail
  local secs=$((SECONDS - t0))
  printf '%s\t%s\t%s\t%s\n' "$1" "$2" "$secs" "${3//[$'\t\n']/ }" >>"$rows"
  case "$1" in PASS) r=PASS ;; SKIP) r=SKIP ;; *) r=FAIL ;; esac
  echo "NZRESULT $r gpu.$2 ($1 at ${secs}s: $3)"
}
has_row() { grep -q "^$1$T$2$T" "$rows"; }  # STATUS NAME
failed_rows() { grep -v -e "^PASS$T" -e "^SKIP$T" "$rows"; }

# The files that come back: the table, the rows, the reports merged into one JSON object, the logs.
save_outputs() {
  local f first=1 name
  {
    printf '{'
    for f in "$log"/*.json; do
      [ -s "$f" ] && [ "$(tail -c 2 "$f" | tr -d '\n ')" = "}" ] || continue
      name=${f##*/}
      [ $first = 1 ] || printf ','
      first=0
      printf '"%s":' "${name%.json}"
      cat "$f"
    done
    printf '}\n'
  } >"$save/reports.json.part" 2>/dev/null && mv "$save/reports.json.part" "$save/reports.json"
  [ "$save" = "$log" ] && return
  (cd "$log" && timeout 30 tar -czf "$save/logs.tar.gz.part" --exclude='*.part' . 2>/dev/null) &&
    mv "$save/logs.tar.gz.part" "$save/logs.tar.gz"
}

printed=0
print_table() {
  [ $printed = 1 ] && return
  printed=1
  local n_pass n_fail n_skip
  n_pass=$(grep -c "^PASS$T" "$rows") n_skip=$(grep -c "^SKIP$T" "$rows")
  n_fail=$(failed_rows | grep -c .)
  {
    echo
    echo "== gpu_check: $((SECONDS - t0)) s of the ${deadline} s deadline; logs in $log; files in $save"
    [ -n "${gpu_name:-}" ] && echo "   $gpu_name"
    printf '   %-8s %-22s %5s  %s\n' status row "at s" detail
    while IFS=$'\t' read -r st name secs detail; do
      printf '   %-8s %-22s %5s  %s\n' "$st" "$name" "$secs" "$detail"
    done <"$rows"
    [ -s "$log/memory_table.txt" ] && sed 's/^/   /' "$log/memory_table.txt"
    echo "   $n_pass passed, $n_fail failed, $n_skip skipped"
  } | tee "$save/table.txt"
}

on_exit() {
  local rc=$?
  [ -n "$watchdog" ] && kill "$watchdog" 2>/dev/null
  save_outputs
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

# run_cmd NAME LIMIT COMMAND... : the command's output in $log/NAME.log, its exit code in $rc (124
# or 137: killed at its timeout). Returns 3 when the deadline leaves too little time to start it.
run_cmd() {
  local name=$1 limit=$2
  shift 2
  current=$name
  local left=$((deadline - (SECONDS - t0) - 5))
  [ "$left" -lt 5 ] && return 3
  [ "$limit" -gt "$row_cap" ] && limit=$row_cap
  [ "$limit" -gt "$left" ] && limit=$left
  case "$simulate" in
    *" hang:$name "*) set -- sleep 100000 ;;
    *" fail:$name "*) set -- bash -c 'echo "simulated failure (NZ_GPU_CHECK_SIMULATE)"; exit 1' ;;
  esac
  rc=0
  timeout -k 5 "$limit" "${LB[@]}" "$@" >"$log/$name.log" 2>&1 &
  child=$!
  wait "$child" || rc=$?
  child=""
  cmd_limit=$limit
  return 0
}
# run_row NAME LIMIT COMMAND... : run_cmd, and a SKIP row (return 3) when there is no time to start
# it, a TIMEOUT row (return 2) when it is killed; otherwise returns 0 and the caller writes the row.
run_row() {
  local name=$1
  if ! run_cmd "$@"; then
    row SKIP "$name" "not started: $((deadline - (SECONDS - t0))) s left of the ${deadline} s deadline"
    return 3
  fi
  if [ $rc = 124 ] || [ $rc = 137 ]; then
    row TIMEOUT "$name" "killed after ${cmd_limit} s; last line: $(tail -1 "$log/$name.log" | cut -c1-80)"
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
  else row FAIL "$name" "$what; exit $rc; see $name.log"; fi
}

skip_rest() {  # why, rows...
  local why=$1 r
  shift
  for r in "$@"; do row SKIP "$r" "$why"; done
}

# ---- reading the reports (no Python needed: the trainers write each report on one line) ----
json_object() {  # FILE KEY -> the flat object under "KEY", or nothing
  [ -s "$1" ] && grep -o "\"$2\":{[^{}]*}" "$1" | head -1 | sed "s/^\"$2\"://"
}
json_num() {  # OBJECT KEY -> its number
  grep -o "\"$2\":[-0-9.eE+]*" <<<"$1" | head -1 | cut -d: -f2
}
losses() {  # FILE N -> the first N steps' losses, one a line
  [ -s "$1" ] && sed -e 's/.*"steps_log":\[//' -e 's/\],"evals".*//' "$1" | grep -o '"loss":[-0-9.eE+]*' |
    cut -d: -f2 | head -"$2"
}
diffs() {  # LOSSES REFERENCE BOUNDS (files, a number a line) -> "d1,d2,.."; exit 1 if one is over its
  # bound, 2 if the counts differ
  paste "$1" "$2" "$3" | awk -F'\t' 'NF != 3 || $1 == "" || $2 == "" || $3 == "" { bad = 1 }
    { d = $1 - $2; if (d < 0) d = -d; if (d > $3) over = 1; out = out sep sprintf("%.6f", d); sep = "," }
    END { if (bad || NR == 0) exit 2; print out; exit over }'
}
profile_of() {  # LOG -> the profile line's breakdown, or "profile: none"
  local p
  p=$(grep -m1 '^profile: ' "$1" 2>/dev/null | sed -E 's/ \| steps .*//; s/^profile: step /profile: step /')
  echo "${p:-profile: none}"
}
gib() { awk -v b="$1" 'BEGIN { printf "%.2f GiB", b / 1073741824 }'; }
gpu_memory_of() {  # JSON -> "device memory: ... " or "device memory: none"
  local o base above
  o=$(json_object "$1" gpu_memory)
  base=$(json_num "$o" baseline_bytes) above=$(json_num "$o" above_baseline_bytes)
  if [ -n "$base" ] && [ -n "$above" ]; then
    echo "device memory above baseline $(gib "$above") (baseline $(gib "$base"), ledger peak $(gib "$(json_num "$o" ledger_peak_bytes)"))"
  else
    echo "device memory: none"
  fi
}
SANITIZER_TOOLS=(racecheck synccheck initcheck memcheck)
# the sanitizer rows' tests: small bf16 ones that exercise shared memory, barriers, shuffles and WMMA
SANITIZER_TESTS="CudaKernels/bf16.FlashAttention:CudaKernels/bf16.LayerNorm:CudaKernels/bf16.ColumnSumsOverManyRows:CudaKernels/bf16.SoftmaxXent"
GPU_ROWS=(device speed.stage0_ddp speed.stage3 speed.stage0_ddp.flash kernels
          "${SANITIZER_TOOLS[@]/#/sanitizer.}" inference quantize
          comm.np1.local comm.np1.nccl comm.np1.mpi comm.np4.shared stages ulysses tensor
          memory.stage0_ddp memory.stage1 memory.stage2 memory.stage3 memory.offload)
LAUNCHER_ROWS=(comm.np4.shared stages ulysses tensor memory.stage0_ddp memory.stage1 memory.stage2 memory.stage3 memory.offload)

# ---- where the bundle is: beside this script, or built from the repository ----
if [ -f "$here/bundle_env.sh" ]; then
  B=$here
else
  repo=$(cd "$here/../.." && pwd)  # tests/cuda/ of the repository
  if ! gpu_visible; then
    trap - EXIT
    kill "$watchdog" 2>/dev/null
    rm -rf "$log"
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

# ---- preflight: the bundle and the GPU ----
missing=""
source ./bundle_env.sh
if bundle_env "$B"; then env_ok=1; else env_ok=0; fi  # (unpacks the programs: then look for them)
for f in bin/stage0_ddp tests/test_cuda_kernels tests/test_cuda_comm tests/test_cuda_stages \
         tests/test_cuda_inference tests/test_cuda_quantize mpi/mpirun data/corpus.txt host_libs.txt speed_args.txt; do
  [ -e "$f" ] || missing+="$f "
done
if [ $env_ok = 0 ]; then
  row FAIL bundle "$bundle_problem"
elif [ -n "$missing" ]; then
  row FAIL bundle "incomplete, missing: $missing(rebuild: make gpu-bundle)"
elif run_row bundle 60 bash ./bundle_check.sh; then
  if [ $rc = 0 ]; then row PASS bundle "$(tail -1 "$log/bundle.log" | sed -e 's/^bundle_check: OK: //' -e 's/; host libraries:.*//')"
  else row FAIL bundle "$(grep -v '^bundle_check: FAIL' "$log/bundle.log" | head -1 | cut -c1-150); see bundle.log"; fi
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

# ---- the launcher's preflight (run where the launcher rows need it: without a GPU, now) ----
# 2 ranks of a CPU trainer: hydra starts them, MPICH's ch4 brings UCX up between them, a step's
# collectives run. When that fails it tries again with UCX narrowed to the transports every Linux
# has (self, shared memory without /proc/<pid>/fd links, tcp), then also with the launcher on
# 127.0.0.1 over lo (NZ_MPIRUN_LOCAL=1, mpi/mpirun; it does that by itself when the hostname does
# not resolve); what worked is exported for every later row, the mpiruns inside test_cuda_stages too.
launcher_preflight() {
  # First, every rank on this one machine over shared memory only (UCX_TLS=self,sm), unless the
  # environment already chose: UCX 1.13 otherwise sends MPI's messages between the ranks over TCP
  # (its shared-memory lanes for one-sided copies only), and MPI_Finalize over those lanes can spin
  # forever after a run has finished (openucx/ucx issue 8738; on an H200 machine test_cuda_comm's 4
  # ranks hung there at exit by default and with self,sm,tcp, and ended with self,sm or self,tcp).
  local narrow=""
  [ -n "${UCX_TLS:-}" ] || narrow="UCX_TLS=self,sm"
  local tries=(${narrow:+"$narrow"} "" "UCX_TLS=self,sm,tcp UCX_POSIX_USE_PROC_LINK=n"
               "UCX_TLS=self,sm,tcp UCX_POSIX_USE_PROC_LINK=n NZ_MPIRUN_LOCAL=1"
               "UCX_TLS=self,tcp UCX_NET_DEVICES=lo NZ_MPIRUN_LOCAL=1")
  local t first="" n=0 what
  for t in "${tries[@]}"; do
    n=$((n + 1))
    # shellcheck disable=SC2086
    if ! run_cmd mpirun.try$n 20 env $t mpirun -np 2 bin/stage0_ddp --device cpu --preset tiny --seq 32 --steps 1 \
         --eval-windows 1 --quiet; then
      row SKIP mpirun "not started: $((deadline - (SECONDS - t0))) s left of the ${deadline} s deadline"
      return
    fi
    if [ $rc = 0 ] && grep -q 'ledger matches' "$log/mpirun.try$n.log"; then
      # shellcheck disable=SC2163
      for kv in $t; do export "$kv"; done
      row PASS mpirun "2 ranks started by $(command -v mpirun) as uid $(id -u) (MPICH hydra, HYDRA_LAUNCHER=${HYDRA_LAUNCHER:-})${t:+ with $t}${first:+ after try 1 failed: $first}"
      return
    fi
    case $rc in 124 | 137) what="hung ${cmd_limit} s" ;; *) what="exit $rc" ;; esac
    [ -z "$first" ] && first="$what: $(grep -v '^$' "$log/mpirun.try$n.log" | tail -1 | cut -c1-100)"
  done
  row FAIL mpirun "${#tries[@]} tries failed; the first: $first; see mpirun.try*.log"
}

if ! gpu_visible; then
  launcher_preflight
  skip_rest "no GPU" "${GPU_ROWS[@]}"
  ! failed_rows | grep -q .
  exit
fi
if failed_rows | grep -q -e "${T}bundle$T" -e "${T}host_libs$T"; then
  skip_rest "preflight failed" mpirun "${GPU_ROWS[@]}"
  exit 1
fi

# ---- one process on the GPU: no launcher, no NCCL ----
# MPI_Init brings UCX up even in one process: when the probe fails before the GPU was reached, it
# tries again with UCX narrowed (as the launcher's preflight does), and the later rows keep that.
for t in "" "UCX_TLS=self,sm,tcp UCX_POSIX_USE_PROC_LINK=n"; do
  # shellcheck disable=SC2086
  run_row device 60 env $t bin/stage0_ddp --device cuda --preset tiny --seq 32 --steps 1 --eval-windows 1 || break
  if [ $rc = 0 ] && grep -q '^cuda: ' "$log/device.log"; then
    for kv in $t; do export "$kv"; done
    row PASS device "$(grep -m1 '^cuda: ' "$log/device.log" | cut -c7-130)${t:+ (with $t)}"
    break
  fi
  grep -q '^cuda: ' "$log/device.log" && t=last  # it reached the GPU: not UCX's doing
  if [ -n "$t" ]; then
    row FAIL device "stage0_ddp --device cuda did not run on the GPU: exit $rc: $(tail -1 "$log/device.log" | cut -c1-100)"
    break
  fi
  cp "$log/device.log" "$log/device.try1.log"
done
if ! has_row PASS device; then
  skip_rest "the device probe failed" "${GPU_ROWS[@]:1}" mpirun
  exit 1
fi

# The speed rows first: MFU is the number the 7 minutes are most wanted for, and it counts only if
# the losses say the kernels computed the right thing.
read -r -a SPEED < <(grep -v '^#' speed_args.txt | tr '\n' ' ')
golden=""
[ -s golden_losses.tsv ] && golden=$(golden_bound golden_losses.tsv)
gsteps=$(awk '{print $2}' <<<"$golden") bounds=$(awk '{print $6}' <<<"$golden")
[ -n "$golden" ] && awk '!/^#/ && $1 ~ /^[0-9]+$/ {print $2}' golden_losses.tsv >"$log/golden.bf16" &&
  tr ',' '\n' <<<"$bounds" >"$log/golden.bounds"
for run in "stage0_ddp gemm speed.stage0_ddp" "stage3 gemm speed.stage3" "stage0_ddp flash speed.stage0_ddp.flash"; do
  set -- $run
  s=$1 r=$3
  run_row $r 90 env NZ_PROFILE=1 bin/$s "${SPEED[@]}" --device cuda --attention $2 --log-json "$log/$r.json" || continue
  line=$(grep -m1 '^throughput:' "$log/$r.log")
  if [ $rc != 0 ] || [ -z "$line" ]; then
    row FAIL $r "exit $rc: $(tail -1 "$log/$r.log" | cut -c1-100)"
    continue
  fi
  speed="$(sed -E 's/^throughput: ([0-9]+ tokens\/s) \| (MFU [^ ]+).*/\1, \2/' <<<"$line"), $(grep -o '[0-9.]* ms/step' "$log/$r.log" | head -1), attention $2"
  verdict=PASS
  if [ -z "$golden" ]; then
    verdict=FAIL check="no golden losses in the bundle (make gpu-rehearsal writes golden_losses.tsv)"
  else
    losses "$log/$r.json" "$gsteps" >"$log/$r.losses"
    d=$(diffs "$log/$r.losses" "$log/golden.bf16" "$log/golden.bounds")
    case $? in
      0) check="losses of steps 1-$gsteps vs the CPU's: |d| $d within $bounds" ;;
      1) verdict=FAIL check="losses of steps 1-$gsteps vs the CPU's: |d| $d within $bounds: OUTSIDE" ;;
      *) verdict=FAIL check="no losses for steps 1-$gsteps in $r.json" ;;
    esac
    if [ $r = speed.stage0_ddp.flash ] && [ -s "$log/speed.stage0_ddp.losses" ]; then
      d=$(diffs "$log/$r.losses" "$log/speed.stage0_ddp.losses" "$log/golden.bounds")
      case $? in
        0) check+="; vs gemm's: |d| $d" ;;
        1) verdict=FAIL check+="; vs gemm's: |d| $d: OUTSIDE" ;;
        *) verdict=FAIL check+="; vs gemm's: no losses to compare" ;;
      esac
    fi
  fi
  row $verdict $r "$speed; $check; $(profile_of "$log/$r.log"); $(gpu_memory_of "$log/$r.json")"
done
save_outputs  # (what a kill of the whole check from outside would otherwise take with it)

# ---- the kernels and the collectives, one process each ----
gtest_row kernels 90 tests/test_cuda_kernels
# compute-sanitizer, one tool a row, on SANITIZER_TESTS: a whole kernel suite under racecheck would
# not finish in the time a row has
san=${NZ_COMPUTE_SANITIZER-$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null | head -1)}
for tool in "${SANITIZER_TOOLS[@]}"; do
  if [ -z "$san" ]; then row SKIP sanitizer.$tool "compute-sanitizer not found"; continue; fi
  run_row sanitizer.$tool 45 "$san" --tool $tool --error-exitcode 9 tests/test_cuda_kernels --gtest_filter="$SANITIZER_TESTS" || continue
  # racecheck's own summary counts hazards (errors and warnings); every tool's ends with its errors
  errs=$(grep -o -E 'RACECHECK SUMMARY: [0-9]+ hazards? displayed \([0-9]+ errors?, [0-9]+ warnings?\)|ERROR SUMMARY: [0-9]+ errors?' \
    "$log/sanitizer.$tool.log" | head -2 | paste -sd';' | sed 's/;/; /')
  san_passed=$(grep -c '^NZRESULT PASS' "$log/sanitizer.$tool.log")
  if [ $rc = 0 ] && [ "$san_passed" -gt 0 ]; then row PASS sanitizer.$tool "${errs:-no error summary}; $san_passed tests"
  else row FAIL sanitizer.$tool "exit $rc, ${errs:-no error summary}, $san_passed tests passed; see sanitizer.$tool.log"; fi
done
gtest_row inference 60 tests/test_cuda_inference
gtest_row quantize 60 tests/test_cuda_quantize
gtest_row comm.np1.local 60 tests/test_cuda_comm
gtest_row comm.np1.nccl 60 env NZ_COMM=nccl tests/test_cuda_comm
gtest_row comm.np1.mpi 60 env NZ_COMM=mpi tests/test_cuda_comm

# ---- the rows that need the launcher ----
launcher_preflight
if has_row SKIP mpirun; then
  skip_rest "not started: the ${deadline} s deadline" "${LAUNCHER_ROWS[@]}"
elif ! has_row PASS mpirun; then
  skip_rest "the launcher's preflight failed" "${LAUNCHER_ROWS[@]}"
else
  gtest_row comm.np4.shared 60 mpirun -np 4 tests/test_cuda_comm
  gtest_row stages 150 env NZ_BIN_DIR="$B/bin" tests/test_cuda_stages --gtest_filter='-CudaStages.Ulysses*:CudaStages.Tensor*'
  grep -h '^NZTABLE' "$log/stages.log" 2>/dev/null | sed 's/^NZTABLE /   /'
  gtest_row ulysses 90 env NZ_BIN_DIR="$B/bin" tests/test_cuda_stages --gtest_filter='CudaStages.Ulysses*'
  grep -h '^NZTABLE' "$log/ulysses.log" 2>/dev/null | sed 's/^NZTABLE /   /'
  gtest_row tensor 90 env NZ_BIN_DIR="$B/bin" tests/test_cuda_stages --gtest_filter='CudaStages.Tensor*'
  grep -h '^NZTABLE' "$log/tensor.log" 2>/dev/null | sed 's/^NZTABLE /   /'

  TOUR="--preset gpt2 --batch 2 --seq 128 --steps 3 --lr 3e-4 --eval-every 0 --eval-windows 4 --device cuda --quiet"
  jsons=()
  for s in $(awk '/^[a-z]/ {print $1}' stages.txt); do
    [ -x bin/$s ] || { row SKIP memory.$s "not in the bundle"; continue; }
    run_row memory.$s 60 mpirun -np 4 bin/$s $TOUR --log-json "$log/memory.$s.json" || continue
    mem=$(grep -m1 '^GPU memory' "$log/memory.$s.log" | sed -E 's/.*ledger peak ([^,]*), now [^|]*\| in use ([^(]*[^( ]) *\(.*/ledger peak \1, cudaMemGetInfo in use \2/')
    if [ $rc = 0 ] && grep -q 'ledger matches the formulas' "$log/memory.$s.log"; then
      row PASS memory.$s "ledger matches its formulas; ${mem:-no GPU memory line}; $(gpu_memory_of "$log/memory.$s.json")"
      jsons+=("$log/memory.$s.json")
    else
      row FAIL memory.$s "exit $rc or the ledger does not match its formulas; see memory.$s.log"
    fi
  done
  py=$(bundle_pythons | head -1)
  [ ${#jsons[@]} -gt 0 ] && [ -n "$py" ] && timeout 30 "$py" scripts/tour_table.py "${jsons[@]}" >"$log/memory_table.txt" 2>&1 ||
    rm -f "$log/memory_table.txt"
fi

! failed_rows | grep -q .
