#!/usr/bin/env bash
# The notebooks and `make plots` work: every notebook in notebooks/ runs headlessly from top to
# bottom without an error in any cell (nbclient, from .venv), every notebook is committed without
# outputs, the exercises' self-checks reject wrong and incomplete answers, and
# scripts/plots.py writes its five figures. Prints NZRESULT lines for tests/run_all.sh.
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

# The exercises' self-check (nzplots.check_answer): not answered yet passes quietly; a right answer
# passes, also as 5.0 for 5 or "stage0" for "stage0_ddp"; a wrong answer, a dict missing a stage, a
# stage left at None, and a list instead of a dict fail.
"$py" - <<'EOF'
import contextlib, io, sys
sys.path.insert(0, "scripts")
import nzplots as nz
truth = {"stage0_ddp": 2.0, "stage1": 2.0, "stage2": 5.0, "stage3": 12.0, "offload": 5.0}
accept = [(None, truth), (dict.fromkeys(truth), truth),
          ({"stage0_ddp": 2, "stage1": 2, "stage2": 5, "stage3": 12, "offload": 5}, truth),
          ({"stage0": 2, "stage1": 2.0, "stage2": 5, "stage3": 12, "offload": 5}, truth),
          (4, 4.0), (2.0, 2), ("grads", "grads")]
reject = [({"stage0_ddp": 2, "stage1": 2, "stage2": 5, "stage3": 12}, truth),
          ({"stage0_ddp": 2, "stage1": 2, "stage2": 5, "stage3": 12, "offload": None}, truth),
          ({"stage0_ddp": 8, "stage1": 8, "stage2": 5, "stage3": 12, "offload": 5}, truth),
          ({"stage0_ddp": 2, "stage1": 2, "stage2": 5, "stage3": 12, "offload": 5, "stage4": 0}, truth),
          ([2, 2, 5, 12, 5], truth), (5, truth), (3, 4.0), ("params", "grads")]
bad = []
for answer, t in accept:
    try:
        with contextlib.redirect_stdout(io.StringIO()):  # its messages are for the notebook reader
            nz.check_answer(answer, t, "self-check")
    except AssertionError as e:
        bad.append(f"rejected {answer!r} for {t!r}: {e}")
for answer, t in reject:
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            nz.check_answer(answer, t, "self-check")
        bad.append(f"accepted {answer!r} for {t!r}")
    except AssertionError:
        pass
for line in bad:
    print("  " + line)
print(f"NZRESULT {'FAIL' if bad else 'PASS'} notebooks.self_check_rejects_wrong_and_incomplete_answers")
EOF

# make plots, on the runs the notebooks left behind.
out=$(mktemp -d /tmp/nanozero-plots.XXXXXX)
ok=1
log=$("$py" scripts/plots.py --out "$out" 2>&1) || ok=0
for f in memory_by_category memory_vs_ranks memory_timeline comm_per_step comm_vs_accum; do [ -s "$out/$f.png" ] || ok=0; done
if [ $ok = 1 ]; then
  echo "NZRESULT PASS plots.script_writes_five_figures"
else
  echo "$log"
  echo "NZRESULT FAIL plots.script_writes_five_figures (see the output above)"
fi
rm -rf "$out"
