"""Sweep: open-loop runs at rising rates, the highest rate whose p99 meets the SLO, and where
the server saturated (`stats.saturated`: load refused or dropped past the error budget, or ok
answers slower than the arrivals) if it did."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from seqserve.loadtest.config import LoadConfig
from seqserve.loadtest.live import ProgressFn
from seqserve.loadtest.runner import RunResult, run_load
from seqserve.loadtest.stats import meets_slo, saturation_verdict
from seqserve.loadtest.texts import TextSampler


@dataclass
class SweepResult:
    """The steps of a sweep and what they say."""

    steps: list[RunResult]
    slo_p99_ms: float | None
    best_rate: float | None
    """Highest offered rate that met the SLO (None: no SLO given, or no step met it)."""
    passed: list[bool]
    """Per step: met the SLO (all False without an SLO)."""
    saturation: dict[str, Any] | None = None
    """`stats.saturation_verdict` of the steps."""

    @property
    def saturation_rps(self) -> float | None:
        """Best ok throughput of any step when the sweep saturated the server, else None."""
        if not self.saturation or not self.saturation["saturated"]:
            return None
        return float(self.saturation["peak_ok_rps"])


def run_sweep(
    cfg: LoadConfig,
    rates: list[float],
    sampler_factory: type[TextSampler] | None = None,
    texts: list[str] | None = None,
    slo_p99_ms: float | None = None,
    max_error_rate: float = 0.01,
    stop_after_failures: int = 1,
    progress: ProgressFn | None = None,
) -> SweepResult:
    """Run `cfg` at each rate in order.

    With an SLO, the sweep stops after `stop_after_failures` consecutive failing steps (past
    saturation more load only grows the queue). Each step gets a fresh text sampler with the
    run's seed, so every step replays the same texts.
    """
    if not rates:
        raise ValueError("a sweep needs at least one rate")
    if texts is None:
        raise ValueError("a sweep needs the request texts")
    make = sampler_factory or TextSampler
    steps: list[RunResult] = []
    passed: list[bool] = []
    failures = 0
    for i, rate in enumerate(rates):
        label = f"step {i + 1}/{len(rates)} @ {rate:g}/s"
        if progress is not None:
            progress(f"-- {label}")
        step = run_load(cfg.with_rate(rate), make(texts, cfg.seed), progress, label)
        ok = slo_p99_ms is not None and meets_slo(step.summary, slo_p99_ms, max_error_rate)
        steps.append(step)
        passed.append(ok)
        failures = 0 if ok else failures + 1
        if slo_p99_ms is not None and failures >= stop_after_failures:
            break
    best = max(
        (s.config.rate or 0.0 for s, ok in zip(steps, passed, strict=True) if ok), default=None
    )
    verdict = saturation_verdict([s.summary for s in steps], max_error_rate)
    return SweepResult(steps, slo_p99_ms, best, passed, verdict)
