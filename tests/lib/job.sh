# job.sh — finding a running job's ranks and waiting for its checkpoints, for the checks that stop or
# kill ranks (tests/checkpoint/fault_check.sh, signal_check.sh), sourced after setting $bin (the
# trainers' folder):
#   rank_pid PATTERN RANK PROGRAM      the pid of rank RANK (PMI_RANK) of the job whose command line
#                                      holds PATTERN (a path unique to that job), running $bin/PROGRAM
#   wait_for_checkpoint DIR STEP POLLS   until a complete checkpoint of STEP or later is in DIR
#                                      (its MANIFEST written), POLLS times every 0.05 s; 1 if none in time
rank_pid() {
  local p
  for p in $(pgrep -f -- "$1"); do
    [ "$(tr '\0' '\n' </proc/$p/cmdline 2>/dev/null | head -1)" = "$bin/$3" ] || continue
    tr '\0' '\n' </proc/$p/environ 2>/dev/null | grep -qx "PMI_RANK=$2" && { echo $p; return; }
  done
}
wait_for_checkpoint() {
  local m s
  for _ in $(seq "$3"); do
    for m in "$1"/step-*/MANIFEST; do
      s=${m%/MANIFEST}; s=${s##*/step-}
      [ -e "$m" ] && [ $((10#$s)) -ge "$2" ] && return 0
    done
    sleep 0.05
  done
  return 1
}
