"""Arrival schedules for open-loop runs."""

from __future__ import annotations

import random


def poisson_arrivals(
    rate: float, duration_s: float | None, requests: int | None, seed: int = 0
) -> list[float]:
    """Arrival offsets (seconds from start) of a Poisson process at `rate` requests/s.

    Gaps are exponential with mean 1/rate. The schedule stops at `requests` arrivals or at the
    first arrival past `duration_s`, whichever comes first.
    """
    if rate <= 0:
        raise ValueError(f"rate must be > 0, got {rate}")
    if duration_s is None and requests is None:
        raise ValueError("a schedule needs a duration or a request count")
    rng = random.Random(seed)
    out: list[float] = []
    t = 0.0
    while requests is None or len(out) < requests:
        t += rng.expovariate(rate)
        if duration_s is not None and t > duration_s:
            break
        out.append(t)
    return out


def parse_sweep(spec: str) -> list[float]:
    """`START:STOP:STEP` -> [START, START+STEP, ..., <= STOP] (rates in requests/s)."""
    parts = spec.split(":")
    if len(parts) != 3:
        raise ValueError(f"sweep must be START:STOP:STEP, got {spec!r}")
    start, stop, step = (float(p) for p in parts)
    if start <= 0 or step <= 0 or stop < start:
        raise ValueError(f"sweep needs 0 < START <= STOP and STEP > 0, got {spec!r}")
    count = int((stop - start) / step + 1e-9) + 1
    return [round(start + i * step, 9) for i in range(count)]
