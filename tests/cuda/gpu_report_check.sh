#!/usr/bin/env bash
# gpu_report_check.sh — tests of tests/cuda/gpu_check.sh itself, the check that runs on a lent GPU for a
# few minutes and must report whatever happens there. Building the real bundle takes minutes (make
# gpu-bundle), so this runs the real gpu_check.sh, bundle_env.sh and bundle_check.sh in a fake
# bundle (a temporary folder) whose trainers, tests and mpirun are small scripts printing what the
# real ones print, and checks, in about 30 s:
#   no_gpu       without a GPU: the preflight rows, every GPU row SKIP, the table, exit 0;
#   no_gpu_fail  without a GPU, a failing preflight row: FAIL, the table, exit non-zero;
#   all_pass     with NZ_GPU_CHECK_FAKE_GPU=1: every row PASS, tokens/s and MFU parsed into the table;
#   row_timeout  a row that hangs is killed at its timeout, a row that fails is a FAIL row, the rows
#                after them still run, the table is printed, exit non-zero;
#   deadline     a hang that eats the global deadline: that row TIMEOUT, the rest SKIP, on time;
#   killed       SIGTERM in the middle of a hung row: the table is printed, the hung command is gone;
#   incomplete   a binary missing from the bundle: a FAIL row, the GPU rows SKIP, the table;
#   build_fails  run from a repository where make gpu-bundle fails: a FAIL row named build, the table;
#   nccl_in_python  bundle_env.sh finds a library in a Python environment's site-packages/nvidia/*/lib.
# Prints NZRESULT lines (tests/run_all.sh); the inner checks' own NZRESULT lines stay in their logs.
set -u
cd "$(dirname "$0")/../.." || exit 1
tmp=$(mktemp -d /tmp/nanozero-gpureport.XXXXXX)
trap '[ -z "${NZ_KEEP_TEST_FILES:-}" ] && rm -rf "$tmp"' EXIT

make_bundle() {  # DIR: a fake bundle around the real scripts
  local b=$1 f
  mkdir -p "$b"/{bin,tests,mpi,lib,data,scripts}
  cp stages.txt tests/cuda/gpu_check.sh dev/gpu_bundle/bundle_env.sh dev/gpu_bundle/bundle_check.sh dev/gpu_bundle/host_libs.txt "$b/"
  cp "$(type -P true)" "$b/bin/elf_probe"  # one real ELF file for bundle_check.sh (needs libc only)
  : >"$b/data/corpus.txt"
  for f in $(grep '^[a-z]' stages.txt); do
    cat >"$b/bin/$f" <<'EOF'
#!/usr/bin/env bash
echo "cuda: fake GPU (sm_90)"
echo "done: 20 steps in 1.0 s | final train loss 1.0 | validation loss 1.0 (unigram baseline 3.0) | 123.4 ms/step"
echo "throughput: 1000 tokens/s | MFU 40.0% (6 x params)"
echo "ledger matches the formulas"
echo "GPU memory (rank 0's GPU, 4 ranks): ledger peak 1.00 GB, now 500.00 MB | in use 2.00 GB (cudaMemGetInfo total - free) | not in the ledger 1.50 GB (...)"
EOF
  done
  for f in test_cuda_kernels test_cuda_comm test_cuda_stages; do
    printf '#!/usr/bin/env bash\necho "NZRESULT PASS Fake.One"\necho "NZRESULT PASS Fake.Two"\n' >"$b/tests/$f"
  done
  # mpirun: run the command once (the real launcher is tried by the no_gpu case's mpirun row only
  # through this script; the real bundle's row starts MPICH's hydra)
  printf '#!/usr/bin/env bash\n[ "$1" = -np ] && shift 2\nexec "$@"\n' >"$b/mpi/mpirun"
  chmod +x "$b"/bin/* "$b"/tests/* "$b"/mpi/mpirun
}

# run_case NAME ENV... : runs the fake bundle's gpu_check.sh, output in $tmp/NAME.out, exit in $rc
run_case() {
  local name=$1
  shift
  rc=0
  env TMPDIR="$tmp" NZ_COMPUTE_SANITIZER= NZ_BUNDLE_CACHE="$tmp/cache" "$@" timeout -k 5 60 bash "$tmp/b/gpu_check.sh" >"$tmp/$name.out" 2>&1 || rc=$?
}
table_row() { sed -n '/^== gpu_check/,$p' "$tmp/$1.out" | grep -E "^   $2 +$3 "; }
result() {  # name, condition-ok (0/1), why
  if [ "$2" = 0 ]; then echo "NZRESULT PASS gpu_report.$1"
  else echo "NZRESULT FAIL gpu_report.$1 ($3; output: $tmp/$1.out)"; trap - EXIT; fi
}
has_table() { grep -q '^== gpu_check: ' "$tmp/$1.out" && grep -qE '^   [0-9]+ passed, [0-9]+ failed, [0-9]+ skipped$' "$tmp/$1.out"; }

make_bundle "$tmp/b"

run_case no_gpu CUDA_VISIBLE_DEVICES=none
ok=1
if has_table no_gpu && [ $rc = 0 ] && table_row no_gpu PASS bundle >/dev/null && table_row no_gpu PASS mpirun >/dev/null &&
   [ "$(sed -n '/^== gpu_check/,$p' "$tmp/no_gpu.out" | grep -cE '^   SKIP ')" = 18 ]; then ok=0; fi
result no_gpu $ok "expected the table with bundle and mpirun PASS, 18 SKIP rows and exit 0 (exit $rc)"

run_case no_gpu_fail CUDA_VISIBLE_DEVICES=none NZ_GPU_CHECK_SIMULATE="fail:mpirun"
ok=1
if has_table no_gpu_fail && [ $rc != 0 ] && table_row no_gpu_fail FAIL mpirun | grep -q 'simulated failure'; then ok=0; fi
result no_gpu_fail $ok "expected the mpirun row FAIL, the table, and a non-zero exit without a GPU too (exit $rc)"

run_case all_pass NZ_GPU_CHECK_FAKE_GPU=1
ok=1
if has_table all_pass && [ $rc = 0 ] && grep -q '^   0 failed\|^   [0-9]* passed, 0 failed, 2 skipped' "$tmp/all_pass.out" &&
   table_row all_pass PASS speed.stage0_ddp.flash | grep -q '1000 tokens/s, MFU 40.0%, 123.4 ms/step, attention flash' &&
   table_row all_pass PASS memory.offload | grep -q 'ledger peak 1.00 GB, cudaMemGetInfo in use 2.00 GB' &&
   table_row all_pass PASS kernels | grep -q '2 passed, 0 failed'; then ok=0; fi
result all_pass $ok "expected every row PASS but the 2 sanitizer rows, with tokens/s, MFU and memory parsed (exit $rc)"

start=$SECONDS
run_case row_timeout NZ_GPU_CHECK_FAKE_GPU=1 NZ_GPU_CHECK_ROW_LIMIT=3 NZ_GPU_CHECK_SIMULATE="hang:kernels fail:comm.np4.shared"
ok=1
if has_table row_timeout && [ $rc != 0 ] && table_row row_timeout TIMEOUT kernels >/dev/null &&
   table_row row_timeout FAIL comm.np4.shared >/dev/null && table_row row_timeout PASS stages >/dev/null &&
   table_row row_timeout PASS speed.stage0_ddp >/dev/null && [ $((SECONDS - start)) -lt 20 ]; then ok=0; fi
result row_timeout $ok "expected kernels TIMEOUT, comm.np4.shared FAIL, later rows PASS, a table, exit non-zero, in < 20 s (exit $rc, $((SECONDS - start)) s)"

start=$SECONDS
run_case deadline NZ_GPU_CHECK_FAKE_GPU=1 NZ_GPU_CHECK_DEADLINE=12 NZ_GPU_CHECK_SIMULATE="hang:kernels"
ok=1
if has_table deadline && [ $rc != 0 ] && table_row deadline TIMEOUT kernels >/dev/null &&
   table_row deadline SKIP speed.stage3 | grep -q 'deadline' && [ $((SECONDS - start)) -le 14 ]; then ok=0; fi
result deadline $ok "expected kernels TIMEOUT and the rows after it SKIP within the 12 s deadline (exit $rc, $((SECONDS - start)) s)"

# killed: a SIGTERM (what the GPU machine's own time limit sends) during a hung row
env TMPDIR="$tmp" NZ_COMPUTE_SANITIZER= NZ_BUNDLE_CACHE="$tmp/cache" NZ_GPU_CHECK_FAKE_GPU=1 NZ_GPU_CHECK_SIMULATE="hang:stages" \
  bash "$tmp/b/gpu_check.sh" >"$tmp/killed.out" 2>&1 &
pid=$!
for _ in $(seq 50); do grep -q 'gpu.comm.np4.shared' "$tmp/killed.out" && break; sleep 0.2; done
sleep 1
kill -TERM $pid
rc=0
wait $pid || rc=$?
sleep 0.5
ok=1
if has_table killed && [ $rc != 0 ] && table_row killed FAIL aborted | grep -q 'SIGTERM during stages' &&
   ! pgrep -f "^(timeout -k 5 [0-9]+ )?sleep 100000$" >/dev/null; then ok=0; fi
result killed $ok "expected the table with an 'aborted' row naming the stages row, and the hung command gone (exit $rc)"

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

# nccl_in_python: a library only a Python environment holds (PyTorch's nvidia-nccl-cu13 layout)
mkdir -p "$tmp/py/nvidia/nccl/lib" && : >"$tmp/py/nvidia/nccl/lib/libnz_fake_nccl.so.2"
found=$(source dev/gpu_bundle/bundle_env.sh && PYTHONPATH="$tmp/py" bundle_find_lib libnz_fake_nccl.so.2)
ok=1
[ "$found" = "$tmp/py/nvidia/nccl/lib" ] && ok=0
result nccl_in_python $ok "expected bundle_env.sh to find it in $tmp/py/nvidia/nccl/lib, found '${found}'"
exit 0
