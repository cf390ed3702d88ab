#!/usr/bin/env bash
# Does Muon learn faster than AdamW here? The final validation loss of stage0_ddp with --optimizer muon
# against AdamW on `small`, over several seeds, paired by seed (the same initialisation and data order):
# mean ± sd of each, and the paired difference Muon − AdamW with its standard error sd/√n, its 95%
# interval (Student's t, n − 1 degrees of freedom) and whether that interval leaves out 0 — the only
# thing that says the difference is more than the seed noise. Prints a markdown table (docs/muon.md,
# "Muon against AdamW"). `make muon-study`; not part of make test (minutes).
#   scripts/muon_study.sh [SEEDS] [STEPS]     (default 4 seeds, 300 steps)
# One rank: Muon's numbers are the same bits in every stage and design (tests/muon), so the rung
# changes nothing here. Both at the same rate (--lr 3e-3 for AdamW, --muon-lr and --adam-lr default to
# it): Muon's update is scaled to AdamW's RMS (docs/muon.md), which is what lets it share AdamW's rate.
# BIN=build/bin by default.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-build/bin}
SEEDS=${1:-4}
STEPS=${2:-300}
if ! [[ "$SEEDS" =~ ^[0-9]+$ ]] || [ "$SEEDS" -lt 2 ] || [ "$SEEDS" -gt 20 ]; then
  echo "error: SEEDS=$SEEDS, expected 2 to 20 (a paired difference needs two seeds); e.g. scripts/muon_study.sh 4 300" >&2
  exit 2
fi
if ! [[ "$STEPS" =~ ^[0-9]+$ ]] || [ "$STEPS" -lt 1 ]; then
  echo "error: STEPS=$STEPS, expected a positive number of steps; e.g. scripts/muon_study.sh 4 300" >&2
  exit 2
fi
[ -x "$BIN/stage0_ddp" ] || { echo "error: no $BIN/stage0_ddp, expected the built trainer; run make first" >&2; exit 2; }
FLAGS="--preset small --seq 64 --batch 4 --steps $STEPS --lr 3e-3 --eval-every 0 --eval-windows 64 --quiet"
out=$(mktemp)
trap 'rm -f "$out"' EXIT
cores=$(nproc --all)  # (before OMP_NUM_THREADS, which nproc reports instead)
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}  # one rank, one thread: the same speed on a shared machine
start=$(date +%s)
for s in $(seq 1 "$SEEDS"); do
  for opt in adamw muon; do
    v=$(timeout 1800 mpirun -np 1 "$BIN/stage0_ddp" $FLAGS --seed "$s" --optimizer $opt 2>&1 |
        sed -n 's/.*validation loss \([0-9.]*\).*/\1/p')
    [ -n "$v" ] || { echo "error: run failed: mpirun -np 1 $BIN/stage0_ddp $FLAGS --seed $s --optimizer $opt" >&2; exit 1; }
    echo "$opt $s $v" >>"$out"
    echo "  seed $s $opt: validation loss $v ($(( $(date +%s) - start )) s so far)" >&2
  done
done
echo "small, stage0_ddp on 1 rank, $STEPS steps of 4 x 64 tokens, --lr 3e-3, seeds 1..$SEEDS ($(date -u +%Y-%m-%d)," \
     "$cores cores, OMP_NUM_THREADS=$OMP_NUM_THREADS): final validation loss (64 windows)"
echo
echo "| optimizer | mean val loss | sd over seeds | per seed |"
echo "|---|---|---|---|"
# t's two-sided 5% point for n - 1 degrees of freedom (n = 2..20)
awk -v n="$SEEDS" '
  BEGIN { split("12.706 4.303 3.182 2.776 2.571 2.447 2.365 2.306 2.262 2.228 2.201 2.179 2.160 2.145 2.131 2.120 2.110 2.101 2.093", tc, " ") }
  { v[$1, $2] = $3 }
  END {
    for (o = 1; o <= 2; o++) {
      name = o == 1 ? "adamw" : "muon"; s = 0; ss = 0; list = ""
      for (k = 1; k <= n; k++) { x = v[name, k]; s += x; ss += x * x; list = list (k > 1 ? ", " : "") sprintf("%.4f", x) }
      mean[o] = s / n; sd = sqrt((ss - n * mean[o] * mean[o]) / (n - 1))
      printf "| %s | %.4f | %.4f | %s |\n", name == "adamw" ? "AdamW" : "Muon (+ AdamW for the rest)", mean[o], sd, list
    }
    d = 0; dd = 0
    for (k = 1; k <= n; k++) { y = v["muon", k] - v["adamw", k]; d += y; dd += y * y }
    dm = d / n; dsd = sqrt((dd - n * dm * dm) / (n - 1)); se = dsd / sqrt(n); t = tc[n - 1]
    printf "\nMuon − AdamW, paired by seed: mean %+.4f, sd %.4f, standard error %.4f; 95%% interval [%+.4f, %+.4f] " \
           "(t = %.3f, %d degrees of freedom)\n", dm, dsd, se, dm - t * se, dm + t * se, t, n - 1
    if (dm - t * se > 0 || dm + t * se < 0)
      printf "the interval leaves out 0: the difference is larger than the seed noise (%s is lower)\n", dm < 0 ? "Muon" : "AdamW"
    else
      printf "the interval holds 0: the difference is within the seed noise (no signal at %d seeds)\n", n
  }' "$out"
