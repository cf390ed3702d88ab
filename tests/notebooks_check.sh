#!/usr/bin/env bash
# The notebooks and `make plots` work: every notebook in notebooks/ runs headlessly from top to
# bottom without an error in any cell (nbclient, from .venv), every notebook is committed without
# outputs, and scripts/plots.py writes its four figures. Prints NZRESULT lines for tests/run_all.sh.
# Trainers that are not built yet are skipped by the notebooks, and the skip is printed here.
# Binaries: $NZ_BIN_DIR, else build/bin. Runs go to a fresh directory shared by all notebooks.
cd "$(dirname "$0")/.."
py=.venv/bin/python
if ! "$py" -c 'import nbclient, nbformat, matplotlib' 2>/dev/null; then
  echo "NZRESULT FAIL notebooks (no .venv with nbclient, nbformat, matplotlib: run make deps)"
  exit 0
fi
NZ_RUNS_DIR=$(mktemp -d /tmp/nanozero-notebooks.XXXXXX)
export NZ_RUNS_DIR
trap 'rm -rf "$NZ_RUNS_DIR"' EXIT

"$py" - notebooks/*.ipynb <<'EOF'
import re, sys, time
import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

for path in sys.argv[1:]:
    name = path.split("/")[-1].removesuffix(".ipynb")
    nb = nbformat.read(path, as_version=4)
    # Committed without outputs: the diff of a notebook is its text, not yesterday's figures.
    dirty = [i for i, c in enumerate(nb.cells)
             if c.cell_type == "code" and (c.get("outputs") or c.get("execution_count") is not None)]
    print(f"NZRESULT {'FAIL' if dirty else 'PASS'} notebooks.{name}.committed_without_outputs"
          + (f" (cells {dirty} have outputs; clear them before committing)" if dirty else ""))
    t0 = time.time()
    try:
        NotebookClient(nb, timeout=300, kernel_name="python3",
                       resources={"metadata": {"path": "notebooks"}}).execute()
        for c in nb.cells:  # make the skipped trainers visible here too
            for o in c.get("outputs", []):
                for line in o.get("text", "").splitlines():
                    if line.startswith("not built yet"):
                        print(f"  {name}: {line}")
        print(f"NZRESULT PASS notebooks.{name} ({time.time() - t0:.1f} s)")
    except CellExecutionError as e:
        msg = re.sub(r"\x1b\[[0-9;]*m", "", str(e)).strip().splitlines()  # no terminal colours
        print("\n".join(msg[-20:]))
        print(f"NZRESULT FAIL notebooks.{name} (a cell raised {msg[-1][:200] if msg else '?'})")
    except Exception as e:  # kernel died, timeout, ...
        print(f"NZRESULT FAIL notebooks.{name} ({type(e).__name__}: {str(e)[:200]})")
EOF

# make plots, on the runs the notebooks left behind.
out=$(mktemp -d /tmp/nanozero-plots.XXXXXX)
ok=1
log=$("$py" scripts/plots.py --out "$out" 2>&1) || ok=0
for f in memory_by_category memory_vs_ranks memory_timeline comm_per_step; do [ -s "$out/$f.png" ] || ok=0; done
if [ $ok = 1 ]; then
  echo "NZRESULT PASS plots.script_writes_four_figures"
else
  echo "$log"
  echo "NZRESULT FAIL plots.script_writes_four_figures (see the output above)"
fi
rm -rf "$out"
