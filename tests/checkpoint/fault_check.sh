#!/usr/bin/env bash
# Fault tolerance (docs/checkpoints.md), each against an uninterrupted run of the same job:
#   - kill -9 one rank mid-run under scripts/train_resilient.sh: the relaunched job ends with the
#     same model file, byte for byte;
#   - a checkpoint with a flipped byte, a truncated shard or no MANIFEST is detected, named, and
#     --resume auto falls back to the previous valid one (and still ends with the same model);
#     --resume naming a damaged one is one line and exit 2;
#   - a rank stopped with SIGSTOP ends the job within the watchdog's stated time, naming the rank;
#     a rank slow but alive (phases longer than --watchdog) is not stopped; a rank alive but making
#     no progress is named;
#   - offload's disk files survive no crash: one rank killed, the directory is empty;
#   - a --ckpt-dir belongs to one run: another run (another --seed), or a second job at the same
#     time, is refused before training; the clean-up removes only the files it wrote; stale
#     temporary files are ignored on resume and removed by the next write;
#   - values no run writes (step -1, a NaN weight under valid checksums, a checkpoint past --steps)
#     are one line and exit 2; a run whose checkpoints or report all fail to be written exits 1.
# Prints NZRESULT lines for tests/run_all.sh.
cd "$(dirname "$0")/../.."
bin=${NZ_BIN_DIR:-build/bin}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
source tests/lib/job.sh    # rank_pid, wait_for_checkpoint
source tests/lib/check.sh  # pass, fail, expect_error
check_suite fault
# name, the command's exit code, the exit code wanted, a pattern its one line must hold, its output
one_line() {
  if [ "$2" = "$3" ] && [ "$(grep -c . <<<"$5")" = 1 ] && grep -q -- "$4" <<<"$5"; then pass "$1"
  else fail "$1" "exit $2, want $3 and one line with '$4'; got: $5"; fi
}


# ---- kill -9 one rank mid-run; the wrapper relaunches; the same final model ----
job="--preset small --eval-every 0 --eval-windows 4 --quiet --steps 60 --watchdog 30"
mpirun -np 2 $bin/stage2 $job --save-model "$tmp/ref.model" >/dev/null 2>&1
ck="$tmp/kill_ckpt"
scripts/train_resilient.sh --restarts 2 -- mpirun -np 2 $bin/stage2 $job --ckpt-dir "$ck" --ckpt-every 5 \
  --save-model "$tmp/kill.model" >"$tmp/kill.log" 2>&1 &
wrapper=$!
killed=""
if wait_for_checkpoint "$ck" 10 1200; then
  pid=$(rank_pid "$ck" 1 stage2)
  [ -n "$pid" ] && kill -9 "$pid" && killed=$pid
fi
wait $wrapper
rc=$?
cp "$tmp/kill.log" "${NZ_FAULT_LOG:-/dev/null}" 2>/dev/null
if [ -n "$killed" ] && [ $rc = 0 ] && grep -q "relaunching from the newest valid checkpoint" "$tmp/kill.log" &&
   grep -q "^resumed from $ck/step-" "$tmp/kill.log" && cmp -s "$tmp/ref.model" "$tmp/kill.model"; then
  pass "kill9_one_rank_restart_same_model ($(grep -o 'resumed from [^:]*: [0-9]* of' "$tmp/kill.log" | head -1))"
else
  fail kill9_one_rank_restart_same_model "killed pid '${killed}', wrapper exit $rc, models $(cmp "$tmp/ref.model" "$tmp/kill.model" 2>&1 || true); log: $(tail -5 "$tmp/kill.log")"
fi

# Resumed from a checkpoint that already has every step: nothing to train, said so (no "final train
# loss 0"), exit 0, and the saved model is the finished run's.
out=$(mpirun -np 2 $bin/stage2 $job --ckpt-dir "$ck" --resume auto --save-model "$tmp/again.model" 2>&1); rc=$?
if [ $rc = 0 ] && grep -q '^done: no step left to run (60 of 60 done before this run)' <<<"$out" &&
   ! grep -q 'final train loss' <<<"$out" && cmp -s "$tmp/ref.model" "$tmp/again.model"; then
  pass resume_at_the_last_step_says_nothing_left
else fail resume_at_the_last_step_says_nothing_left "exit $rc; got: $(grep '^done' <<<"$out")"; fi

# Bad input is not retried: the wrapper passes exit code 2 on after one launch.
out=$(scripts/train_resilient.sh --restarts 3 -- mpirun -np 1 $bin/stage2 --bogus 1 --ckpt-dir "$tmp/bogus" 2>&1); rc=$?
if [ $rc = 2 ] && [ "$(grep -c 'unknown flag' <<<"$out")" = 1 ] && grep -q "not relaunching" <<<"$out"; then
  pass wrapper_does_not_retry_bad_input
else fail wrapper_does_not_retry_bad_input "exit $rc; got: $out"; fi

# ---- damaged checkpoints: detected, named, and --resume auto falls back ----
tiny="--preset tiny --seq 16 --batch 2 --warmup 2 --eval-every 0 --eval-windows 2 --quiet --steps 6"
mpirun -np 2 $bin/stage1 $tiny --save-model "$tmp/tiny_ref.model" >/dev/null 2>&1
cd2="$tmp/damaged"
mpirun -np 2 $bin/stage1 $tiny --ckpt-dir "$cd2" --ckpt-every 1 --ckpt-keep 6 >/dev/null 2>&1
flip() { python3 -c "import sys; f=open(sys.argv[1],'r+b'); f.seek(int(sys.argv[2])); b=f.read(1); f.seek(int(sys.argv[2])); f.write(bytes([b[0]^1])); f.close()" "$1" "$2"; }
resume_auto() {  # name, expected note, expected step resumed from (on a copy: the run writes its own checkpoints)
  local name=$1 note=$2 from=$3 out rc
  cp -r "$cd2" "$tmp/$name"
  out=$(mpirun -np 2 $bin/stage1 $tiny --ckpt-dir "$tmp/$name" --resume auto --save-model "$tmp/$name.model" 2>&1)
  rc=$?
  if [ $rc = 0 ] && grep -q -- "$note" <<<"$out" && grep -q "resumed from $tmp/$name/step-0000000$from: $from of 6" <<<"$out" &&
     cmp -s "$tmp/tiny_ref.model" "$tmp/$name.model"; then pass "$name"
  else fail "$name" "exit $rc, want a note '$note', a resume from step $from and the uninterrupted model; got: $out"; fi
}
flip "$cd2/step-00000006/rank-00001.shard" 5000
out=$(mpirun -np 2 $bin/stage1 $tiny --resume "$cd2/step-00000006" 2>&1); rc=$?
if [ $rc = 2 ] && [ "$(grep -c . <<<"$out")" = 1 ] && grep -q "rank-00001.shard: checksum mismatch" <<<"$out"; then
  pass explicit_resume_of_damaged_checkpoint_is_one_line
else fail explicit_resume_of_damaged_checkpoint_is_one_line "exit $rc; got: $out"; fi
resume_auto flipped_byte_falls_back "step-00000006: rank-00001.shard: checksum mismatch" 5
truncate -s -100 "$cd2/step-00000005/rank-00000.shard"
resume_auto truncated_shard_falls_back "step-00000005: rank-00000.shard truncated" 4
rm "$cd2/step-00000004/MANIFEST"
resume_auto missing_manifest_falls_back "step-00000004: no MANIFEST" 3
printf 'x' >>"$cd2/step-00000003/MANIFEST"
resume_auto damaged_manifest_falls_back "step-00000003: MANIFEST damaged" 2

# ---- values no run writes, under valid checksums (tests/lib/craft_files.py recomputes them) ----
out=$(mpirun -np 2 $bin/stage1 ${tiny/--steps 6/--steps 1} --resume "$cd2/step-00000002" 2>&1); rc=$?
one_line resume_past_steps_is_one_line $rc 2 "a checkpoint of 2 steps, already past --steps 1" "$out"
mkdir -p "$tmp/crafted" && cp -r "$cd2/step-00000002" "$tmp/crafted/negative"
python3 tests/lib/craft_files.py manifest "$tmp/crafted/negative" step -1
out=$(mpirun -np 2 $bin/stage1 $tiny --resume "$tmp/crafted/negative" 2>&1); rc=$?
one_line manifest_step_minus_one_is_one_line $rc 2 "MANIFEST out of range (step -1" "$out"
cp -r "$cd2/step-00000002" "$tmp/crafted/step-00000002"
python3 tests/lib/craft_files.py nan_shard "$tmp/crafted/step-00000002" 0 5
out=$(mpirun -np 2 $bin/stage1 $tiny --resume "$tmp/crafted/step-00000002" 2>&1); rc=$?
# (found as the state is loaded, after the run's header lines: one error line, and no step taken)
one_line nan_parameter_in_checkpoint_is_one_line $rc 2 "parameter unit embed, wte\[5\] is nan" \
  "$(grep -v '^device: \|^stage1 | \|^fp32 | ' <<<"$out")"
out=$($bin/consolidate --ckpt "$tmp/crafted/step-00000002" --out "$tmp/nan.model" 2>&1); rc=$?
one_line consolidate_refuses_nan_parameter $rc 2 "parameter unit embed, wte\[5\] is nan" "$out"

# ---- a --ckpt-dir belongs to one run (np 1, 2 steps: what is checked is who writes where) ----
two="--preset tiny --seq 16 --batch 2 --warmup 1 --eval-every 0 --eval-windows 1 --quiet --steps 2"
own="$tmp/own"
mpirun -np 1 $bin/stage1 $two --ckpt-dir "$own" --ckpt-every 1 --ckpt-keep 5 >/dev/null 2>&1
sums() { (cd "$own" && md5sum step-*/* | sort); }
before=$(sums)
out=$(mpirun -np 1 $bin/stage1 $two --seed 7 --ckpt-dir "$own" 2>&1); rc=$?
one_line another_runs_ckpt_dir_is_refused $rc 2 "holds 2 checkpoints of another run" "$out"
out=$(mpirun -np 1 $bin/stage1 ${two/--steps 2/--steps 3} --seed 7 --ckpt-dir "$own" --resume auto 2>&1); rc=$?
one_line resume_with_another_seed_is_refused $rc 2 "settings differ .*--seed 7 (was 1337)" "$out"
if [ "$before" = "$(sums)" ]; then pass refused_runs_leave_checkpoints_untouched
else fail refused_runs_leave_checkpoints_untouched "$(diff <(echo "$before") <(sums))"; fi
# another job holding the directory's lock (flock(1) stands in for it) is refused, not raced
if command -v flock >/dev/null; then
  (exec 9>>"$own/LOCK"; flock 9 && exec sleep 30) &  # the lock lives as long as that sleep
  holder=$!
  sleep 0.3
  out=$(mpirun -np 1 $bin/stage1 $two --ckpt-dir "$own" --resume auto 2>&1); rc=$?
  kill $holder 2>/dev/null; wait $holder 2>/dev/null
  one_line concurrent_job_in_ckpt_dir_is_refused $rc 2 "another job is writing checkpoints there now" "$out"
fi
# --ckpt-overwrite: the other run's checkpoints go (a note), this run's take their place
out=$(mpirun -np 1 $bin/stage1 $two --seed 7 --ckpt-dir "$own" --ckpt-overwrite 2>&1); rc=$?
if [ $rc = 0 ] && grep -q "^note: --ckpt-overwrite: removed 2 checkpoints of another run" <<<"$out" &&
   [ "$(ls "$own")" = "$(printf 'LOCK\nstep-00000002')" ] && grep -qx "seed 7" "$own/step-00000002/MANIFEST"; then
  pass ckpt_overwrite_replaces_another_run
else fail ckpt_overwrite_replaces_another_run "exit $rc; dir: $(ls "$own"); got: $out"; fi
# stale temporary files of a killed write: ignored on resume, removed by the next write; a file
# of the user's that only looks like one stays
for f in rank-00000.shard.tmp.AbC123 MANIFEST.tmp.XyZ789 notes.tmp.abcdef; do echo partial >"$own/step-00000002/$f"; done
out=$(mpirun -np 1 $bin/stage1 ${two/--steps 2/--steps 3} --seed 7 --ckpt-dir "$own" --resume auto 2>&1); rc=$?
left=$(cd "$own/step-00000002" && ls | tr '\n' ' ')
if [ $rc = 0 ] && grep -q "^resumed from $own/step-00000002: 2 of 3" <<<"$out" &&
   [ "$left" = "MANIFEST notes.tmp.abcdef rank-00000.shard " ]; then
  pass stale_temp_files_ignored_then_removed
else fail stale_temp_files_ignored_then_removed "exit $rc; step-00000002 holds: $left; got: $(tail -3 <<<"$out")"; fi
# --ckpt-keep's clean-up removes what it wrote, never a file of the user's (nor its directory)
mkdir -p "$tmp/keep/step-00000001" && echo mine >"$tmp/keep/step-00000001/notes.txt"
out=$(mpirun -np 1 $bin/stage1 ${two/--steps 2/--steps 3} --ckpt-dir "$tmp/keep" --ckpt-every 1 --ckpt-keep 1 2>&1); rc=$?
if [ $rc = 0 ] && [ "$(ls "$tmp/keep" | tr '\n' ' ')" = "LOCK step-00000001 step-00000003 " ] &&
   [ "$(ls "$tmp/keep/step-00000001")" = notes.txt ]; then pass ckpt_keep_spares_the_users_files
else fail ckpt_keep_spares_the_users_files "exit $rc; left: $(cd "$tmp/keep" && ls -R | tr '\n' ' ')"; fi
# --resume-changed goes on with new settings (a note says which), as the same run: same id
out=$(mpirun -np 1 $bin/stage1 ${two/--steps 2/--steps 4} --seed 9 --ckpt-dir "$tmp/keep" --resume auto --resume-changed 2>&1); rc=$?
if [ $rc = 0 ] && grep -q "^note: resuming with changed settings: --seed 9 (was 1337) --steps 4 (was 3)" <<<"$out" &&
   [ -n "$(grep '^run ' "$tmp/keep/step-00000003/MANIFEST")" ] &&
   [ "$(grep '^run ' "$tmp/keep/step-00000003/MANIFEST")" = "$(grep '^run ' "$tmp/keep/step-00000004/MANIFEST")" ]; then
  pass resume_changed_goes_on_as_the_same_run
else fail resume_changed_goes_on_as_the_same_run "exit $rc; got: $out"; fi
# a run that writes none of its checkpoints (a file stands where its step directory would go)
# ends with one line and exit 1, its model file written
mkdir -p "$tmp/nosave" && : >"$tmp/nosave/step-00000002"
out=$(mpirun -np 1 $bin/stage1 $two --ckpt-dir "$tmp/nosave" --save-model "$tmp/nosave.model" 2>&1); rc=$?
if [ $rc = 1 ] && [ "$(grep -c '^error' <<<"$out")" = 1 ] && [ -s "$tmp/nosave.model" ] &&
   grep -q "^error: the run finished, but no checkpoint written in $tmp/nosave (1 try failed" <<<"$out"; then
  pass no_checkpoint_written_exits_1
else fail no_checkpoint_written_exits_1 "exit $rc; got: $(grep -v '^step\|^rank\|^ ' <<<"$out")"; fi

# ---- a disk that fills up: the checkpoint that does not fit is a warning, the run goes on, the
# previous checkpoint stays valid and no partial shard is left (a 700 kB tmpfs holds one checkpoint
# of 2 x 278 kB; private mount namespace as in offload_check.sh; skipped where not allowed) ----
ns=""
if unshare -m true 2>/dev/null; then ns="unshare -m"; elif unshare -rm true 2>/dev/null; then ns="unshare -rm"; fi
if [ -n "$ns" ]; then
  mkdir -p "$tmp/full"
  out=$($ns sh -c "mount -t tmpfs -o size=700k tmpfs '$tmp/full' && mpirun -np 2 $bin/stage1 $tiny --ckpt-dir '$tmp/full/ck' \
        --ckpt-every 3 --save-model '$tmp/full_disk.model'; rc=\$?; echo files: \$(ls '$tmp/full/ck/step-00000006' | wc -l); \
        ls '$tmp/full/ck/step-00000003'; exit \$rc" 2>&1)
  rc=$?
  if [ $rc = 0 ] && grep -q "^warning: checkpoint at step 6 not written (.*No space left on device.*); training goes on" <<<"$out" &&
     grep -q "^files: 0" <<<"$out" && grep -q "^MANIFEST" <<<"$out" && cmp -s "$tmp/tiny_ref.model" "$tmp/full_disk.model"; then
    pass full_disk_checkpoint_is_a_warning
  else fail full_disk_checkpoint_is_a_warning "exit $rc; got: $(grep -v '^step\|^rank\|^ ' <<<"$out")"; fi
  # a model file or a report that does not fit (a 4 kB tmpfs): one line and exit 1 once the rest is
  # written; no temporary file is left on the full disk
  mkdir -p "$tmp/tiny_fs"
  for what in model report; do
    if [ $what = model ]; then outs="--save-model $tmp/tiny_fs/m.model --log-json $tmp/late.json"; kept=$tmp/late.json
    else outs="--save-model $tmp/late.model --log-json $tmp/tiny_fs/r.json"; kept=$tmp/late.model; fi
    out=$($ns sh -c "mount -t tmpfs -o size=4k tmpfs '$tmp/tiny_fs' && timeout -k 5 120 mpirun -np 2 $bin/stage1 $two $outs; \
          rc=\$?; echo left: \$(ls -A '$tmp/tiny_fs'); exit \$rc" 2>&1)
    rc=$?
    flag=$([ $what = model ] && echo --save-model || echo --log-json)
    if [ $rc = 1 ] && [ "$(grep -c '^error' <<<"$out")" = 1 ] && grep -q "^left: *$" <<<"$out" && [ -s "$kept" ] &&
       grep -q "^error: the run finished, but $flag $tmp/tiny_fs/.*No space left on device" <<<"$out"; then
      pass "full_disk_${what}_exits_1_leaving_no_temp_file"
    else fail "full_disk_${what}_exits_1_leaving_no_temp_file" "exit $rc; got: $(grep -v '^step\|^rank\|^ ' <<<"$out")"; fi
    rm -f "$kept"
  done
else
  echo "NZRESULT SKIP fault.full_disk_checkpoint_is_a_warning (no private mount namespace to mount a small tmpfs in)"
fi

# ---- the CUDA path (on the emulator, when tests/cuda/emu_check.sh has built it): resume is bit for bit
# too, with ranks sharing one GPU (MPI) and with a GPU each (NCCL); the checkpoint is read from
# and written to device memory ----
emu=${BUILD:-build}/emu/bin
if [ -x "$emu/stage3" ] && make -s -j"$(nproc)" BUILD="${BUILD:-build}" emu >/dev/null 2>&1; then  # (up to date)
  cuda="--preset tiny --seq 16 --batch 2 --warmup 2 --eval-every 0 --eval-windows 2 --quiet --steps 4 --device cuda"
  for gpus in 1 2; do
    d="$tmp/emu$gpus"
    env NZ_EMU_GPUS=$gpus mpirun -np 2 "$emu/stage3" $cuda --ckpt-dir "$d" --ckpt-every 2 --save-model "$d.full" >/dev/null 2>&1
    out=$(env NZ_EMU_GPUS=$gpus mpirun -np 2 "$emu/stage3" $cuda --resume "$d/step-00000002" --save-model "$d.resumed" 2>&1)
    if grep -q "^resumed from" <<<"$out" && cmp -s "$d.full" "$d.resumed"; then pass "cuda_emulated_resume_${gpus}_gpus"
    else fail "cuda_emulated_resume_${gpus}_gpus" "models differ or the resume failed: $(tail -3 <<<"$out")"; fi
  done
else
  echo "NZRESULT SKIP fault.cuda_emulated_resume (the emulator build is missing: tests/cuda/emu_check.sh makes it)"
fi

# ---- the watchdog: a stopped rank ends the job within --watchdog + 2 s, and is named ----
wd="$tmp/watchdog_marker"
mkdir -p "$wd"
start=$(date +%s.%N)
mpirun -np 2 $bin/stage1 --preset tiny --seq 16 --batch 2 --eval-every 0 --quiet --steps 100000000 --watchdog 3 \
  --ckpt-dir "$wd" --ckpt-every 50 >"$tmp/wd.log" 2>&1 &
job=$!
stopped=""
if wait_for_checkpoint "$wd" 50 1200; then
  pid=$(rank_pid "$wd" 1 stage1)
  [ -n "$pid" ] && kill -STOP "$pid" && stopped=$pid && t_stop=$(date +%s.%N)
fi
for _ in $(seq 300); do kill -0 $job 2>/dev/null || break; sleep 0.1; done
if kill -0 $job 2>/dev/null; then kill -9 $job; [ -n "$stopped" ] && kill -9 "$stopped"; fi
wait $job
rc=$?
[ -n "$stopped" ] && kill -9 "$stopped" 2>/dev/null
took=$(python3 -c "print(f'{$(date +%s.%N) - ${t_stop:-0}:.1f}')")
if [ -n "$stopped" ] && [ $rc != 0 ] && grep -q "watchdog: rank 1 stopped responding" "$tmp/wd.log" &&
   python3 -c "import sys; sys.exit(0 if $took <= 3 + 4 else 1)"; then
  pass "watchdog_names_stopped_rank (ended ${took} s after SIGSTOP, --watchdog 3)"
else fail watchdog_names_stopped_rank "stopped '$stopped', exit $rc, ${took} s; log: $(grep -v '^step\|^rank\|^ ' "$tmp/wd.log" | tail -4)"; fi

# ---- the watchdog measures liveness, not phase length: rank 1 slow but alive (each unit of its
# forward, backward and evaluation first sleeps 400 ms: NZ_TEST_SLOW_UNIT_MS, a test hook in
# common/model.cpp), so every phase lasts twice --watchdog 1 and rank 0 waits for it in stage3's
# all-gathers: the job runs to its end, with the model of the same job unslowed ----
slow="--preset tiny --seq 16 --batch 2 --eval-every 0 --eval-windows 4 --quiet --steps 1"
mpirun -np 2 $bin/stage3 $slow --save-model "$tmp/fast.model" >/dev/null 2>&1
start=$(date +%s.%N)
out=$(timeout 60 mpirun -np 1 $bin/stage3 $slow --watchdog 1 --save-model "$tmp/slow.model" : \
      -np 1 -env NZ_TEST_SLOW_UNIT_MS 400 $bin/stage3 $slow --watchdog 1 --save-model "$tmp/slow.model" 2>&1)
rc=$?
took=$(python3 -c "print(f'{$(date +%s.%N) - $start:.1f}')")
# 3 phases (forward, backward, evaluation) of 5 units: at least 6 s when the hook works
if [ $rc = 0 ] && ! grep -q watchdog <<<"$out" && cmp -s "$tmp/fast.model" "$tmp/slow.model" &&
   python3 -c "import sys; sys.exit(0 if $took >= 6 else 1)"; then
  pass "watchdog_spares_slow_but_alive_rank (${took} s, phases of 2 s, --watchdog 1)"
else fail watchdog_spares_slow_but_alive_rank "exit $rc, ${took} s (6 s or more expected); got: $(grep -v '^rank\|^ ' <<<"$out" | tail -4)"; fi

# ---- ... and a rank that is alive but makes no progress (it sleeps 10 min in a unit) while the
# other waits for it is named, within --watchdog 1 + 1 s (and the start-up). stage1: the waiting
# rank runs through its whole forward and backward first, milliseconds after the stuck one's last
# heartbeat, so only how far each got, not when, tells them apart ----
for r in 0 1; do
  hook0=""; hook1=""
  if [ $r = 0 ]; then hook0="-env NZ_TEST_SLOW_UNIT_MS 600000"; else hook1="-env NZ_TEST_SLOW_UNIT_MS 600000"; fi
  start=$(date +%s.%N)
  out=$(timeout 60 mpirun -np 1 $hook0 $bin/stage1 $slow --watchdog 1 : -np 1 $hook1 $bin/stage1 $slow --watchdog 1 2>&1)
  rc=$?
  took=$(python3 -c "print(f'{$(date +%s.%N) - $start:.1f}')")
  if [ $rc != 0 ] && [ $rc != 124 ] && grep -q "watchdog: rank $r has made no progress (.*in phase 'forward' of step 1)" <<<"$out" &&
     python3 -c "import sys; sys.exit(0 if $took <= 1 + 4 else 1)"; then
    pass "watchdog_names_rank_alive_but_stuck_$r (ended after ${took} s, --watchdog 1)"
  else fail "watchdog_names_rank_alive_but_stuck_$r" "exit $rc, ${took} s; got: $(grep -v '^rank\|^ ' <<<"$out" | tail -4)"; fi
done

# ---- offload on disk: one rank killed, the other ended by mpirun: no file left ----
od="$tmp/offload_dir"
mkdir -p "$od"
mpirun -np 2 $bin/offload --preset tiny --seq 16 --batch 2 --eval-every 0 --quiet --steps 100000000 --offload-to disk \
  --offload-dir "$od" --ckpt-dir "$tmp/offload_ckpt" --ckpt-every 50 >/dev/null 2>&1 &
job=$!
if wait_for_checkpoint "$tmp/offload_ckpt" 50 1200; then
  pid=$(rank_pid "$od" 1 offload)
  [ -n "$pid" ] && kill -9 "$pid"
fi
for _ in $(seq 300); do kill -0 $job 2>/dev/null || break; sleep 0.1; done
kill -0 $job 2>/dev/null && kill -9 $job
wait $job 2>/dev/null
if [ -n "$pid" ] && [ -z "$(ls -A "$od")" ]; then pass offload_rank_killed_leaves_no_files
else fail offload_rank_killed_leaves_no_files "killed '$pid'; left: $(ls -A "$od")"; fi
