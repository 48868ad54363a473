"""Open-loop and closed-loop load generator for the seqserve HTTP API.

Torch-free and light at import time: numpy, matplotlib (and httpx, when asked for) are imported
inside the functions that need them, so `seqserve loadtest` runs from the serving image. The
default HTTP client is a lean asyncio HTTP/1.1 client (`client.RawClient`) so that the tool can
outrun the server it measures.

Entry points: `LoadConfig` (what to run), `run_load` (one run), `run_sweep` (rising rates),
`write_results` (JSON, CSV, PNG) and `results_markdown` (a table for docs/performance.md).

    seqserve loadtest http://127.0.0.1:8000 --model langid --rate 200 --duration 30
    seqserve loadtest http://127.0.0.1:8000 --model numbers-en-fr --task translate \
        --sweep 5:50:5 --duration 20 --slo-p99 500 --out results/mt-sweep
    seqserve loadtest http://127.0.0.1:8000 --model text-lm --task generate --stream \
        --concurrency 32 --max-new-tokens 64 --duration 20 --out results/lm
    seqserve loadtest --report-md docs/perf-tables.md --from results/*/results.json
"""

from seqserve.loadtest.config import LoadConfig
from seqserve.loadtest.report import write_results
from seqserve.loadtest.runner import RunResult, run_load
from seqserve.loadtest.sweep import SweepResult, run_sweep
from seqserve.loadtest.tables import results_markdown

__all__ = [
    "LoadConfig",
    "RunResult",
    "SweepResult",
    "results_markdown",
    "run_load",
    "run_sweep",
    "write_results",
]
