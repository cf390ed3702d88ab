#!/usr/bin/env bash
# make slurm-check: a real Slurm on this machine (as root; not part of make test), docs/cluster.md.
#   - installs Slurm and munge where missing (scripts/install_deps.sh --slurm);
#   - writes a private configuration (one node with this machine's cores, its own ports, munge
#     socket and key, state and logs in build/slurm-check/) and starts munged, slurmctld and slurmd;
#   - submits scripts/slurm/nanozero.sbatch for stage0_ddp and stage3 on 4 tasks (srun --mpi=pmi2):
#     each job's losses and model file bit for bit `mpirun -np 4`'s;
#   - a requeue: stage3 requeued mid-run (`scontrol requeue`), its second run resumes from the
#     newest checkpoint and ends with the uninterrupted run's model and losses;
#   - the time limit: --time=1 and the script's --signal=B:USR1: the script requeues its job before
#     the limit and the next run resumes;
#   - the GPU bundle's batch script (scripts/slurm/gpu_check.sbatch) on a "gpu" partition, with a
#     stand-in bundle;
#   - where root may make network namespaces: the same job across two slurmd nodes, each in a
#     namespace of its own, bit for bit mpirun -np 4 on one machine (else one SKIP line);
#   - bad input under Slurm: a stage that does not exist and an MPI plugin srun lacks (the job's one
#     line, exit code 2), a partition that does not exist (refused at submission), a job that never
#     starts (the time-out says squeue's reason);
#   - every daemon it started is stopped on every exit path, by the pids it recorded, and no process
#     of its jobs is left; nothing is written to Slurm's and munge's default folders (their state,
#     logs and sockets are in build/slurm-check/; only the packages stay).
# Prints NZRESULT lines and ends with "slurm-check: N passed, N failed (S s)"; not root: one SKIP line.
cd "$(dirname "$0")/../.."
source tests/lib/check.sh  # pass, fail
check_suite slurm
bin=${NZ_BIN_DIR:-build/bin}
started=$SECONDS
summary() {  # the closing line, from this run's NZRESULT lines (kept in $results)
  local skipped
  skipped=$(grep -c '^NZRESULT SKIP' "$results")
  echo "slurm-check: $(grep -c '^NZRESULT PASS' "$results") passed, $(grep -c '^NZRESULT FAIL' "$results") failed" \
       "$([ "$skipped" = 0 ] || echo ", $skipped skipped ")($((SECONDS - started)) s)"
}

if [ "$(id -u)" != 0 ]; then
  echo "NZRESULT SKIP slurm (not root: starting slurmctld, slurmd and munged needs root; run make slurm-check as root)"
  exit 0
fi
if ! bash scripts/install_deps.sh --slurm; then
  echo "NZRESULT SKIP slurm (Slurm and munge are missing and did not install: apt's message above)"
  exit 0
fi
for p in stage0_ddp stage3; do
  [ -x "$bin/$p" ] || { echo "NZRESULT FAIL slurm.build ($bin/$p missing: make $bin/$p)"; exit 1; }
done

dir=$PWD/build/slurm-check
mkdir -p build
exec 9>build/slurm-check.lock
flock -n 9 || { echo "NZRESULT FAIL slurm.lock (another make slurm-check holds build/slurm-check.lock)"; exit 1; }
rm -rf "$dir"
mkdir -p "$dir"/{state,spool,jobs,runs,ref}
chmod 700 "$dir"   # munged refuses a key or socket in a directory others may write to
results=$dir/results
: >"$results"
touch "$dir/started"   # nothing of Slurm's or munge's outside build/ may be newer (checked at the end)
# Tee every verdict into $results (for the closing count) as it is printed.
pass() { echo "NZRESULT PASS $check_name.$1" | tee -a "$results"; }
fail() { echo "NZRESULT FAIL $check_name.$1 ($2)" | tee -a "$results"; }
# A mark every process this check starts carries in its environment (the daemons, and through them
# slurmstepd, the batch scripts and the ranks): how the clean-up finds what a job left behind.
mark="NZ_SLURM_CHECK=$$.$RANDOM"

# ---- the clean-up, on every exit path: jobs cancelled, daemons stopped by pid, stragglers by mark ----
daemons=()  # "name pid"
marked_pids() {  # the processes whose environment holds $mark (not this shell)
  local e p
  for e in /proc/[0-9]*/environ; do
    p=${e#/proc/}; p=${p%/environ}
    [ "$p" = $$ ] && continue
    tr '\0' '\n' 2>/dev/null <"$e" | grep -qxF "$mark" && echo "$p"
  done
}
stop_pid() {  # pid: SIGTERM, up to 5 s, then SIGKILL
  kill -TERM "$1" 2>/dev/null || return 0
  for _ in $(seq 50); do kill -0 "$1" 2>/dev/null || return 0; sleep 0.1; done
  kill -KILL "$1" 2>/dev/null
}
cleaned=0
cleanup() {
  [ $cleaned = 1 ] && return
  cleaned=1
  if [ ${#daemons[@]} -gt 0 ] && [ -n "${SLURM_CONF:-}" ]; then
    scancel --quiet --full --user=root 2>/dev/null   # this cluster's jobs: its own config (SLURM_CONF)
    for _ in $(seq 100); do [ -z "$(squeue -h 2>/dev/null)" ] && break; sleep 0.1; done
  fi
  local i
  for ((i = ${#daemons[@]} - 1; i >= 0; i--)); do stop_pid "${daemons[i]#* }"; done  # slurmd, slurmctld, munged
  for p in $(marked_pids); do kill -KILL "$p" 2>/dev/null; done
  declare -F two_nodes_down >/dev/null && two_nodes_down
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# ---- two more nodes, where root may make network namespaces: each its own network (a veth pair to a
# bridge, where slurmctld listens), host name and boot id (so MPI treats them as two machines) ----
two_id=nzs$$ two_net=10.214.0 two_ok=0 two_why=""
two_nodes_down() {  # deleting a namespace deletes its end of a veth pair, and so the pair
  ip netns del ${two_id}a 2>/dev/null; ip netns del ${two_id}b 2>/dev/null; ip link del ${two_id}br 2>/dev/null
}
two_nodes_up() {
  command -v ip >/dev/null || { two_why="no ip command (iproute2)"; return; }
  ip -o addr | grep -q " $two_net\." && { two_why="$two_net.0/24 is in use here"; return; }
  ip link add ${two_id}br type bridge && ip addr add $two_net.254/24 dev ${two_id}br && ip link set ${two_id}br up ||
    return
  two_ok=1
}
# the two namespaces, made just before their job
two_namespaces_up() {
  local n i=1
  for n in a b; do
    ip netns add $two_id$n && ip link add ${two_id}${n}0 type veth peer name ${two_id}${n}1 &&
      ip link set ${two_id}${n}1 netns $two_id$n && ip link set ${two_id}${n}0 master ${two_id}br &&
      ip link set ${two_id}${n}0 up && ip -n $two_id$n addr add $two_net.$i/24 dev ${two_id}${n}1 &&
      ip -n $two_id$n link set ${two_id}${n}1 up && ip -n $two_id$n link set lo up || return
    printf '2f7e0000-0000-4000-8000-00000000000%d\n' $i >"$dir/boot_id.$n"
    i=$((i + 1))
  done
}
two_nodes_up 2>"$dir/two_nodes.err" || two_why="root may not make network namespaces and veth pairs here: $(head -1 "$dir/two_nodes.err")"
[ $two_ok = 1 ] || two_nodes_down
ctld_addr=127.0.0.1
[ $two_ok = 1 ] && ctld_addr=$two_net.254   # a local address the namespaces reach too

# ---- the private cluster ----
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
host=$(hostname -s)
[ ${#dir} -lt 80 ] || { fail setup "the munge socket's path $dir/munge.socket is too long for a Unix socket: run from a shorter path"; summary; exit 1; }
dd if=/dev/urandom of="$dir/munge.key" bs=1024 count=1 status=none && chmod 400 "$dir/munge.key"
env "$mark" munged -F --force --socket="$dir/munge.socket" --key-file="$dir/munge.key" --log-file="$dir/munged.log" \
  --pid-file="$dir/munged.pid" --seed-file="$dir/munged.seed" 2>>"$dir/munged.log" &
daemons+=("munged $!")
mem=$(awk '/MemTotal/ {print int($2 / 1024 / 2)}' /proc/meminfo)   # half the memory, in MB
ctld_port=$(free_port) slurmd_port=$(free_port)
# cred_expire: a requeued job waits cred_expire + 1 s before it may start again (120 s by default).
# CPUs: the machine's cores, but at least 4: Slurm refuses more tasks on a node than its CPUs (even
# with --overcommit, when --ntasks-per-node asks for them, as the batch script does), and this check
# runs 4 tasks on one node; config_overrides keeps such a node in service (each rank runs one thread).
cpus=$(nproc)
[ "$cpus" -ge 4 ] || cpus=4
cat >"$dir/slurm.conf" <<EOF
# make slurm-check's private cluster: one node, this machine (tests/cluster/slurm_cluster.sh)
ClusterName=nanozero
SlurmctldHost=$host($ctld_addr)
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$dir/munge.socket,cred_expire=5
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool/%n
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.%n.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd.%n.log
PlugStackConfig=$dir/plugstack.conf
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
# look at the queue every 2 s (60 and 30 by default), so the requeued job starts once it may
SchedulerParameters=sched_interval=2,bf_interval=2
MpiDefault=none
ReturnToService=2
SlurmdParameters=config_overrides
KillWait=5
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
GresTypes=gpu
NodeName=$host NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$mem Gres=gpu:1 State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP
# scripts/slurm/gpu_check.sbatch's partition: the same node, with one GPU that is only counted
PartitionName=gpu Nodes=$host MaxTime=INFINITE State=UP
EOF
[ $two_ok = 1 ] && cat >>"$dir/slurm.conf" <<EOF
# two nodes in network namespaces, 2 CPUs each
NodeName=nodea NodeAddr=$two_net.1 CPUs=2 RealMemory=1000 State=UNKNOWN
NodeName=nodeb NodeAddr=$two_net.2 CPUs=2 RealMemory=1000 State=UNKNOWN
PartitionName=two Nodes=nodea,nodeb MaxTime=INFINITE State=UP
EOF
# (Slurm drops a GPU without a device file; /dev/null stands in, and with task/none nothing is bound)
echo "Name=gpu File=/dev/null" >"$dir/gres.conf"
: >"$dir/plugstack.conf"   # no SPANK plugins (not the system's /etc/slurm/plugstack.conf)
export SLURM_CONF=$dir/slurm.conf
for _ in $(seq 50); do [ -S "$dir/munge.socket" ] && break; sleep 0.1; done
env "$mark" slurmctld -D -c -f "$SLURM_CONF" 2>>"$dir/slurmctld.log" &
daemons+=("slurmctld $!")
env "$mark" slurmd -D -N "$host" -f "$SLURM_CONF" 2>>"$dir/slurmd.$host.log" &
daemons+=("slurmd $!")
state=""
for _ in $(seq 300); do
  state=$(sinfo -h -n "$host" -o %T 2>/dev/null | sort -u)
  [ "$state" = idle ] && break
  sleep 0.1
done
if [ "$state" = idle ]; then
  pass "cluster_up (munged, slurmctld, slurmd: pids ${daemons[*]#* }; node $host idle with $cpus CPUs for $(nproc) cores in $((SECONDS - started)) s; srun --mpi=list: $(srun --mpi=list 2>&1 | sed -n 's/^[[:space:]]\{1,\}//p' | tr '\n' ' '))"
else
  fail cluster_up "node state '$state' after 30 s; logs: $(tail -q -n 2 "$dir/slurmctld.log" "$dir/slurmd.$host.log" "$dir/munged.log" | tr '\n' ' ')"
  summary; exit 1
fi

# ---- jobs ----
# submit NAME STAGE FLAGS CKPT_EVERY [sbatch options...]: the job id, or sbatch's message (the batch
# script as a student would submit it, its shape given on the command line)
submit() {
  local name=$1
  STAGE=$2 FLAGS=$3 CKPT_EVERY=$4 RUN_DIR=$dir/runs/$name env "$mark" \
    sbatch --parsable --chdir="$PWD" --job-name="$name" --nodes=1 --ntasks-per-node=4 \
    --output="$dir/jobs/$name.out" "${@:5}" scripts/slurm/nanozero.sbatch 2>&1
}
# wait_job ID SECONDS: 0 once the job has left the queue; otherwise 1, after a line that says why
wait_job() {
  local t0=$SECONDS
  while [ $((SECONDS - t0)) -lt "$2" ]; do
    [ -z "$(squeue -h -j "$1" -o %T 2>/dev/null)" ] && return 0
    sleep 0.2
  done
  echo "job $1 did not end within $2 s: squeue says $(squeue -h -j "$1" -o '%T (%r)' 2>&1)"
  return 1
}
job_field() { scontrol show job "$1" 2>/dev/null | grep -o "$2=[^ ]*" | head -1 | cut -d= -f2; }
# losses NEW REF [FROM]: the steps_log losses of report NEW equal REF's, exactly, step by step (from
# step FROM on); prints how many
same_losses() {
  python3 - "$@" <<'EOF'
import json, sys
new, ref = (json.load(open(p)) for p in sys.argv[1:3])
first = int(sys.argv[3]) if len(sys.argv) > 3 else 1
want = {s["step"]: s["loss"] for s in ref["steps_log"] if s["step"] >= first}
got = {s["step"]: s["loss"] for s in new["steps_log"]}
if new["world"] != 4 or got != want:
    diff = [k for k in sorted(set(want) | set(got)) if got.get(k) != want.get(k)][:3]
    sys.exit(f"world {new['world']}, {len(got)} steps against {len(want)}; first differing steps {diff}")
print(f"{len(got)} losses")
EOF
}
tiny="--preset tiny --seq 16 --batch 2 --eval-every 0 --quiet"
# the reference: the same run under mpirun; OMP_NUM_THREADS as the batch script sets it from
# --cpus-per-task (the fast kernels' bits depend on the thread count)
reference() {  # name stage flags
  OMP_NUM_THREADS=1 timeout 300 mpirun -np 4 "$bin/$2" $3 --save-model "$dir/ref/$1.model" \
    --log-json "$dir/ref/$1.json" >"$dir/ref/$1.log" 2>&1
}

# stage0_ddp and stage3 on 4 tasks against mpirun -np 4: the same losses, the same model file
for stage in stage0_ddp stage3; do
  flags="$tiny --steps 30"
  reference "$stage" "$stage" "$flags"
  t0=$SECONDS
  id=$(submit "$stage" "$stage" "$flags" 10)
  if ! [[ "$id" =~ ^[0-9]+$ ]]; then fail "${stage}_equals_mpirun" "sbatch refused: $id"; continue; fi
  why=$(wait_job "$id" 180) || { fail "${stage}_equals_mpirun" "$why"; scancel "$id"; continue; }
  took=$((SECONDS - t0))
  run=$dir/runs/$stage
  losses=$(same_losses "$run/report.json" "$dir/ref/$stage.json" 2>&1)
  if [ "$(job_field "$id" JobState)" = COMPLETED ] && cmp -s "$run/final.model" "$dir/ref/$stage.model" &&
     grep -q 'losses$' <<<"$losses"; then
    pass "${stage}_equals_mpirun (job $id, srun --mpi=pmi2, 4 tasks: $losses and the model file bit for bit mpirun -np 4's; ${took} s from sbatch to the end)"
  else
    fail "${stage}_equals_mpirun" "job $id $(job_field "$id" JobState) exit $(job_field "$id" ExitCode); $losses; models: $(cmp "$run/final.model" "$dir/ref/$stage.model" 2>&1); output: $(tail -3 "$dir/jobs/$stage.out" | tr '\n' ' ')"
  fi
done

# the requeue: stage3 requeued once its step-20 checkpoint is written; the second run resumes
flags="$tiny --steps 300"
reference requeue stage3 "$flags"
t0=$SECONDS
id=$(submit requeue stage3 "$flags" 20)
ck=$dir/runs/requeue/ckpt
requeued="" why=""
if [[ "$id" =~ ^[0-9]+$ ]]; then
  for _ in $(seq 1200); do  # up to 60 s: the job starts, then writes step-20
    ls "$ck"/step-*/MANIFEST >/dev/null 2>&1 && break
    sleep 0.05
  done
  if ls "$ck"/step-*/MANIFEST >/dev/null 2>&1; then
    scontrol requeue "$id" && requeued=$(ls -d "$ck"/step-* | tail -1)
  fi
  why=$(wait_job "$id" 240) || { scancel "$id"; }
fi
took=$((SECONDS - t0))
out=$dir/jobs/requeue.out
from=$(grep -o "^resumed from [^:]*: [0-9]* of 300" "$out" 2>/dev/null | head -1)
n=$(grep -o ': [0-9]* of' <<<"$from" | tr -dc 0-9)
losses=$(same_losses "$dir/runs/requeue/report.json" "$dir/ref/requeue.json" "$((${n:-0} + 1))" 2>&1)
if [ -n "$requeued" ] && [ -z "$why" ] && [ "$(job_field "$id" JobState)" = COMPLETED ] &&
   grep -q "DUE TO JOB REQUEUE" "$out" && grep -q "(requeued 1 times)" "$out" && [ -n "$n" ] && [ "$n" -gt 0 ] && [ "$n" -lt 300 ] &&
   cmp -s "$dir/runs/requeue/final.model" "$dir/ref/requeue.model" && grep -q 'losses$' <<<"$losses"; then
  pass "requeue_resumes_same_model (job $id requeued after ${requeued##*/}, its second run resumed at step $n of 300: the model file bit for bit the uninterrupted mpirun -np 4 run's, its $losses too; ${took} s with the requeue's wait)"
else
  fail requeue_resumes_same_model "job '$id' requeued after '${requeued##*/}' ${why}; state $(job_field "$id" JobState) restarts $(job_field "$id" Restarts); '$from'; $losses; models: $(cmp "$dir/runs/requeue/final.model" "$dir/ref/requeue.model" 2>&1); output: $(grep -v '^step' "$out" 2>/dev/null | tail -4 | tr '\n' ' ')"
fi

# the time limit: --time=1 with the script's --signal=B:USR1@S, S = 50 s (slurmctld looks every 30 s,
# so the signal comes 10 to 40 s into the run); the script requeues the job, and its next run
# resumes. The run is longer than the limit: the check cancels it once the second run has resumed.
t0=$SECONDS
id=$(submit time_limit stage3 "$tiny --steps 100000000" 50 --time=1 --signal=B:USR1@50)
out=$dir/jobs/time_limit.out
resumed=""
if [[ "$id" =~ ^[0-9]+$ ]]; then
  for _ in $(seq 600); do  # up to 120 s
    resumed=$(grep -o "^resumed from [^:]*: [0-9]* of" "$out" 2>/dev/null | head -1)
    [ -n "$resumed" ] && break
    sleep 0.2
  done
  scancel "$id"
  wait_job "$id" 30 >/dev/null
fi
took=$((SECONDS - t0))
if [ -n "$resumed" ] && grep -q "the time limit is near: requeueing job $id" "$out" && grep -q "(requeued 1 times)" "$out" &&
   ! grep -q "DUE TO TIME LIMIT" "$out"; then
  pass "time_limit_signal_requeues (job $id, --time=1: SIGUSR1 before the limit, requeued by the script, its next run resumed at step $(tr -dc 0-9 <<<"${resumed##*: }"); ${took} s)"
else
  fail time_limit_signal_requeues "job '$id', ${took} s; resumed: '$resumed'; output: $(grep -v '^step' "$out" 2>/dev/null | tail -4 | tr '\n' ' ')"
fi

# ---- bad input under Slurm ----
# job_one_line NAME WORDS ID: the job failed with exit code 2 and its output is one line holding WORDS
job_one_line() {
  local why out
  why=$(wait_job "$3" 60) || { fail "$1" "$why"; scancel "$3"; return; }
  out=$(cat "$dir/jobs/$1.out" 2>/dev/null)
  if [ "$(job_field "$3" ExitCode)" = 2:0 ] && [ "$(grep -c . <<<"$out")" = 1 ] && grep -q -- "$2" <<<"$out"; then
    pass "$1 ($out)"
  else fail "$1" "exit $(job_field "$3" ExitCode), want 2:0 and one line with '$2'; got: $(head -c 300 <<<"$out")"; fi
}
job_one_line bad_stage_one_line "STAGE=stage9 is not a trainer" "$(submit bad_stage_one_line stage9 "$tiny" 10)"
job_one_line bad_mpi_plugin_one_line "MPI=pmi1: this cluster's srun offers" "$(MPI=pmi1 submit bad_mpi_plugin_one_line stage3 "$tiny" 10)"
out=$(submit bad_partition stage3 "$tiny" 10 --partition=nosuch)
if [ -z "$(squeue -h 2>/dev/null)" ] && grep -qi "invalid partition" <<<"$out" && ! [[ "$out" =~ ^[0-9]+$ ]]; then
  pass "bad_partition_refused_at_submission ($(head -1 <<<"$out"))"
else fail bad_partition_refused_at_submission "sbatch said: $out; queue: $(squeue -h 2>&1)"; fi
# a job that never starts (held): the wait's time-out names squeue's reason
id=$(submit never_starts stage3 "$tiny" 10 --hold)
why=$(wait_job "$id" 3)
if [ $? = 1 ] && grep -q "did not end within 3 s: squeue says PENDING (JobHeldUser)" <<<"$why"; then pass "never_starting_job_timeout_says_why ($why)"
else fail never_starting_job_timeout_says_why "got: $why"; fi
scancel "$id" 2>/dev/null

# ---- the GPU bundle's batch script on the "gpu" partition, with a stand-in bundle: its gpu_check.sh
# records what the job gave it and whether the bundle's launcher (MPICH's hydra, here the system's)
# starts its ranks itself (fork) or through srun; the real check needs a GPU (docs/gpu.md)
fake=$dir/fake-bundle
mkdir -p "$fake"
cat >"$fake/gpu_check.sh" <<'EOF'
env | grep -E '^(OUT|HYDRA_LAUNCHER|SLURM_JOB_PARTITION|SLURM_GPUS_ON_NODE)=' | sort >"$OUT/env.txt"
mpirun -v -np 2 true 2>&1 | grep 'Launch arguments' >"$OUT/launch.txt"
echo "stand-in gpu_check.sh done"
EOF
id=$(env "$mark" BUNDLE="$fake" OUT="$dir/runs/gpu_check" sbatch --parsable --chdir="$PWD" --cpus-per-task=1 \
     --output="$dir/jobs/gpu_check.out" scripts/slurm/gpu_check.sbatch 2>&1)
why=$(wait_job "$id" 60) || scancel "$id" 2>/dev/null
envs=$(tr '\n' ' ' <"$dir/runs/gpu_check/env.txt" 2>/dev/null)
if [ -z "$why" ] && [ "$(job_field "$id" ExitCode)" = 0:0 ] && grep -q "stand-in gpu_check.sh done" "$dir/jobs/gpu_check.out" &&
   [[ "$envs" == *HYDRA_LAUNCHER=fork*SLURM_GPUS_ON_NODE=1*SLURM_JOB_PARTITION=gpu* ]] &&
   [ -s "$dir/runs/gpu_check/launch.txt" ] && ! grep -q srun "$dir/runs/gpu_check/launch.txt"; then
  pass "gpu_check_sbatch_on_gpu_partition (job $id: $envs; the launcher forks its ranks, no srun)"
else
  fail gpu_check_sbatch_on_gpu_partition "job '$id' $why exit $(job_field "$id" ExitCode); env: $envs; launch: $(head -c 200 "$dir/runs/gpu_check/launch.txt" 2>/dev/null); output: $(tail -3 "$dir/jobs/gpu_check.out" 2>/dev/null | tr '\n' ' ')"
fi

# ---- the same job across two slurmd nodes (network namespaces), against mpirun -np 4 on one ----
# Each slurmd runs in its namespace with a host name and boot id of its own, and a fresh sysfs (so
# that UCX sees that namespace's network devices; /sys/fs/cgroup, which slurmd needs, bound back).
if [ $two_ok = 1 ] && ! two_namespaces_up 2>"$dir/two_nodes.err"; then
  two_ok=0 two_why="root may not make network namespaces and veth pairs here: $(head -1 "$dir/two_nodes.err")"
fi
if [ $two_ok = 1 ]; then
  mkdir -p "$dir/cgroup"
  for n in a b; do
    env "$mark" nsenter --net=/run/netns/$two_id$n unshare --uts --mount sh -c "hostname node$n &&
      mount --bind $dir/boot_id.$n /proc/sys/kernel/random/boot_id && mount --rbind /sys/fs/cgroup $dir/cgroup &&
      mount -t sysfs sysfs /sys && mount --rbind $dir/cgroup /sys/fs/cgroup &&
      exec slurmd -D -N node$n -f $SLURM_CONF" 2>>"$dir/slurmd.node$n.log" &
    daemons+=("slurmd.node$n $!")
  done
  state=""
  for _ in $(seq 300); do
    state=$(sinfo -h -p two -o %T 2>/dev/null)
    [ "$state" = idle ] && break
    sleep 0.1
  done
  # UCX_TLS=self,tcp: with shared memory in the mix (UCX's default) the job trains and writes its model,
  # then one rank's MPI_Finalize never returns here (closing a TCP endpoint across the namespaces)
  flags="$tiny --steps 10"
  reference two_nodes stage3 "$flags"
  t0=$SECONDS
  [ "$state" = idle ] && id=$(UCX_TLS=self,tcp submit two_nodes stage3 "$flags" 5 --partition=two --nodes=2 --ntasks-per-node=2)
  why=""
  if [ "$state" != idle ]; then why="nodea and nodeb $state after 30 s: $(tail -q -n 1 "$dir"/slurmd.node?.log | tr '\n' ' ')"
  elif [[ "$id" =~ ^[0-9]+$ ]]; then why=$(wait_job "$id" 120) || scancel "$id"
  else why="sbatch said: $id"; fi
  took=$((SECONDS - t0))
  run=$dir/runs/two_nodes out=$dir/jobs/two_nodes.out
  losses=$(same_losses "$run/report.json" "$dir/ref/two_nodes.json" 2>&1)
  if [ -z "$why" ] && [ "$(job_field "$id" JobState)" = COMPLETED ] && [ "$(job_field "$id" NumNodes)" = 2 ] &&
     grep -q "4 tasks on 2 node(s)" "$out" && grep -q "needs every rank on one machine" "$out" &&
     cmp -s "$run/final.model" "$dir/ref/two_nodes.model" && grep -q 'losses$' <<<"$losses"; then
    pass "two_nodes_equal_one (job $id on nodea and nodeb, 2 tasks each, over TCP between the namespaces: $losses and the model file bit for bit mpirun -np 4's on one machine; ${took} s, $(grep -o '[0-9.]* ms/step' "$out"))"
  else
    # a job whose ranks all wrote their report but did not end: UCX's TCP teardown (openucx/ucx issue 8738)
    [ -n "$why" ] && grep -q "^ledger matches" "$out" 2>/dev/null && why+=" (the run had finished: MPI_Finalize did not return)"
    fail two_nodes_equal_one "job '$id' $why $(job_field "$id" JobState) on $(job_field "$id" NodeList); $losses; models: $(cmp "$run/final.model" "$dir/ref/two_nodes.model" 2>&1); output: $(grep -v '^step\|^rank\|^ ' "$out" 2>/dev/null | tail -3 | tr '\n' ' ')"
  fi
else
  echo "NZRESULT SKIP $check_name.two_nodes_equal_one ($two_why)" | tee -a "$results"
fi

# ---- the clean-up, checked: no daemon, no process of a job, nothing written outside build/ ----
pids="${daemons[*]#* }"
cleanup
sleep 0.5
left=""
for p in $pids; do kill -0 "$p" 2>/dev/null && left+=" $p"; done
left+=$(marked_pids | tr '\n' ' ')
left+=$(ip -o link 2>/dev/null | grep -o "$two_id[a-z0-9]*" | sort -u | tr '\n' ' ')
left+=$(ip netns list 2>/dev/null | grep -o "^$two_id[a-z]*" | tr '\n' ' ')
left+=$(grep -o " $dir[^ ]*" /proc/mounts | tr '\n' ' ')
if [ -z "${left// /}" ]; then pass "everything_stopped (daemons $pids and every job process gone, no namespace, link or mount left)"
else fail everything_stopped "still running: $left"; fi
# where Slurm and munge write by default: nothing there from this run (the packages' own files are older)
written=$(find /etc/slurm /etc/munge /var/spool/slurm* /var/lib/slurm* /var/log/slurm* /var/lib/munge \
               /var/log/munge /run/slurm* /run/munge -newer "$dir/started" 2>/dev/null | head -5)
if [ -z "$written" ]; then pass "nothing_written_outside_build (their default state, log and run folders untouched)"
else fail nothing_written_outside_build "$(tr '\n' ' ' <<<"$written")"; fi
summary
grep -q '^NZRESULT FAIL' "$results" && exit 1
exit 0
