#!/usr/bin/env bash
# `make notebooks`: Jupyter in the project's .venv, started on notebooks/, printing the URL to open.
# The first time it installs Jupyter (requirements-notebooks.txt, pinned) into .venv, beside
# requirements.txt's packages (make deps); then it serves in the foreground until Ctrl-C. Not part
# of `make test`: a server never ends by itself (the tests run the notebooks headlessly instead).
#   NOTEBOOK_IP=0.0.0.0    listen on every interface: in a container, with docker run -p 8888:8888
#   NOTEBOOK_PORT=8888     the port (another one if 8888 is taken)
set -euo pipefail
cd "$(dirname "$0")/.."
ip=${NOTEBOOK_IP:-127.0.0.1}
port=${NOTEBOOK_PORT:-8888}
if ! [[ "$port" =~ ^[0-9]+$ ]] || [ "$port" -lt 1 ] || [ "$port" -gt 65535 ]; then
  echo "error: NOTEBOOK_PORT=$port, expected a port number 1..65535; e.g. make notebooks NOTEBOOK_PORT=8889" >&2
  exit 2
fi
if ! [[ "$ip" =~ ^[0-9.]+$|^localhost$ ]]; then
  echo "error: NOTEBOOK_IP=$ip, expected an address such as 127.0.0.1 or 0.0.0.0; e.g. make notebooks NOTEBOOK_IP=0.0.0.0" >&2
  exit 2
fi
[ -x .venv/bin/pip ] || { echo "error: no .venv, expected the one make deps sets up; run make deps, then make notebooks" >&2; exit 2; }
stamp=.venv/.notebooks.stamp
if [ ! -x .venv/bin/jupyter-notebook ] || ! cat requirements.txt requirements-notebooks.txt | cmp -s - "$stamp"; then
  echo "installing Jupyter into .venv (requirements-notebooks.txt; once, a minute or two)"
  .venv/bin/pip install -q --disable-pip-version-check -r requirements.txt -r requirements-notebooks.txt
  cat requirements.txt requirements-notebooks.txt >"$stamp"
fi
args=(--no-browser --ip="$ip" --port="$port" --ServerApp.root_dir=notebooks)
[ "$(id -u)" = 0 ] && args+=(--allow-root)  # a container runs as root
echo "starting Jupyter on notebooks/ (Ctrl-C stops it); open the URL it prints, http://127.0.0.1:$port/tree?token=..."
exec .venv/bin/jupyter notebook "${args[@]}"
