#!/usr/bin/env bash
# gpu_report_check.sh — tests of tests/cuda/gpu_check.sh itself, the check that runs on a lent GPU for a
# few minutes and must report whatever happens there. Building the real bundle takes minutes (make
# gpu-bundle), so this runs the real gpu_check.sh, bundle_env.sh and bundle_check.sh in a fake
# bundle (a temporary folder) whose trainers, tests and mpirun are small scripts printing what the
# real ones print, and checks, in about 40 s:
#   no_gpu       without a GPU: the preflight rows, every GPU row SKIP, the table, exit 0, and what
#                $OUT gets (table.txt = the table printed, rows.tsv, reports.json, logs.tar.gz; at
#                most 8 plain files of 16 MiB, names of letters, digits, '.', '_', '-');
#   no_gpu_fail  without a GPU, a launcher that fails every try (or hangs): FAIL, the table, exit 1;
#   all_pass     with NZ_GPU_CHECK_FAKE_GPU=1: every row PASS; the device probe and speed rows first,
#                then the other one-process rows, then the launcher's; none of those one-process rows
#                started by mpirun; tokens/s, MFU, the golden check, the profile line and the device
#                memory parsed into the table; the reports merged in reports.json, the logs tarred;
#   sanitizer    the 4 compute-sanitizer rows: a reported error FAILs its row; none installed: SKIP;
#   golden       speed rows FAIL outside the golden bound (step by step: a step with a larger gap
#                does not loosen the others), flash FAIL against gemm, FAIL without
#                golden losses; "profile: none" and "device memory: none" when a run has neither;
#   launcher     a launcher that works only with UCX narrowed: its row PASS with the fallback, which
#                the later launcher rows keep; one that never works: only the launcher rows SKIP;
#   row_timeout  a row that hangs is killed at its timeout (quoting the last line a block-buffered
#                program printed: the check runs them line-buffered), a row that fails is a FAIL row,
#                the rows after them still run, the table is printed, exit non-zero;
#   deadline     a hang that eats the global deadline: that row TIMEOUT, the rest SKIP, on time;
#   killed       SIGTERM in the middle of a hung row: the table is printed, the hung command is gone;
#   incomplete   a binary missing from the bundle: a FAIL row, the GPU rows SKIP, the table;
#   build_fails  run from a repository where make gpu-bundle fails: a FAIL row named build, the table;
#   host_libs    cuBLAS and NCCL found where the check is told to look (fake, empty files: the same
#                on a machine without the CUDA toolkit), and a FAIL naming each where they are not;
#   nccl_in_python  bundle_env.sh finds a library in a Python environment's site-packages/nvidia/*/lib.
# Prints NZRESULT lines (tests/run_all.sh); the inner checks' own NZRESULT lines stay in their logs.
set -u
cd "$(dirname "$0")/../.." || exit 1
tmp=$(mktemp -d /tmp/nanozero-gpureport.XXXXXX)
trap '[ -z "${NZ_KEEP_TEST_FILES:-}" ] && rm -rf "$tmp"' EXIT

# The host libraries (host_libs.txt: cuBLAS, NCCL) as empty files in a folder of their own, and the
# check told to look there only: what it finds must not depend on whether this machine has the CUDA
# toolkit (most learners' machines do not). The host_libs case below shows both outcomes.
mkdir -p "$tmp/hostlibs" "$tmp/nolibs"
for f in $(grep -v '^#' dev/gpu_bundle/host_libs.txt | awk '$1 ~ /^lib(cublas|nccl)/ {print $1}'); do : >"$tmp/hostlibs/$f"; done
export NZ_LIB_DIRS=$tmp/hostlibs NZ_LIB_DIRS_ONLY=1

make_bundle() {  # DIR: a fake bundle around the real scripts
  local b=$1 f
  mkdir -p "$b"/{bin,tests,mpi,lib,data,scripts}
  cp stages.txt tests/cuda/gpu_check.sh tests/cuda/speed_args.txt dev/gpu_bundle/bundle_env.sh dev/gpu_bundle/bundle_check.sh \
    dev/gpu_bundle/host_libs.txt "$b/"
  cp "$(type -P true)" "$b/bin/elf_probe"  # one real ELF file for bundle_check.sh (needs libc only)
  : >"$b/data/corpus.txt"
  # golden losses: bf16 and fp32 gaps of 1e-4 (bounds: the floor, 2e-3), and 1e-2 at step 3 (4e-2)
  printf '# fake\nstep\tbf16\tfp32\n1\t5.5001\t5.5000\n2\t5.4001\t5.4000\n3\t5.3001\t5.2901\n' >"$b/golden_losses.tsv"
  # A trainer: what the real ones print; with --log-json a one-line report whose losses are the
  # golden ones shifted by FAKE_SHIFT_<attention> (gemm, flash); with NZ_PROFILE=1 the profile line.
  for f in $(awk '/^[a-z]/ {print $1}' stages.txt); do
    cat >"$b/bin/$f" <<'EOF'
#!/usr/bin/env bash
json="" att=gemm
while [ $# -gt 0 ]; do
  case $1 in --log-json) json=$2; shift ;; --attention) att=$2; shift ;; esac
  shift
done
echo "cuda: fake GPU (sm_90)"
echo "done: 20 steps in 1.0 s | final train loss 1.0 | validation loss 1.0 (unigram baseline 3.0) | 123.4 ms/step"
echo "throughput: 1000 tokens/s | MFU 40.0% (6 x params)"
echo "ledger matches the formulas"
echo "GPU memory (rank 0's GPU, 4 ranks): ledger peak 1.00 GB, now 500.00 MB | in use 2.00 GB (cudaMemGetInfo total - free) | not in the ledger 1.50 GB (...)"
[ "${NZ_PROFILE:-}" = 1 ] && echo "profile: step 123.4 ms = forward 30.1 (attention 8.2) + backward 60.3 (attention 15.0) + optimizer 5.0 + collectives 2.0 + other 26.0 | steps 3-20 of 20, rank 0, CUDA events"
if [ -n "$json" ] && [ -z "${FAKE_NO_REPORT:-}" ]; then
  v=FAKE_SHIFT_$att
  awk -v d="${!v:-0}" 'BEGIN { printf "{\"stage\":\"x\",\"steps_log\":[{\"step\":1,\"loss\":%.6f,\"lr\":1},{\"step\":2,\"loss\":%.6f},{\"step\":3,\"loss\":%.6f},{\"step\":4,\"loss\":9}],\"evals\":[],\"gpu_memory\":{\"baseline_bytes\":1073741824,\"in_use_bytes\":3221225472,\"above_baseline_bytes\":2147483648,\"ledger_peak_bytes\":1073741824,\"ledger_now_bytes\":5,\"ranks_on_gpu\":1}}\n", 5.5 + d, 5.4 + d, 5.3 + d }' >"$json"
fi
EOF
  done
  for f in test_cuda_kernels test_cuda_comm test_cuda_stages test_cuda_inference test_cuda_quantize; do
    printf '#!/usr/bin/env bash\necho "NZRESULT PASS Fake.One"\necho "NZRESULT PASS Fake.Two"\n' >"$b/tests/$f"
  done
  # mpirun: logs its command line, fails as FAKE_MPIRUN says (always; unless UCX_TLS names tcp), and
  # runs the command once
  cat >"$b/mpi/mpirun" <<'EOF'
#!/usr/bin/env bash
echo "$*" >>"${0%/*}/calls"
case ${FAKE_MPIRUN:-} in
  always) echo "fake launcher failure"; exit 1 ;;
  ucx) case ${UCX_TLS:-} in *tcp*) ;; *) echo "fake UCX failure"; exit 1 ;; esac ;;
esac
[ "$1" = -np ] && shift 2
exec "$@"
EOF
  # compute-sanitizer: logs its tool and command, runs the command, and reports one error for the
  # tool FAKE_SAN_FAIL names
  cat >"$b/compute-sanitizer" <<'EOF'
#!/usr/bin/env bash
tool="" code=1
while [ "${1#--}" != "$1" ]; do
  case $1 in --tool) tool=$2; shift 2 ;; --error-exitcode) code=$2; shift 2 ;; *) shift ;; esac
done
echo "$tool $*" >>"${0%/*}/sanitizer.calls"
"$@"
rc=$?
[ "$tool" = "${FAKE_SAN_FAIL:-}" ] && { echo "========= ERROR SUMMARY: 1 error"; exit "$code"; }
echo "========= ERROR SUMMARY: 0 errors"
exit $rc
EOF
  chmod +x "$b"/bin/* "$b"/tests/* "$b"/mpi/mpirun "$b/compute-sanitizer"
}

# run_case NAME ENV... : runs the fake bundle's gpu_check.sh with OUT=$tmp/NAME.files, output in
# $tmp/NAME.out, exit in $rc
run_case() {
  local name=$1
  shift
  rc=0
  local b=${bundle:-$tmp/b}
  : >"$b/mpi/calls"
  env -u UCX_TLS TMPDIR="$tmp" OUT="$tmp/$name.files" NZ_COMPUTE_SANITIZER= NZ_BUNDLE_CACHE="$tmp/cache" "$@" \
    timeout -k 5 60 bash "$b/gpu_check.sh" >"$tmp/$name.out" 2>&1 || rc=$?
}
table_row() { sed -n '/^== gpu_check/,$p' "$tmp/$1.out" | grep -E "^   $2 +$3 "; }
row_line() { grep -n -E "^   [A-Z]+ +$2 " <(sed -n '/^== gpu_check/,$p' "$tmp/$1.out") | cut -d: -f1; }  # position in the table
result() {  # name, condition-ok (0/1), why
  if [ "$2" = 0 ]; then echo "NZRESULT PASS gpu_report.$1"
  else echo "NZRESULT FAIL gpu_report.$1 ($3; output: $tmp/$1.out)"; trap - EXIT; fi
}
has_table() { grep -q '^== gpu_check: ' "$tmp/$1.out" && grep -qE '^   [0-9]+ passed, [0-9]+ failed, [0-9]+ skipped$' "$tmp/$1.out"; }
# What comes back from the GPU machine: at most 8 plain files, 16 MiB each, in $OUT itself, named
# with letters, digits, '.', '_' and '-'; the table, the rows, the reports and the logs among them.
out_ok() {
  local d=$tmp/$1.files f n=0
  for f in table.txt rows.tsv reports.json; do [ -s "$d/$f" ] || return 1; done
  for f in "$d"/* "$d"/.[!.]*; do
    [ -e "$f" ] || continue
    n=$((n + 1))
    [ -f "$f" ] && [ "$(stat -c %s "$f")" -le $((16 << 20)) ] && [[ ${f##*/} =~ ^[A-Za-z0-9._-]+$ ]] || return 1
  done
  [ $n -le 8 ] && cmp -s <(sed -n '/^== gpu_check/,$p' "$tmp/$1.out") <(sed -n '/^== gpu_check/,$p' "$d/table.txt")
}

make_bundle "$tmp/b"
# deadline (mostly waiting for its deadline: in the background, in a bundle of its own, checked below)
make_bundle "$tmp/bd"
deadline_start=$SECONDS
(bundle=$tmp/bd run_case deadline NZ_GPU_CHECK_FAKE_GPU=1 NZ_GPU_CHECK_DEADLINE=20 NZ_GPU_CHECK_SIMULATE="hang:kernels"
 echo "$rc $((SECONDS - deadline_start))" >"$tmp/deadline.rc") &
deadline_job=$!

run_case no_gpu CUDA_VISIBLE_DEVICES=none
ok=1
if has_table no_gpu && [ $rc = 0 ] && table_row no_gpu PASS bundle >/dev/null && table_row no_gpu PASS mpirun >/dev/null &&
   [ "$(sed -n '/^== gpu_check/,$p' "$tmp/no_gpu.out" | grep -cE '^   SKIP ')" = 25 ] && out_ok no_gpu; then ok=0; fi
result no_gpu $ok "expected the table with bundle and mpirun PASS, 25 SKIP rows, exit 0, and the table in \$OUT (exit $rc)"

run_case no_gpu_fail CUDA_VISIBLE_DEVICES=none NZ_GPU_CHECK_SIMULATE="fail:mpirun.try1 fail:mpirun.try2 fail:mpirun.try3 fail:mpirun.try4 hang:mpirun.try5" NZ_GPU_CHECK_ROW_LIMIT=2
ok=1
if has_table no_gpu_fail && [ $rc != 0 ] && table_row no_gpu_fail FAIL mpirun | grep -q 'the first: exit 1: simulated failure'; then ok=0; fi
result no_gpu_fail $ok "expected the mpirun row FAIL, the table, and a non-zero exit without a GPU too (exit $rc)"

# all_pass: every row, in the order most wanted first, the single-process rows started without the
# launcher, the speed rows with the golden check, the profile and the device memory, $OUT complete
run_case all_pass NZ_GPU_CHECK_FAKE_GPU=1 NZ_COMPUTE_SANITIZER="$tmp/b/compute-sanitizer"
ok=1
if has_table all_pass && [ $rc = 0 ] && grep -q '^   [0-9]* passed, 0 failed, 0 skipped' "$tmp/all_pass.out" &&
   table_row all_pass PASS sanitizer.racecheck | grep -q 'ERROR SUMMARY: 0 errors; 2 tests' &&
   [ "$(row_line all_pass kernels)" -lt "$(row_line all_pass sanitizer.racecheck)" ] &&
   [ "$(row_line all_pass sanitizer.memcheck)" -lt "$(row_line all_pass inference)" ] &&
   [ "$(cut -d' ' -f1 "$tmp/b/sanitizer.calls" | paste -sd' ')" = "racecheck synccheck initcheck memcheck" ] &&
   [ "$(grep -c -- '--gtest_filter=CudaKernels/bf16.FlashAttention:' "$tmp/b/sanitizer.calls")" = 4 ] &&
   table_row all_pass PASS speed.stage0_ddp.flash | grep -q '1000 tokens/s, MFU 40.0%, 123.4 ms/step, attention flash' &&
   table_row all_pass PASS speed.stage0_ddp.flash | grep -q "|d| 0.000100,0.000100,0.000100 within 0.002000,0.002000,0.040000; vs gemm's: |d| 0.000000,0.000000,0.000000;" &&
   table_row all_pass PASS speed.stage3 | grep -q 'profile: step 123.4 ms = forward 30.1 (attention 8.2) + backward 60.3 (attention 15.0) + optimizer 5.0 + collectives 2.0 + other 26.0;' &&
   table_row all_pass PASS speed.stage3 | grep -q 'device memory above baseline 2.00 GiB (baseline 1.00 GiB, ledger peak 1.00 GiB)' &&
   table_row all_pass PASS memory.offload | grep -q 'ledger peak 1.00 GB, cudaMemGetInfo in use 2.00 GB; device memory above' &&
   table_row all_pass PASS kernels | grep -q '2 passed, 0 failed' && table_row all_pass PASS inference >/dev/null &&
   table_row all_pass PASS quantize >/dev/null &&
   [ "$(row_line all_pass device)" -lt "$(row_line all_pass speed.stage0_ddp)" ] &&
   [ "$(row_line all_pass speed.stage0_ddp.flash)" -lt "$(row_line all_pass kernels)" ] &&
   [ "$(row_line all_pass comm.np1.mpi)" -lt "$(row_line all_pass mpirun)" ] &&
   ! grep -q -e 'test_cuda_kernels' -e 'test_cuda_inference' -e '--batch 8' -e '--device cuda --preset tiny' "$tmp/b/mpi/calls" &&
   grep -q 'test_cuda_comm' "$tmp/b/mpi/calls" && out_ok all_pass &&
   tar -tzf "$tmp/all_pass.files/logs.tar.gz" | grep -q 'speed.stage0_ddp.flash.log' &&
   python3 -c 'import json, sys; d = json.load(open(sys.argv[1])); assert "gpu_memory" in d["speed.stage3"] and "memory.stage1" in d' \
     "$tmp/all_pass.files/reports.json"; then ok=0; fi
result all_pass $ok "expected every row PASS (the 4 sanitizer rows after kernels, on the filtered tests), in order, speed/profile/memory parsed, no launcher for one process, \$OUT complete (exit $rc)"

# sanitizer: a tool that reports an error fails its row (the others pass); without compute-sanitizer
# the 4 rows SKIP saying so
run_case sanitizer_error NZ_GPU_CHECK_FAKE_GPU=1 NZ_COMPUTE_SANITIZER="$tmp/b/compute-sanitizer" FAKE_SAN_FAIL=synccheck
ok=1
if [ $rc != 0 ] && table_row sanitizer_error FAIL sanitizer.synccheck | grep -q 'exit 9, ERROR SUMMARY: 1 error' &&
   table_row sanitizer_error PASS sanitizer.initcheck >/dev/null; then ok=0; fi
run_case sanitizer_none NZ_GPU_CHECK_FAKE_GPU=1
[ "$(table_row sanitizer_none SKIP 'sanitizer\.[a-z]+' | grep -c 'compute-sanitizer not found')" = 4 ] || ok=1
result sanitizer $ok "expected the synccheck row FAIL on a reported error, the others PASS, and 4 SKIP rows without compute-sanitizer"

# golden: losses off the CPU's by more than the bound fail their row; flash against gemm too; no
# report at all: the profile and memory say none
run_case golden NZ_GPU_CHECK_FAKE_GPU=1 FAKE_SHIFT_gemm=-0.0014 FAKE_SHIFT_flash=0.0014
run_case golden_miss NZ_GPU_CHECK_FAKE_GPU=1 FAKE_SHIFT_gemm=0.01
ok=1
if [ $rc != 0 ] && table_row golden PASS speed.stage0_ddp >/dev/null &&
   table_row golden FAIL speed.stage0_ddp.flash | grep -q "vs gemm's: |d| 0.002800,0.002800,0.002800: OUTSIDE" &&
   table_row golden_miss FAIL speed.stage3 | grep -q '|d| 0.009900,0.009900,0.009900 within 0.002000,0.002000,0.040000: OUTSIDE'; then ok=0; fi
rm "$tmp/b/golden_losses.tsv"
run_case no_golden NZ_GPU_CHECK_FAKE_GPU=1 FAKE_NO_REPORT=1
if ! table_row no_golden FAIL speed.stage0_ddp | grep -q 'no golden losses in the bundle' ||
   ! table_row no_golden PASS memory.stage2 | grep -q 'device memory: none'; then ok=1; fi
make_bundle "$tmp/b"
# (the check sets NZ_PROFILE itself: a trainer that never prints the line gives "profile: none")
sed -i 's/^\[ "${NZ_PROFILE:-}" = 1 \]/false/' "$tmp/b/bin/stage3"
run_case no_profile NZ_GPU_CHECK_FAKE_GPU=1
make_bundle "$tmp/b"
table_row no_profile PASS speed.stage3 | grep -q 'profile: none; device memory above' || ok=1
table_row no_profile PASS speed.stage0_ddp | grep -q 'profile: step 123.4 ms' || ok=1
result golden $ok "expected speed rows FAIL outside the golden bound (flash against gemm too), FAIL without golden losses, 'none' for a missing profile or memory report"

# launcher: the first try is shared memory only (UCX_TLS=self,sm); a launcher that works only with
# TCP among UCX's transports passes on a later try, which the later rows keep; one that never works
# fails its row and skips only the rows that need it
run_case launcher_ucx NZ_GPU_CHECK_FAKE_GPU=1 FAKE_MPIRUN=ucx
run_case launcher_dead NZ_GPU_CHECK_FAKE_GPU=1 FAKE_MPIRUN=always
ok=1
if table_row launcher_ucx PASS mpirun | grep -q 'with UCX_TLS=self,sm,tcp UCX_POSIX_USE_PROC_LINK=n after try 1 failed: exit 1: fake UCX failure' &&
   table_row launcher_ucx PASS comm.np4.shared >/dev/null && table_row launcher_ucx PASS memory.stage3 >/dev/null &&
   [ $rc != 0 ] && table_row launcher_dead FAIL mpirun | grep -q '5 tries failed' &&
   table_row no_profile PASS mpirun | grep -q 'with UCX_TLS=self,sm$' &&
   table_row launcher_dead SKIP stages | grep -q "launcher's preflight failed" &&
   table_row launcher_dead PASS speed.stage0_ddp.flash >/dev/null && table_row launcher_dead PASS comm.np1.mpi >/dev/null; then ok=0; fi
result launcher $ok "expected the UCX fallback to pass and be kept, and a dead launcher to skip only the launcher rows"

# row_timeout: also a program whose stdout is a file (block-buffered by the C library unless the check
# makes it line-buffered) prints a line and hangs: the TIMEOUT row must quote that line
printf '#include <stdio.h>\n#include <unistd.h>\nint main(void) { printf("NZRESULT PASS Fake.Buffered\\n"); sleep(100); return 0; }\n' >"$tmp/hang.c"
cc -o "$tmp/b/tests/test_cuda_inference" "$tmp/hang.c"
start=$SECONDS
run_case row_timeout NZ_GPU_CHECK_FAKE_GPU=1 NZ_GPU_CHECK_ROW_LIMIT=3 NZ_GPU_CHECK_SIMULATE="hang:kernels fail:comm.np4.shared"
make_bundle "$tmp/b"
ok=1
if has_table row_timeout && [ $rc != 0 ] && table_row row_timeout TIMEOUT kernels >/dev/null &&
   table_row row_timeout TIMEOUT inference | grep -q 'last line: NZRESULT PASS Fake.Buffered' &&
   table_row row_timeout FAIL comm.np4.shared >/dev/null && table_row row_timeout PASS stages >/dev/null &&
   table_row row_timeout PASS memory.stage0_ddp >/dev/null && [ $((SECONDS - start)) -lt 20 ]; then ok=0; fi
result row_timeout $ok "expected kernels TIMEOUT, inference TIMEOUT quoting its line (line-buffered), comm.np4.shared FAIL, later rows PASS, a table, exit non-zero, in < 20 s (exit $rc, $((SECONDS - start)) s)"

wait $deadline_job
read -r rc secs <"$tmp/deadline.rc"
ok=1
if has_table deadline && [ $rc != 0 ] && table_row deadline PASS speed.stage0_ddp.flash >/dev/null &&
   table_row deadline TIMEOUT kernels >/dev/null &&
   table_row deadline SKIP memory.stage3 | grep -q 'deadline' && [ "$secs" -le 22 ] && out_ok deadline; then ok=0; fi
result deadline $ok "expected the speed rows PASS, kernels TIMEOUT and the rows after it SKIP within the 20 s deadline (exit $rc, $secs s)"

# killed: a SIGTERM (what the GPU machine's own time limit sends) during a hung row
env TMPDIR="$tmp" OUT="$tmp/killed.files" NZ_COMPUTE_SANITIZER= NZ_BUNDLE_CACHE="$tmp/cache" NZ_GPU_CHECK_FAKE_GPU=1 \
  NZ_GPU_CHECK_SIMULATE="hang:stages" bash "$tmp/b/gpu_check.sh" >"$tmp/killed.out" 2>&1 &
pid=$!
for _ in $(seq 50); do grep -q 'gpu.comm.np4.shared' "$tmp/killed.out" 2>/dev/null && break; sleep 0.2; done
sleep 1
kill -TERM $pid
rc=0
wait $pid || rc=$?
sleep 0.5
ok=1
if has_table killed && [ $rc != 0 ] && table_row killed FAIL aborted | grep -q 'SIGTERM during stages' &&
   ! pgrep -f "^(timeout -k 5 [0-9]+ )?(stdbuf -oL -eL )?sleep 100000$" >/dev/null && out_ok killed &&
   tar -tzf "$tmp/killed.files/logs.tar.gz" | grep -q 'speed.stage3.log'; then ok=0; fi
result killed $ok "expected the table with an 'aborted' row naming the stages row, the hung command gone, \$OUT written (exit $rc)"

make_bundle "$tmp/inc" && rm "$tmp/inc/tests/test_cuda_stages"
rc=0
env TMPDIR="$tmp" NZ_COMPUTE_SANITIZER= NZ_GPU_CHECK_FAKE_GPU=1 timeout 60 bash "$tmp/inc/gpu_check.sh" >"$tmp/incomplete.out" 2>&1 || rc=$?
ok=1
if has_table incomplete && [ $rc != 0 ] && table_row incomplete FAIL bundle | grep -q 'tests/test_cuda_stages' &&
   table_row incomplete SKIP kernels | grep -q 'preflight failed'; then ok=0; fi
result incomplete $ok "expected a FAIL row naming the missing binary and the GPU rows SKIP (exit $rc)"

# build_fails: gpu_check.sh in a repository's tests/ folder, whose make gpu-bundle fails
mkdir -p "$tmp/repo/tests/cuda" && cp tests/cuda/gpu_check.sh "$tmp/repo/tests/cuda/"
printf 'gpu-bundle:\n\t@echo "common/x.cu(1): error: simulated compile error"; exit 1\n' >"$tmp/repo/Makefile"
rc=0
env TMPDIR="$tmp" NZ_GPU_CHECK_FAKE_GPU=1 timeout 60 bash "$tmp/repo/tests/cuda/gpu_check.sh" >"$tmp/build_fails.out" 2>&1 || rc=$?
ok=1
if has_table build_fails && [ $rc != 0 ] && table_row build_fails FAIL build | grep -q 'simulated compile error'; then ok=0; fi
result build_fails $ok "expected a FAIL row named build quoting the error, and the table (exit $rc)"

# host_libs: with cuBLAS and NCCL where the check looks, the row names where; with them nowhere, the
# row FAILs naming each and the GPU rows SKIP — the same on a machine with the toolkit as without it
run_case host_libs_found NZ_GPU_CHECK_FAKE_GPU=1
run_case host_libs_missing NZ_GPU_CHECK_FAKE_GPU=1 NZ_LIB_DIRS="$tmp/nolibs"
ok=1
if table_row host_libs_found PASS host_libs | grep -q "libcublas in $tmp/hostlibs; libcublasLt in $tmp/hostlibs; libnccl in $tmp/hostlibs" &&
   table_row host_libs_missing FAIL host_libs | grep -q 'not found: libcublas.so.13 libcublasLt.so.13 libnccl.so.2' &&
   table_row host_libs_missing SKIP kernels >/dev/null && [ $rc != 0 ] && has_table host_libs_missing; then ok=0; fi
result host_libs $ok "expected host_libs PASS naming $tmp/hostlibs for each library, and FAIL naming all three (GPU rows SKIP) where none is"

# nccl_in_python: a library only a Python environment holds (PyTorch's nvidia-nccl-cu13 layout)
mkdir -p "$tmp/py/nvidia/nccl/lib" && : >"$tmp/py/nvidia/nccl/lib/libnz_fake_nccl.so.2"
found=$(source dev/gpu_bundle/bundle_env.sh && NZ_LIB_DIRS_ONLY= PYTHONPATH="$tmp/py" bundle_find_lib libnz_fake_nccl.so.2)
ok=1
[ "$found" = "$tmp/py/nvidia/nccl/lib" ] && ok=0
result nccl_in_python $ok "expected bundle_env.sh to find it in $tmp/py/nvidia/nccl/lib, found '${found}'"
exit 0
