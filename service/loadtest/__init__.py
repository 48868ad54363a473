"""Open-loop and closed-loop load generator for the seqserve HTTP API.

Torch-free and light at import time: httpx, numpy and matplotlib are imported inside the
functions that need them, so `seqserve loadtest` runs from the serving image.

Entry points: `LoadConfig` (what to run), `run_load` (one run), `run_sweep` (rising rates),
`write_results` (JSON, CSV, PNG) and `results_markdown` (a table for docs/performance.md).
"""

from service.loadtest.config import LoadConfig
from service.loadtest.report import write_results
from service.loadtest.runner import RunResult, run_load
from service.loadtest.sweep import SweepResult, run_sweep
from service.loadtest.tables import results_markdown

__all__ = [
    "LoadConfig",
    "RunResult",
    "SweepResult",
    "results_markdown",
    "run_load",
    "run_sweep",
    "write_results",
]
