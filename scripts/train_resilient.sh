#!/usr/bin/env bash
# train_resilient.sh — run a training job, and when it fails, relaunch it from its newest valid
# checkpoint (docs/checkpoints.md).
#
#   scripts/train_resilient.sh [--restarts R] -- mpirun -np N build/bin/<stage> ... --ckpt-dir DIR ...
#
# The first launch runs the command as given: a --resume in it (a checkpoint to start from) is
# respected; without one it gets --resume auto (the newest valid checkpoint in --ckpt-dir, or step 0
# when there is none). Every relaunch gets --resume auto in place of the user's --resume: it goes
# on from the newest valid checkpoint this job wrote. --steps stays the total, so the relaunched
# job ends where the first one would have, with the same model, bit for bit. A job that fails again
# is relaunched up to R times (default 3). Exit code 2 is bad input, which a relaunch cannot fix:
# it is passed on at once. Exit code: the last launch's. A SIGTERM, SIGINT or SIGHUP to this script
# ends the job it runs (mpirun gets the signal and ends its ranks, which frees --ckpt-dir), is not
# relaunched, and exits with 128 + the signal's number.
set -u
restarts=3
usage="usage: train_resilient.sh [--restarts R] -- COMMAND..."
while [ $# -gt 0 ]; do
  case "$1" in
    --restarts)
      case "${2-}" in
        ''|-*) echo "train_resilient.sh: --restarts needs a number (relaunches allowed), e.g. --restarts 3; $usage" >&2; exit 2 ;;
      esac
      restarts=$2; shift 2 ;;
    --) shift; break ;;
    -h|--help) sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "train_resilient.sh: unknown option $1; $usage" >&2; exit 2 ;;
  esac
done
case "$restarts" in ''|*[!0-9]*) echo "train_resilient.sh: --restarts $restarts: expected a whole number >= 0" >&2; exit 2 ;; esac
[ $# -gt 0 ] || { echo "train_resilient.sh: no command; $usage" >&2; exit 2; }
case " $* " in
  *" --ckpt-dir "*|*" --ckpt-dir="*) ;;
  *) echo "train_resilient.sh: the command needs --ckpt-dir DIR (where the checkpoints to restart from go)" >&2; exit 2 ;;
esac

original=("$@")
# The relaunch command: the user's one without its --resume (both spellings), with --resume auto.
relaunch=() user_resume=0
while [ $# -gt 0 ]; do
  case "$1" in
    --resume) user_resume=1; shift; [ $# -gt 0 ] && shift ;;
    --resume=*) user_resume=1; shift ;;
    *) relaunch+=("$1"); shift ;;
  esac
done
relaunch+=(--resume auto)

# The job runs in the background and the script waits for it: bash runs a trap only between
# commands, so a job in the foreground would keep the signal from being handled until it ended by
# itself. The signal goes on to the job (mpirun ends its ranks), and the script waits for it to end.
job=""
on_signal() {  # name, number
  trap '' TERM INT HUP  # one signal is enough: the job is already ending
  if [ -n "$job" ]; then
    kill -s "$1" "$job" 2>/dev/null
    wait "$job"
  fi
  echo "train_resilient: SIG$1 received: the job was ended and is not relaunched" >&2
  exit $((128 + $2))
}
trap 'on_signal TERM 15' TERM
trap 'on_signal INT 2' INT
trap 'on_signal HUP 1' HUP

launch=1
while :; do
  if [ $launch = 1 ] && [ $user_resume = 1 ]; then
    "${original[@]}" <&0 &  # (an explicit stdin: a background job's would be /dev/null)
  else
    "${relaunch[@]}" <&0 &
  fi
  job=$!
  wait "$job"
  rc=$?
  job=""
  [ $rc = 0 ] && exit 0
  if [ $rc = 2 ]; then echo "train_resilient: exit code 2 (bad input): not relaunching" >&2; exit 2; fi
  if [ $launch -gt "$restarts" ]; then
    echo "train_resilient: launch $launch failed (exit code $rc); no restarts left (--restarts $restarts)" >&2
    exit $rc
  fi
  echo "train_resilient: launch $launch failed (exit code $rc); relaunching from the newest valid checkpoint" >&2
  launch=$((launch + 1))
done
