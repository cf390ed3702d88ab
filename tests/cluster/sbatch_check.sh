#!/usr/bin/env bash
# The Slurm batch scripts (scripts/slurm/), without Slurm (make slurm-check runs them under a real one):
#   - both parse (bash -n), and every #SBATCH line comes before the first command (sbatch reads no
#     further) and names an option sbatch has (where sbatch is installed);
#   - --dry-run prints the srun line the variables make, defaults and overrides;
#   - bad input is one line and exit 2, with nothing written: an argument, a stage that does not
#     exist, a missing binary, CKPT_EVERY, a flag the script sets itself, outside a job, a
#     submission directory that is not the repository, a bundle without gpu_check.sh;
#   - the job's own path with a stand-in srun (mpirun -np 4) and scontrol: the run trains and writes
#     its model, and SIGUSR1 (sbatch --signal=B:USR1@S, the time limit near) makes it ask
#     `scontrol requeue` for its job while the ranks go on.
# Prints NZRESULT lines for tests/run_all.sh.
cd "$(dirname "$0")/../.."
source tests/lib/check.sh  # pass, fail, expect_error
source tests/lib/job.sh    # wait_for_checkpoint
check_suite sbatch
bin=${NZ_BIN_DIR:-build/bin}
tmp=$(mktemp -d)
job=""
trap '[ -n "$job" ] && { kill -9 $job; pkill -9 -f -- "$tmp/run/"; } 2>/dev/null; rm -rf "$tmp"' EXIT
nz=scripts/slurm/nanozero.sbatch
gpu=scripts/slurm/gpu_check.sbatch
unset SLURM_JOB_ID SLURM_SUBMIT_DIR SLURM_CPUS_PER_TASK SLURM_JOB_NAME STAGE FLAGS RUN_DIR CKPT_EVERY MPI BIN BUNDLE OUT

# ---- the scripts as sbatch reads them ----
for s in $nz $gpu; do
  name=$(basename "$s" .sbatch)
  # the line of the first command, and the #SBATCH lines after it (which sbatch would ignore)
  late=$(awk '!/^[[:space:]]*(#|$)/ && !first {first = NR} /^#SBATCH/ && first {print NR}' "$s")
  if bash -n "$s" 2>/dev/null && [ -z "$late" ] && [ "$(grep -c '^#SBATCH' "$s")" -ge 5 ]; then
    pass "${name}_parses ($(grep -c '^#SBATCH' "$s") #SBATCH lines, all before the first command)"
  else fail "${name}_parses" "bash -n: $(bash -n "$s" 2>&1 | head -1); #SBATCH lines after the first command at lines: $late"; fi
  # sbatch's manual page (slurm-client): its options as \fB\-\-name\fR=... (sbatch --help needs a cluster)
  manual=/usr/share/man/man1/sbatch.1.gz
  if [ -f $manual ]; then
    unknown=""
    for o in $(sed -n 's/^##\{0,1\}SBATCH[[:space:]]*\(--[a-z-]*\).*/\1/p' "$s"); do
      zcat $manual | grep -qF -- "\\fB${o//-/\\-}\\fR" || unknown+=" $o"
    done
    if [ -z "$unknown" ]; then pass "${name}_options_known (every #SBATCH option in sbatch's manual)"
    else fail "${name}_options_known" "not in sbatch's manual:$unknown"; fi
  else
    echo "NZRESULT SKIP $check_name.${name}_options_known (no sbatch manual: make slurm-check installs Slurm)"
  fi
done

# ---- --dry-run: the srun line ----
want="would run: srun --mpi=pmi2 --kill-on-bad-exit=1 build/bin/stage3 --preset small --steps 300 --ckpt-dir runs/nanozero-dry-run/ckpt --ckpt-every 50 --resume auto --save-model runs/nanozero-dry-run/final.model --log-json runs/nanozero-dry-run/report.json"
out=$(bash $nz --dry-run 2>&1)
if [ $? = 0 ] && [ "$(tail -1 <<<"$out")" = "$want" ]; then pass "dry_run_defaults"
else fail dry_run_defaults "got: $out"; fi
want="would run: OMP_NUM_THREADS=3 srun --mpi=pmix --kill-on-bad-exit=1 $bin/stage1 --preset tiny --steps 9 --ckpt-dir /shared/r/ckpt --ckpt-every 7 --resume auto --save-model /shared/r/final.model --log-json /shared/r/report.json"
out=$(SLURM_CPUS_PER_TASK=3 STAGE=stage1 FLAGS="--preset tiny --steps 9" RUN_DIR=/shared/r CKPT_EVERY=7 MPI=pmix BIN=$bin \
      bash $nz --dry-run 2>&1)
if [ $? = 0 ] && [ "$(tail -1 <<<"$out")" = "$want" ] && [ ! -e /shared/r ]; then pass "dry_run_overrides (threads from --cpus-per-task)"
else fail dry_run_overrides "got: $out"; fi
mkdir -p "$tmp/bundle" && touch "$tmp/bundle/gpu_check.sh"
out=$(BUNDLE=$tmp/bundle OUT=$tmp/o bash $gpu --dry-run 2>&1)
if [ $? = 0 ] && [ "$out" = "gpu_check.sbatch --dry-run: would run: OUT=$tmp/o HYDRA_LAUNCHER=fork bash $tmp/bundle/gpu_check.sh" ] &&
   [ ! -e "$tmp/o" ]
then pass "gpu_dry_run"; else fail gpu_dry_run "got: $out"; fi

# ---- bad input: one line, exit 2, nothing written ----
expect_error bad_argument "--now: expected no argument or --dry-run" bash $nz --now
expect_error bad_stage "STAGE=stage9 is not a trainer; expected one of: stage0_ddp" env STAGE=stage9 bash $nz --dry-run
expect_error missing_binary "$tmp/nobin/stage1 not found: build it first" env STAGE=stage1 BIN=$tmp/nobin bash $nz --dry-run
expect_error bad_ckpt_every "CKPT_EVERY=0: expected a whole number of steps" env CKPT_EVERY=0 bash $nz --dry-run
expect_error flag_set_by_the_script "FLAGS holds --resume, which this script sets" env FLAGS="--preset tiny --resume x" bash $nz --dry-run
expect_error outside_a_job "not inside a Slurm job: submit it with sbatch" env RUN_DIR=$tmp/never bash $nz
expect_error not_the_repository "no stages.txt in $tmp: submit from the repository's root" env SLURM_SUBMIT_DIR=$tmp bash $nz --dry-run
expect_error gpu_bad_bundle "BUNDLE=$tmp/none holds no gpu_check.sh" env BUNDLE=$tmp/none bash $gpu --dry-run
if [ ! -e "$tmp/never" ]; then pass nothing_written_on_bad_input; else fail nothing_written_on_bad_input "$tmp/never made"; fi

# ---- the job's path with a stand-in srun and scontrol; SIGUSR1 asks for a requeue ----
mkdir -p "$tmp/path"
cat >"$tmp/path/srun" <<'EOF'
#!/bin/bash
# stand-in srun: --mpi=list, or the ranks under mpirun (its --mpi and --kill-on-bad-exit dropped)
[ "$1" = --mpi=list ] && { printf 'MPI plugin types are...\n\tnone\n\tpmi2\n'; exit 0; }
exec mpirun -np "$SLURM_NTASKS" "${@:3}"
EOF
printf '#!/bin/bash\necho "$*" >>"%s/scontrol.calls"\n' "$tmp" >"$tmp/path/scontrol"
chmod +x "$tmp/path/srun" "$tmp/path/scontrol"
PATH=$tmp/path:$PATH SLURM_JOB_ID=42 SLURM_NTASKS=4 SLURM_JOB_NUM_NODES=1 SLURM_CPUS_PER_TASK=1 SLURM_SUBMIT_DIR=$PWD \
  STAGE=stage1 FLAGS="--preset tiny --seq 16 --batch 2 --eval-every 0 --quiet --steps 200" RUN_DIR=$tmp/run CKPT_EVERY=10 BIN=$bin \
  bash $nz >"$tmp/job.log" 2>&1 &
job=$!  # (the script itself: SIGUSR1 is for it)
signalled=""
wait_for_checkpoint "$tmp/run/ckpt" 10 2400 && kill -USR1 $job && signalled=yes
for _ in $(seq 1200); do kill -0 $job 2>/dev/null || break; sleep 0.1; done  # up to 2 minutes
kill -0 $job 2>/dev/null && { pkill -9 -f -- "$tmp/run"; kill -9 $job; }
wait $job
rc=$?
job=""
if [ "$signalled" = yes ] && [ $rc = 0 ] && [ "$(cat "$tmp/scontrol.calls" 2>/dev/null)" = "requeue 42" ] &&
   grep -q "the time limit is near: requeueing job 42" "$tmp/job.log" && [ -s "$tmp/run/final.model" ] &&
   grep -q '"world":4,' "$tmp/run/report.json"; then
  pass "job_path_usr1_asks_for_requeue (4 ranks trained 200 steps and wrote the model; SIGUSR1 -> scontrol requeue 42)"
else fail job_path_usr1_asks_for_requeue "signalled '$signalled', exit $rc, scontrol: $(cat "$tmp/scontrol.calls" 2>/dev/null); log: $(grep -v '^step\|^rank' "$tmp/job.log" | tail -3 | tr '\n' ' ')"; fi
