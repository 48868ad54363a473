"""Live counters of a run and the once-a-second progress line."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from seqserve.loadtest.records import RequestRecord

ProgressFn = Callable[[str], None]


class LiveStats:
    """Counters updated as requests go out and come back."""

    def __init__(self) -> None:
        self.scheduled = 0
        self.sent = 0
        self.ok = 0
        self.shed = 0
        self.errors = 0
        self.dropped = 0
        self._ok_latencies: list[float] = []  # seconds, in completion order

    def on_scheduled(self, record: RequestRecord) -> None:
        self.scheduled += 1
        if record.outcome == "dropped":
            self.dropped += 1

    def on_sent(self) -> None:
        self.sent += 1

    def on_done(self, record: RequestRecord) -> None:
        if record.outcome == "ok":
            self.ok += 1
            if record.latency_s is not None:
                self._ok_latencies.append(record.latency_s)
            return
        self.errors += 1
        if record.outcome == "shed":
            self.shed += 1

    def p99_ms(self) -> float | None:
        """p99 (nearest rank) of successful latencies so far."""
        lat = sorted(self._ok_latencies)  # once a second: cheap next to the requests
        if not lat:
            return None
        return lat[min(len(lat) - 1, int(0.99 * len(lat)))] * 1e3


def progress_line(live: LiveStats, elapsed: float, rate: float, label: str = "") -> str:
    """`[  3.0s] sent 300 ok 298 err 2 (shed 2) drop 0 | 99.5 req/s | p99 12.3 ms`."""
    p99 = live.p99_ms()
    p99_text = "-" if p99 is None else f"{p99:.1f} ms"
    prefix = f"{label} " if label else ""
    return (
        f"{prefix}[{elapsed:6.1f}s] sent {live.sent} ok {live.ok} err {live.errors} "
        f"(shed {live.shed}) drop {live.dropped} | {rate:.1f} req/s | p99 {p99_text}"
    )


async def report_progress(
    live: LiveStats, progress: ProgressFn, label: str = "", interval_s: float = 1.0
) -> None:
    """Print a progress line every `interval_s` until cancelled."""
    start = last_t = time.perf_counter()
    last_sent = 0
    while True:
        await asyncio.sleep(interval_s)
        now = time.perf_counter()
        rate = (live.sent - last_sent) / max(now - last_t, 1e-9)
        last_t, last_sent = now, live.sent
        progress(progress_line(live, now - start, rate, label))
