"""The request path's metrics are added up over an event-loop turn and written once
(`metrics.Tally`): the numbers are those of writing each increment at once."""

from __future__ import annotations

import asyncio
import math
import threading

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from seqserve.service.core.metrics import Metrics, Tally


def _instruments() -> tuple[CollectorRegistry, Counter, Gauge, Histogram]:
    r = CollectorRegistry()
    return (r, Counter("c", "c", ["m"], registry=r), Gauge("g", "g", ["m"], registry=r),
            Histogram("h", "h", ["m"], registry=r, buckets=(0.1, 0.5, 1.0)))


def _samples(text: bytes) -> list[bytes]:
    """The exposition's lines but the series' creation times."""
    return [line for line in text.splitlines() if b"_created" not in line]


class _Counting:
    """A series value that counts its writes."""

    def __init__(self) -> None:
        self.writes = 0
        self.total = 0.0

    def inc(self, amount: float = 1.0) -> None:
        self.writes += 1
        self.total += amount


def test_a_turns_increments_are_one_write_each_and_equal_to_writing_them_at_once() -> None:
    amounts = [0.05, 0.1, 0.2, 0.5, 0.7, 1.0, 3.0, math.inf, -1.0, 0.0, math.nan]
    direct, d_counter, d_gauge, d_hist = _instruments()
    for a in amounts:
        d_counter.labels("x").inc(2)
        d_gauge.labels("x").inc()
        d_gauge.labels("x").dec()
        d_gauge.labels("y").set(a)
        d_hist.labels("x").observe(a)
    tallied, t_counter, t_gauge, t_hist = _instruments()
    tally = Tally()
    counting = _Counting()
    seen: dict[str, bytes] = {}

    async def turn() -> None:
        for a in amounts:
            tally.inc(t_counter.labels("x"), 2)
            tally.inc(t_gauge.labels("x"))
            tally.inc(t_gauge.labels("x"), -1.0)
            tally.set(t_gauge.labels("y"), a)
            tally.observe(t_hist.labels("x"), a)
            tally.inc(counting, 1.0)
        seen["during"] = generate_latest(tallied)
        await asyncio.sleep(0)  # the turn ends: its flush runs
        seen["after"] = generate_latest(tallied)

    asyncio.run(turn())
    assert counting.writes == 1 and counting.total == len(amounts)
    assert b'c_total{m="x"} 0.0' in seen["during"]  # nothing written within the turn
    assert _samples(seen["after"]) == _samples(generate_latest(direct))


def test_a_thread_without_a_loop_writes_at_once() -> None:
    tally, counting = Tally(), _Counting()

    def work() -> None:
        for _ in range(3):
            tally.inc(counting, 2.0)

    t = threading.Thread(target=work)
    t.start()
    t.join()
    assert (counting.writes, counting.total) == (3, 6.0)


def test_the_exposition_writes_what_is_pending() -> None:
    metrics = Metrics()

    async def turn() -> bytes:
        for _ in range(5):
            metrics.on_request("m", "classify", 200, 0.02)
        return metrics.exposition()[0]

    text = asyncio.run(turn()).decode()
    assert 'seqserve_requests_total{endpoint="classify",model="m",status="200"} 5.0' in text
    assert 'seqserve_request_duration_seconds_count{endpoint="classify",model="m"} 5.0' in text


def test_what_a_closed_loop_left_is_written_when_another_loop_counts() -> None:
    first, then = _Counting(), _Counting()
    tally = Tally()
    loop = asyncio.new_event_loop()

    async def count(target: _Counting) -> None:
        tally.inc(target, 3.0)

    async def count_and_stop() -> None:
        await count(first)
        loop.stop()  # the loop ends with this turn: its end's flush never runs

    loop.create_task(count_and_stop())
    loop.run_forever()
    loop.close()
    assert first.writes == 0

    async def later() -> None:
        await count(then)
        await asyncio.sleep(0)

    asyncio.run(later())
    assert (first.total, then.total) == (3.0, 3.0)
