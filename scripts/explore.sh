#!/usr/bin/env bash
# `make explore`: serves the explorer's page (docs/explorer.md), built into DIR, until Ctrl-C, printing
# the URL to open. The page is static: the same files open from disk, so the server is only a
# convenience (python3's http.server, which serves files and runs nothing).
#   EXPLORE_IP=0.0.0.0    listen on every interface: in a container, with docker run -p 8765:8765
#   EXPLORE_PORT=8765     the port (another one if 8765 is taken)
#   bash scripts/explore.sh DIR
set -euo pipefail
dir=${1:?usage: explore.sh DIR}
ip=${EXPLORE_IP:-127.0.0.1}
port=${EXPLORE_PORT:-8765}
if ! [[ "$port" =~ ^[0-9]+$ ]] || [ "$port" -lt 1 ] || [ "$port" -gt 65535 ]; then
  echo "error: EXPLORE_PORT=$port, expected a port number 1..65535; e.g. make explore EXPLORE_PORT=8766" >&2
  exit 2
fi
if ! [[ "$ip" =~ ^[0-9.]+$|^localhost$ ]]; then
  echo "error: EXPLORE_IP=$ip, expected an address such as 127.0.0.1 or 0.0.0.0; e.g. make explore EXPLORE_IP=0.0.0.0" >&2
  exit 2
fi
if ! python3 -c 'import socket, sys; socket.socket().bind((sys.argv[1], int(sys.argv[2])))' "$ip" "$port" 2>/dev/null; then
  echo "error: EXPLORE_PORT=$port on $ip is in use or not ours to take, expected a free port; e.g. make explore EXPLORE_PORT=$((port % 65535 + 1))" >&2
  exit 2
fi
[ -f "$dir/index.html" ] || { echo "error: no page in $dir, expected the one make explorer builds; run make explore" >&2; exit 2; }
echo "the explorer: http://$([ "$ip" = 0.0.0.0 ] && echo 127.0.0.1 || echo "$ip"):$port/  (or open $dir/index.html from disk; Ctrl-C stops the server)"
cd "$dir"
python3 -m http.server --bind "$ip" "$port" 2>&1 | grep --line-buffered -v '" 200 -$\|" 304 -$'
