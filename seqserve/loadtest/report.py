"""Files of a load test: results.json, results.csv and PNG plots.

results.json (schema 2) carries the saturation verdict of its steps (`stats.saturation_verdict`:
None for closed loop) and `saturation_rps`, the peak ok throughput, only when a step saturated;
schema 1 files gave that peak for every run."""

from __future__ import annotations

import csv
import importlib.util
import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

from seqserve.loadtest.plots import write_plots
from seqserve.loadtest.records import CSV_FIELDS
from seqserve.loadtest.runner import RunResult
from seqserve.loadtest.stats import saturation_verdict

RESULTS_SCHEMA = 2


def results_payload(
    steps: list[RunResult],
    *,
    slo_p99_ms: float | None = None,
    best_rate: float | None = None,
    passed: list[bool] | None = None,
    max_error_rate: float = 0.01,
    command: str | None = None,
    label: str | None = None,
) -> dict[str, Any]:
    """The results.json document: configuration, per-step summaries and the verdict."""
    if not steps:
        raise ValueError("no steps to report")
    verdict = saturation_verdict([s.summary for s in steps], max_error_rate)
    return {
        "tool": "seqserve loadtest",
        "schema_version": RESULTS_SCHEMA,
        "label": label,
        "command": command,
        "started_at": steps[0].started_at,
        "config": asdict(steps[0].config)
        | {"rate": None if len(steps) > 1 else steps[0].config.rate},
        "rates": [s.config.rate for s in steps],
        "slo_p99_ms": slo_p99_ms,
        "best_rate": best_rate,
        "passed": passed,
        "saturation": verdict,
        "saturation_rps": verdict["peak_ok_rps"] if verdict and verdict["saturated"] else None,
        "steps": [s.summary for s in steps],
    }


def write_csv(path: Path, steps: list[RunResult]) -> None:
    """Per-request rows of every step."""
    with path.open("w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=list(CSV_FIELDS))
        writer.writeheader()
        for i, step in enumerate(steps):
            for record in step.records:
                writer.writerow(record.csv_row(step=i, offered_rate=step.config.rate))


def write_results(
    out_dir: str | Path, steps: list[RunResult], plots: bool = True, **payload_args: Any
) -> dict[str, Path]:
    """Write results.csv, the plots (by default) and results.json, which names the plots
    written (`plots`); return their paths. A single-rate run gets no plots against rate: it
    says so, and points at its latency over time."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    payload = results_payload(steps, **payload_args)
    paths = {"json": out / "results.json", "csv": out / "results.csv"}
    write_csv(paths["csv"], steps)
    if plots:
        if importlib.util.find_spec("matplotlib") is None:
            print("plots skipped: matplotlib is not installed (pip install matplotlib)")
        else:
            drawn = write_plots(out, steps, payload.get("slo_p99_ms"))
            paths |= drawn
            payload["plots"] = {key: path.name for key, path in drawn.items()}
            if "latency_plot" not in drawn:
                print("plots against rate skipped: one rate (see latency_over_time.png)")
    paths["json"].write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")
    return paths
