#!/usr/bin/env bash
# Does ZeRO++ still learn? The final validation loss of zeropp against plain stage3 (zeropp with none
# of the three: stage3 bit for bit) over several seeds, paired by seed: mean ± sd of the difference,
# beside the spread of stage3's own loss over the seeds (what one run's noise is). Prints a
# markdown table (docs/zeropp.md, "Does it still learn?").
#   scripts/zeropp_loss_study.sh [SEEDS] [STEPS]      (default 5 seeds, 200 steps; N = 2, tiny)
#       six configurations: each technique alone, and both at three block sizes
#   scripts/zeropp_loss_study.sh --blocks FILE [SEEDS] [STEPS]   (default 8 seeds, 250 steps)
#       the block-size sweep: int8 weights alone (qwZ) and int4 gradients alone (qgZ), each at blocks
#       of 16, 128, 1024 and 8192 values (8192: one scale per rank's slice of a unit on tiny at N = 2);
#       writes every run's loss to FILE (tab-separated, the command in its first lines), which
#       docs/zeropp.md's block table and make plots' zeropp_loss_vs_block.png read
# BIN=build/bin by default.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-build/bin}
command_line="$([ "$BIN" = build/bin ] || echo "BIN=$BIN ")scripts/zeropp_loss_study.sh $*"
raw_file=""
if [ "${1:-}" = "--blocks" ]; then
  raw_file=${2:?--blocks needs a FILE for the raw table}
  shift 2
  SEEDS=${1:-8}
  STEPS=${2:-250}
  configs=("")
  names=("stage3")
  for kind in qw qg; do
    for b in 16 128 1024 8192; do
      configs+=("--${kind}z --${kind}-block $b")
      [ $kind = qw ] && names+=("qwZ int8 weights, blocks of $b") || names+=("qgZ int4 gradients, blocks of $b")
    done
  done
else
  SEEDS=${1:-5}
  STEPS=${2:-200}
  configs=("" "--qwz --qw-block 256" "--qgz --qg-block 256" "--qwz --qgz --qw-block 64 --qg-block 64"
           "--qwz --qgz --qw-block 256 --qg-block 256" "--qwz --qgz --qw-block 2048 --qg-block 2048")
  names=("stage3" "int8 weights, blocks of 256" "int4 gradients, blocks of 256" "both, blocks of 64"
         "both, blocks of 256" "both, blocks of 2048")
fi
FLAGS="--preset tiny --seq 32 --batch 8 --steps $STEPS --eval-every 0 --eval-windows 64 --quiet"
out=$(mktemp)
trap 'rm -f "$out"' EXIT
for c in "${!configs[@]}"; do
  for s in $(seq 1 "$SEEDS"); do
    v=$(mpirun -np 2 "$BIN/zeropp" $FLAGS --seed "$s" ${configs[$c]} 2>&1 | sed -n 's/.*validation loss \([0-9.]*\).*/\1/p')
    [ -n "$v" ] || { echo "error: run failed: mpirun -np 2 $BIN/zeropp $FLAGS --seed $s ${configs[$c]}" >&2; exit 1; }
    echo "$c $s $v" >>"$out"
  done
done
if [ -n "$raw_file" ]; then  # every run, for the figure and for anyone who wants another statistic
  {
    echo "# $command_line   ($(date -u +%Y-%m-%d), $(nproc) cores, $(uname -m))"
    echo "# each run: mpirun -np 2 zeropp $FLAGS --seed SEED FLAGS: final validation loss"
    printf "technique\tbits\tblock\tseed\tval_loss\tflags\n"
    while read -r c s v; do
      set -- ${configs[$c]:-none}
      case $1 in --qwz) t=qwZ; bits=8; b=$3 ;; --qgz) t=qgZ; bits=4; b=$3 ;; *) t=stage3; bits=-; b=- ;; esac
      printf "%s\t%s\t%s\t%s\t%s\t%s\n" "$t" "$bits" "$b" "$s" "$v" "${configs[$c]:-(none)}"
    done <"$out"
  } >"$raw_file.tmp"
  mv "$raw_file.tmp" "$raw_file"
fi
echo "tiny, N = 2, $STEPS steps, seeds 1..$SEEDS: final validation loss, ZeRO++ minus stage3 paired by seed"
echo
echo "| run | mean val loss | sd over seeds | mean difference to stage3 | sd of the difference | |mean| / (sd/√n) |"
echo "|---|---|---|---|---|---|"
awk -v n="$SEEDS" -v names="$(IFS='|'; echo "${names[*]}")" '
  { v[$1, $2] = $3; if ($1 > m) m = $1 }
  END {
    split(names, nm, "|")
    for (c = 0; c <= m; c++) {
      s = 0; ss = 0; d = 0; dd = 0
      for (k = 1; k <= n; k++) { x = v[c, k]; s += x; ss += x * x; y = x - v[0, k]; d += y; dd += y * y }
      mean = s / n; sd = sqrt((ss - n * mean * mean) / (n - 1))
      dm = d / n; dsd = (n > 1) ? sqrt((dd - n * dm * dm) / (n - 1)) : 0
      t = (dsd > 0) ? (dm < 0 ? -dm : dm) / (dsd / sqrt(n)) : 0
      if (c == 0) printf "| %s | %.4f | %.4f | — | — | — |\n", nm[c + 1], mean, sd
      else printf "| %s | %.4f | %.4f | %+.4f | %.4f | %.1f |\n", nm[c + 1], mean, sd, dm, dsd, t
    }
  }' "$out"
