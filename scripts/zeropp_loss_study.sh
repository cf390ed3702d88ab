#!/usr/bin/env bash
# Does ZeRO++ still learn? The final validation loss of zeropp against plain stage3 (zeropp with none
# of the three: stage3 bit for bit) over several seeds, paired by seed: mean ± sd of the difference,
# beside the spread of stage3's own loss over the seeds (what one run's noise is). Prints a
# markdown table (docs/zeropp.md, "Does it still learn?").
#   scripts/zeropp_loss_study.sh [SEEDS] [STEPS]      (default 5 seeds, 200 steps; N = 2, tiny)
# BIN=build/bin by default.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-build/bin}
SEEDS=${1:-5}
STEPS=${2:-200}
FLAGS="--preset tiny --seq 32 --batch 8 --steps $STEPS --eval-every 0 --eval-windows 64 --quiet"
configs=("" "--qwz --qw-block 256" "--qgz --qg-block 256" "--qwz --qgz --qw-block 64 --qg-block 64"
         "--qwz --qgz --qw-block 256 --qg-block 256" "--qwz --qgz --qw-block 2048 --qg-block 2048")
names=("stage3" "int8 weights, blocks of 256" "int4 gradients, blocks of 256" "both, blocks of 64"
       "both, blocks of 256" "both, blocks of 2048")
out=$(mktemp)
trap 'rm -f "$out"' EXIT
for c in "${!configs[@]}"; do
  for s in $(seq 1 "$SEEDS"); do
    v=$(mpirun -np 2 "$BIN/zeropp" $FLAGS --seed "$s" ${configs[$c]} 2>&1 | sed -n 's/.*validation loss \([0-9.]*\).*/\1/p')
    echo "$c $s $v" >>"$out"
  done
done
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
