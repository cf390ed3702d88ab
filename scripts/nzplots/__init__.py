"""nzplots — nanoZeRO's memory and communication figures, shared by scripts/plots.py and notebooks/.

One file per notebook, on one shared part: core.py (running zero_estimate and the trainers, reading
their reports, the exercises' self-check), memory.py (01), timeline_comm.py (02, 03), inference.py
(04), pipeline.py (05), zeropp.py (06), compression.py (07), tensor.py (09), ulysses.py (10), muon.py (11).
`import nzplots as nz` gives them all.

Nothing here re-implements a formula: the formula lines come from `zero_estimate --json` (which
calls common/zero_formulas.h), the measured points from the trainers' JSON reports (--log-json:
the memory ledger of every rank, its timeline, and the elements each step sent), and for inference
from build/bin/generate's --bench table and `stats:` line.

    import nzplots as nz
    reports = nz.run_stages(worlds=[1, 2, 3, 4])   # {(stage, N): report}, small-preset runs
    nz.fig_categories(reports, world=4).savefig("memory_by_category.png")
    nz.fig_comm_vs_accum(world=4).savefig("comm_vs_accum.png")  # formulas only, no runs needed

Binaries are found in $NZ_BIN_DIR, else build/bin; reports are cached in $NZ_RUNS_DIR, else
runs/reports (a report is reused only if the command and the trainer binary are unchanged).
"""
from .core import *  # noqa: F401,F403
from .memory import *  # noqa: F401,F403
from .timeline_comm import *  # noqa: F401,F403
from .inference import *  # noqa: F401,F403
from .pipeline import *  # noqa: F401,F403
from .zeropp import *  # noqa: F401,F403
from .compression import *  # noqa: F401,F403
from .tensor import *  # noqa: F401,F403
from .muon import *  # noqa: F401,F403
from .ulysses import *  # noqa: F401,F403
