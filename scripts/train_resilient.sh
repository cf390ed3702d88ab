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
# it is passed on at once. Exit code: the last launch's.
set -u
restarts=3
while [ $# -gt 0 ]; do
  case "$1" in
    --restarts) restarts=${2:?--restarts needs a number}; shift 2 ;;
    --) shift; break ;;
    -h|--help) sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "train_resilient.sh: unknown option $1; usage: train_resilient.sh [--restarts R] -- COMMAND..." >&2; exit 2 ;;
  esac
done
case "$restarts" in ''|*[!0-9]*) echo "train_resilient.sh: --restarts $restarts: expected a whole number >= 0" >&2; exit 2 ;; esac
[ $# -gt 0 ] || { echo "train_resilient.sh: no command; usage: train_resilient.sh [--restarts R] -- COMMAND..." >&2; exit 2; }
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

launch=1
while :; do
  if [ $launch = 1 ] && [ $user_resume = 1 ]; then
    "${original[@]}"
  else
    "${relaunch[@]}"
  fi
  rc=$?
  [ $rc = 0 ] && exit 0
  if [ $rc = 2 ]; then echo "train_resilient: exit code 2 (bad input): not relaunching" >&2; exit 2; fi
  if [ $launch -gt "$restarts" ]; then
    echo "train_resilient: launch $launch failed (exit code $rc); no restarts left (--restarts $restarts)" >&2
    exit $rc
  fi
  echo "train_resilient: launch $launch failed (exit code $rc); relaunching from the newest valid checkpoint" >&2
  launch=$((launch + 1))
done
