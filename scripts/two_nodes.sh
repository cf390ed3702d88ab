#!/usr/bin/env bash
# two_nodes.sh — two nodes on one machine: every rung trains across a real network boundary.
#
#   make two-nodes [RATE=100mbit]        (as root)
#   bash scripts/two_nodes.sh [--rate 100mbit] [--rungs stage3,zeropp]
#
# Each "node" is a network namespace with its own host name and boot id, and the two are joined by
# one veth pair, the only link between them. MPICH's launcher (hydra) starts node b's ranks through
# a small launcher script that enters b's namespace where a cluster would use ssh, so the ranks of
# one node reach the other's only over that link (MPI's shared-memory transport is refused between
# the nodes because their boot ids differ, as between two real machines).
#
# For each rung: a 4-rank run across the two nodes (ranks 0-1 on node a, 2-3 on node b) against the
# same run on one node (ZeRO++ without --hpz there with --ranks-per-node 2: qgZ's two hops follow the
# nodes), bit for bit (every step's loss and norm, the model file); and the bytes the
# kernel counted on the veth pair (both directions) beside the comm ledger's bytes sent across nodes
# (the payload: TCP/IP headers, MPI's own headers and the launcher's traffic come on top, and are
# stated). With RATE set, the link is rate-limited (tc tbf) and each rung's time per step measured.
# Prints NZRESULT lines like the project's other checks; exit 0 when every rung matched.
# Every namespace and veth pair it made is removed on every exit path.
set -uo pipefail

usage() { sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'; }
rate="" only=""
while (( $# )); do
  case $1 in
    --rungs) only=${2:-}; shift 2 || { echo "error: --rungs needs a list, e.g. --rungs stage3,zeropp" >&2; exit 2; } ;;
    --rate) rate=${2:-}; shift 2 || { echo "error: --rate needs a value, e.g. --rate 100mbit" >&2; exit 2; } ;;
    --rate=*) rate=${1#--rate=}; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "error: unknown argument '$1'; expected --rate RATE, --rungs LIST or --help" >&2; exit 2 ;;
  esac
done
if [[ -n "$rate" && ! "$rate" =~ ^[0-9]+(kbit|mbit|gbit)$ ]]; then
  echo "error: RATE '$rate' is not a tc rate; expected a number and kbit, mbit or gbit (e.g. 100mbit)" >&2
  exit 2
fi

root=$(cd "$(dirname "$0")/.." && pwd)
bin=$root/build/bin
data=$root/data/corpus.txt

skip() { echo "NZRESULT SKIP two_nodes ($1)"; exit 0; }
(( EUID == 0 )) || { echo "error: two network namespaces need root; run as root (sudo make two-nodes)" >&2; exit 2; }
for tool in ip unshare mount mpiexec python3; do
  command -v "$tool" >/dev/null || { echo "error: '$tool' not found; install it (ip: iproute2, unshare/mount: util-linux, mpiexec: mpich)" >&2; exit 2; }
done
[[ $(mpiexec --version 2>/dev/null) == *HYDRA* ]] || skip "mpiexec is not MPICH's hydra, whose --launcher-exec this uses"
[[ -x $bin/stage0_ddp ]] || { echo "error: $bin/stage0_ddp not built; run make first" >&2; exit 2; }

steps=6
common=(--preset tiny --seq 32 --batch 2 --steps $steps --eval-every 0 --quiet --data "$data" --watchdog 0)
# name | program and flags (4 ranks) [| flags of the one-node run only: the nodes the machines make]
runs=(
  "stage0_ddp|stage0_ddp"
  "stage1|stage1"
  "stage2|stage2"
  "stage3|stage3"
  "offload|offload"
  "pipeline|pipeline --pipeline 2 --accum 2"
  "infinity|infinity"
  "zeropp|zeropp --hpz 2 --qwz --qgz"
  "zeropp_flat|zeropp --hpz 2 --qwz --qgz --qgz-flat"
  "zeropp_machines|zeropp --qwz --qgz|--ranks-per-node 2"
)

# wait_run PID DIR: wait for the two-node run. MPI_Finalize over UCX's TCP transport (UCX 1.13, as in
# Debian 12) sometimes never returns once every rank has finished (openucx/ucx issue 8738: TCP stops
# progressing its endpoints before MPI flushes them). A run whose outputs are complete (the ledger
# table, printed last, is in its output) and which has not exited 20 s later is stopped and counted
# as a teardown hang, not a failure: its numbers were all written. Any other run gets 300 s.
wait_run() {
  local pid=$1 dir=$2 t=0 done_at=-1
  while kill -0 "$pid" 2>/dev/null; do
    sleep 0.5; t=$((t + 1))
    if (( done_at < 0 )) && grep -q "^ledger matches\|^ledger DIFFERS" "$dir/out.txt" 2>/dev/null; then done_at=$t; fi
    if (( (done_at >= 0 && t - done_at > 40) || t > 600 )); then
      kill -TERM -- "-$pid" 2>/dev/null; sleep 1; kill -KILL -- "-$pid" 2>/dev/null; wait "$pid" 2>/dev/null
      (( done_at >= 0 )) && { teardown=hung; hangs=$((hangs + 1)); return 0; }
      echo "timed out after 300 s" >> "$dir/out.txt"; return 1
    fi
  done
  wait "$pid"
}

hangs=0
if [[ -n "$only" ]]; then
  for want in ${only//,/ }; do
    [[ " ${runs[*]%%|*} " == *" $want "* ]] || { echo "error: --rungs names '$want'; expected some of: ${runs[*]%%|*}" >&2; exit 2; }
  done
fi
id=$$
ns_a=nz${id}a ns_b=nz${id}b veth_a=nzv${id}a veth_b=nzv${id}b
ip_a=10.213.0.1 ip_b=10.213.0.2
work=$root/build/two-nodes
cleanup() {  # deleting a namespace deletes its end of the veth pair, and so the pair
  local ns try
  for ns in "$ns_a" "$ns_b"; do
    for try in 1 2 3 4 5 6 7 8 9 10; do
      [[ -e /run/netns/$ns ]] || break
      ip netns del "$ns" 2>/dev/null || sleep 0.3   # busy while a process of the last run is leaving it
    done
    [[ -e /run/netns/$ns ]] && echo "warning: network namespace $ns is still in use; remove it with: ip netns del $ns" >&2
  done
  rm -f "$work/launch.sh" "$work/boot_id."*
}
trap cleanup EXIT
trap 'exit 130' INT TERM

rm -rf "$work"
mkdir -p "$work"
if ! { ip netns add "$ns_a" && ip netns add "$ns_b" &&
       ip link add "$veth_a" type veth peer name "$veth_b" &&
       ip link set "$veth_a" netns "$ns_a" && ip link set "$veth_b" netns "$ns_b" &&
       ip -n "$ns_a" addr add $ip_a/24 dev "$veth_a" && ip -n "$ns_b" addr add $ip_b/24 dev "$veth_b" &&
       ip -n "$ns_a" link set lo up && ip -n "$ns_b" link set lo up &&
       ip -n "$ns_a" link set "$veth_a" up && ip -n "$ns_b" link set "$veth_b" up; } 2>"$work/setup.err"; then
  skip "this machine does not let root make network namespaces and veth pairs: $(head -1 "$work/setup.err")"
fi
for n in a b; do echo "2f7e0000-0000-4000-8000-00000000000$([[ $n == a ]] && echo 1 || echo 2)" > "$work/boot_id.$n"; done

# node NAME CMD: run CMD as node NAME would: its namespace, its host name, its boot id.
enter_node='hostname "$0" && mount --bind "$1" /proc/sys/kernel/random/boot_id && exec /bin/sh -c "$2"'
cat > "$work/launch.sh" <<EOF
#!/bin/sh
# hydra calls this as it would call ssh: [ssh options] HOST COMMAND...
while [ "\${1#-}" != "\$1" ]; do shift; done
host=\$1; shift
case \$host in
  $ip_a) ns=$ns_a name=nodea boot=$work/boot_id.a ;;
  $ip_b) ns=$ns_b name=nodeb boot=$work/boot_id.b ;;
  *) echo "two_nodes: the host file names '\$host', which is neither node ($ip_a, $ip_b)" >&2; exit 2 ;;
esac
exec ip netns exec "\$ns" unshare --uts --mount /bin/sh -c '$enter_node' "\$name" "\$boot" "\$*"
EOF
chmod +x "$work/launch.sh"
if ! ip netns exec "$ns_a" unshare --uts --mount /bin/sh -c "$enter_node" nodea "$work/boot_id.a" true \
     2>"$work/setup.err"; then
  skip "a node's own host name and boot id cannot be set here: $(head -1 "$work/setup.err")"
fi
if [[ -n "$rate" ]]; then
  for end in "$ns_a $veth_a" "$ns_b $veth_b"; do
    set -- $end
    ip -n "$1" link set "$2" mtu 1500
    tc -n "$1" qdisc add dev "$2" root tbf rate "$rate" burst 64kb latency 500ms 2>"$work/setup.err" ||
      { echo "error: tc could not limit the link to $rate: $(head -1 "$work/setup.err")" >&2; exit 2; }
  done
fi

counter() { ip netns exec "$1" cat "/sys/class/net/$2/statistics/$3"; }
link_bytes() { echo $(( $(counter "$ns_a" "$veth_a" tx_bytes) + $(counter "$ns_b" "$veth_b" tx_bytes) )); }
link_packets() { echo $(( $(counter "$ns_a" "$veth_a" tx_packets) + $(counter "$ns_b" "$veth_b" tx_packets) )); }

fail=0
printf '%-11s %-6s %14s %14s %9s %8s %9s %12s %9s\n' rung equal "ledger across" "link bytes" packets "link/led" "ms/step" "link ms/step" teardown > "$work/table.txt"
for entry in "${runs[@]}"; do
  name=${entry%%|*}; rest=${entry#*|}; read -r -a prog <<< "${rest%%|*}"
  one_only=(); [[ $rest == *"|"* ]] && read -r -a one_only <<< "${rest#*|}"
  [[ -z "$only" || ",$only," == *",$name,"* ]] || continue
  one=$work/$name.one two=$work/$name.two
  mkdir -p "$one" "$two"
  if ! timeout 300 mpiexec -n 4 "$bin/${prog[0]}" "${prog[@]:1}" "${one_only[@]}" "${common[@]}" --log-json "$one/report.json" \
       --save-model "$one/model.bin" > "$one/out.txt" 2>&1; then
    echo "NZRESULT FAIL two_nodes.$name (the one-node run failed: $(grep -m1 -i error "$one/out.txt"))"; fail=1; continue
  fi
  b0=$(link_bytes) p0=$(link_packets)
  # the launcher runs on node a; the host list puts ranks 0-1 on a and 2-3 on b
  launch=(mpiexec -hosts "$ip_a:2,$ip_b:2" -launcher ssh -launcher-exec "$work/launch.sh" -iface "$veth_a" -n 4
          "$bin/${prog[0]}" "${prog[@]:1}" "${common[@]}" --log-json "$two/report.json" --save-model "$two/model.bin")
  teardown=ok
  setsid ip netns exec "$ns_a" unshare --uts --mount /bin/sh -c "$enter_node" nodea "$work/boot_id.a" \
    "$(printf '%q ' "${launch[@]}")" > "$two/out.txt" 2>&1 &
  job=$!
  if ! wait_run "$job" "$two"; then
    echo "NZRESULT FAIL two_nodes.$name (the run across two nodes failed: $(grep -m1 -iE 'error|fatal' "$two/out.txt"))"
    fail=1; continue
  fi
  bytes=$(( $(link_bytes) - b0 )) packets=$(( $(link_packets) - p0 ))
  verdict=$(python3 - "$one" "$two" <<'EOF'
import json, sys, filecmp
one, two = sys.argv[1], sys.argv[2]
a, b = (json.load(open(d + "/report.json")) for d in (one, two))
keys = ("step", "loss", "grad_norm")
la = [[s.get(k) for k in keys] for s in a["steps_log"]]
lb = [[s.get(k) for k in keys] for s in b["steps_log"]]
same_model = filecmp.cmp(one + "/model.bin", two + "/model.bin", shallow=False)
across = sum(op.get("bytes_across_nodes", 0) for r in b["ranks"] for op in r["comm"].values() if isinstance(op, dict))
ms = [s["ms"] for s in b["steps_log"][1:] if "ms" in s]
print("yes" if la == lb and same_model else "no", across, round(sum(ms) / max(len(ms), 1), 1),
      "" if la == lb else "losses differ", "" if same_model else "model files differ")
EOF
)
  read -r equal across ms why <<< "$verdict"
  ratio=$(python3 -c "print(f'{$bytes / $across:.3f}' if $across else '-')")
  # with a rate limit, the link's share of a step as the bytes predict it: half the across-node bytes
  # go each way, and each direction has the rate to itself (tbf on both ends)
  link_ms=-
  if [[ -n "$rate" ]]; then
    link_ms=$(python3 -c "
u = {'kbit': 1e3, 'mbit': 1e6, 'gbit': 1e9}; r = '$rate'
bps = float(r[:-4]) * u[r[-4:]] / 8
print(f'{$across / 2 / $steps / bps * 1e3:.1f}')")
  fi
  printf '%-11s %-6s %14s %14s %9s %8s %9s %12s %9s\n' "$name" "$equal" "$across" "$bytes" "$packets" "$ratio" "$ms" "$link_ms" "$teardown" >> "$work/table.txt"
  if [[ $equal == yes && $across -gt 0 ]]; then
    echo "NZRESULT PASS two_nodes.$name (bit for bit the one-node run; ledger $across B across, link $bytes B)"
  elif [[ $equal == yes ]]; then
    echo "NZRESULT FAIL two_nodes.$name (equal, but the ledger counted 0 bytes across nodes: the nodes were not seen)"
    fail=1
  else
    echo "NZRESULT FAIL two_nodes.$name (differs from the one-node run: $why)"; fail=1
  fi
done
# ZeRO++'s nodes are the machines: a G that is not theirs, and a rank order that splits a machine's
# ranks, are each one line and exit 2 (the run stops before it trains)
refused() {  # refused NAME HOSTS PATTERN ARGS...: the two-node run of zeropp ARGS must stop with PATTERN
  local name=$1 hosts=$2 pattern=$3; shift 3
  [[ -z "$only" || ",$only," == *",zeropp,"* ]] || return 0
  local launch=(mpiexec -hosts "$hosts" -launcher ssh -launcher-exec "$work/launch.sh" -iface "$veth_a" -n 4
                "$bin/zeropp" "${common[@]}" "$@")
  local out rc
  out=$(timeout 120 ip netns exec "$ns_a" unshare --uts --mount /bin/sh -c "$enter_node" nodea "$work/boot_id.a" \
        "$(printf '%q ' "${launch[@]}")" 2>&1); rc=$?
  local line; line=$(grep -m1 "^error: " <<< "$out")
  if [[ $rc -ne 0 && "$line" == *"$pattern"* ]]; then
    echo "NZRESULT PASS two_nodes.refuses_$name ($line)"
  else
    echo "NZRESULT FAIL two_nodes.refuses_$name (exit $rc, expected a line with '$pattern'; got: ${line:-$(tail -1 <<< "$out")})"
    fail=1
  fi
}
refused hpz_not_the_machines "$ip_a:2,$ip_b:2" "the ranks run on 2 machines of 2 ranks" --hpz 4
refused ranks_of_a_machine_apart "$ip_a:1,$ip_b:1" "a machine's ranks are not consecutive" --hpz 2

echo
cat "$work/table.txt"
echo "(link bytes: Ethernet frames both ways, with TCP/IP headers, about 66 B per packet, MPI's headers and"
echo " the launcher's traffic; ledger across: the payload the ranks sent to the other node)"
[[ -n "$rate" ]] && echo "(link ms/step: the across-node bytes of a step, half each way, at $rate; ms/step: measured, steps 2-$steps)"
(( hangs )) && echo "teardown: $hangs run(s) finished and wrote everything, then hung in MPI_Finalize (UCX's TCP transport, openucx/ucx issue 8738) and were stopped"
exit $fail
