"""Batcher unit tests with a model-free compute function."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
from service_fakes import batcher_config, make_batcher

from seqserve.service.core.errors import DeadlineExceeded, InferenceFailed, QueueFull, ShuttingDown
from seqserve.service.scheduling.batcher import Batcher
from seqserve.service.scheduling.plan import plan_batch


def run(coro):  # type: ignore[no-untyped-def]
    return asyncio.run(asyncio.wait_for(coro, 30))


def test_plan_batch_splits_short_from_long() -> None:
    lengths = [1, 1, 1, 1, 50, 50, 50, 50]
    assert plan_batch(lengths, 0, max_rows=8, max_tokens=10_000, overhead=10) == (0, 4)
    assert plan_batch(lengths, 5, max_rows=8, max_tokens=10_000, overhead=10) == (4, 8)
    # a huge fixed cost per batch makes one full batch the cheapest
    assert plan_batch(lengths, 5, max_rows=8, max_tokens=10_000, overhead=1e6) == (0, 8)


def test_plan_batch_respects_row_and_token_limits() -> None:
    lengths = [3] * 10 + [40]
    for anchor in range(len(lengths)):
        i, j = plan_batch(lengths, anchor, max_rows=4, max_tokens=100, overhead=1e6)
        assert i <= anchor < j and j - i <= 4
        assert j - i == 1 or (j - i) * lengths[j - 1] <= 100
    assert plan_batch([500, 600], 1, max_rows=4, max_tokens=100, overhead=0) == (1, 2)


def _plan_by_loop(lengths: list[int], anchor: int, max_rows: int, max_tokens: int,
                  overhead: float) -> tuple[int, int]:
    """`plan_batch` as first written, a plain double loop: the reference it must equal."""
    n = len(lengths)
    best = [0.0] + [float("inf")] * n
    start = [0] * (n + 1)
    for j in range(1, n + 1):
        longest = lengths[j - 1]
        for i in range(j - 1, max(0, j - max_rows) - 1, -1):
            rows = j - i
            if rows > 1 and rows * longest > max_tokens:
                break
            cost = best[i] + max(overhead, 1e-6) + rows * longest
            if cost < best[j]:
                best[j], start[j] = cost, i
    j = n
    while start[j] > anchor:
        j = start[j]
    return start[j], j


def test_plan_batch_equals_the_plain_double_loop() -> None:
    """The same batch as the reference on random queues: lengths short and long, every row
    and token limit, fixed costs of none, the tie-break's and real ones (ties included)."""
    import random

    rng = random.Random(7)
    for _ in range(5000):
        n = rng.randint(1, 70)
        lengths = sorted(rng.choice([rng.randint(1, 12), rng.randint(1, 300)])
                         for _ in range(n))
        args = (lengths, rng.randrange(n), rng.choice([1, 2, 4, 8, 16, 32]),
                rng.choice([10, 100, 256, 4096, 10**6]),
                rng.choice([0, 1e-6, 10, 64.0, 1e6, rng.random() * 100]))
        assert plan_batch(*args) == _plan_by_loop(*args), args


def test_batches_close_at_max_size_and_group_by_length() -> None:
    seen: list[list[int]] = []

    def compute(rows: list[int]) -> list[int]:
        seen.append(list(rows))
        return [r * 10 for r in rows]

    async def main() -> list[int]:
        b = make_batcher(compute, max_batch_size=4, max_wait_s=0.2, max_batch_tokens=10_000)
        b.start()
        lengths = [1, 50, 2, 51, 3, 52, 4, 53]
        futs = b.submit([(n, n) for n in lengths], deadline=time.monotonic() + 10)
        out = [t.value for t in await asyncio.gather(*futs)]
        await b.close(5)
        return out

    out = run(main())
    assert out == [n * 10 for n in [1, 50, 2, 51, 3, 52, 4, 53]]
    assert sorted(map(sorted, seen)) == [[1, 2, 3, 4], [50, 51, 52, 53]]


def test_a_row_arriving_with_every_instance_idle_does_not_wait_for_company() -> None:
    """Waiting for the batch to fill only pays while an instance is busy: an idle batcher
    runs a lone row at once (max_wait_s of a minute would fail the 30 s limit of `run`)."""
    async def main() -> list[int]:
        b = make_batcher(max_batch_size=8, max_wait_s=60.0)
        b.start()
        out = [t.value for t in await asyncio.gather(*b.submit([(7, 3)], time.monotonic() + 90))]
        await b.close(5)
        return out

    assert run(main()) == [7]


def test_with_an_instance_busy_the_next_batch_waits_to_fill() -> None:
    seen: list[list[int]] = []
    gate = threading.Event()

    def compute(rows: list[int]) -> list[int]:
        seen.append(list(rows))
        if rows == [0]:
            gate.wait(10)  # instance of the first batch stays busy
        return rows

    async def main() -> None:
        b = Batcher([compute, compute], batcher_config(max_batch_size=8, max_wait_s=0.3),
                    name="test")
        b.start()
        first = b.submit([(0, 1)], time.monotonic() + 10)
        await asyncio.sleep(0.05)  # running on one instance; the other is idle
        later = []
        for i in (1, 2, 3):  # separate loop turns, well inside max_wait_s
            later += b.submit([(i, 1)], time.monotonic() + 10)
            await asyncio.sleep(0.01)
        await asyncio.gather(*later)
        gate.set()
        await asyncio.gather(*first)
        await b.close(5)

    run(main())
    assert seen == [[0], [1, 2, 3]]


def test_a_full_batch_is_handed_to_the_busy_thread_and_starts_without_the_loop() -> None:
    """While an instance computes, a full batch waiting is handed to its thread: it starts as
    soon as the first ends, though the event loop is blocked then (and could neither answer
    the first nor form the next); its rows' queue wait runs to that start."""
    starts: dict[int, float] = {}
    gate = threading.Event()

    def compute(rows: list[int]) -> list[int]:
        starts[rows[0]] = time.monotonic()
        if rows[0] == 0:
            gate.wait(10)
        return rows

    async def main() -> tuple[float, float, list[float]]:
        b = make_batcher(compute, max_batch_size=4, max_wait_s=0.0)
        b.start()
        first = b.submit([(0, 1)], time.monotonic() + 30)
        await asyncio.sleep(0.05)  # the first batch runs (held by the gate)
        second = b.submit([(i, 1) for i in range(1, 5)], time.monotonic() + 30)  # full
        await asyncio.sleep(0.05)  # the loop's turn: handed over
        released = time.monotonic()
        gate.set()
        time.sleep(0.3)  # the loop is blocked: only the thread can go on
        blocked_until = time.monotonic()
        waits = [t.timing.queue_s for t in await asyncio.gather(*first, *second)][1:]
        await b.close(5)
        return released, blocked_until, waits

    released, blocked_until, waits = run(main())
    assert released <= starts[1] < blocked_until  # started while the loop was blocked
    assert all(w >= 0.045 for w in waits)  # handed over after 0.05 s, started after the gate


def test_a_batch_not_full_is_not_handed_over_and_rows_that_left_are_not_computed() -> None:
    seen: list[list[int]] = []
    gate = threading.Event()

    def compute(rows: list[int]) -> list[int]:
        seen.append(list(rows))
        if rows[0] == 0:
            gate.wait(10)
        return rows

    async def main() -> None:
        b = make_batcher(compute, max_batch_size=4, max_wait_s=0.0)
        b.start()
        first = b.submit([(0, 1)], time.monotonic() + 30)
        await asyncio.sleep(0.05)
        two = b.submit([(1, 1), (2, 1)], time.monotonic() + 30)  # half a batch: it waits
        await asyncio.sleep(0.05)
        assert b.depth == 2
        more = b.submit([(3, 1), (4, 1)], time.monotonic() + 30)  # now full: handed over
        await asyncio.sleep(0.05)
        assert b.depth == 0
        more[1].cancel()  # its client left while the batch waited for the thread
        gate.set()
        await asyncio.gather(*first, *two, more[0])
        await b.close(5)

    run(main())
    assert seen == [[0], [1, 2, 3]]


def test_token_budget_limits_rows() -> None:
    seen: list[int] = []

    def compute(rows: list[int]) -> list[int]:
        seen.append(len(rows))
        return rows

    async def main() -> None:
        b = make_batcher(compute, max_batch_size=64, max_batch_tokens=100, max_wait_s=0.05)
        b.start()
        futs = b.submit([(i, 30) for i in range(7)], deadline=time.monotonic() + 10)
        await asyncio.gather(*futs)
        await b.close(5)

    run(main())
    assert max(seen) <= 3 and sum(seen) == 7  # 3 x 30 <= 100 < 4 x 30


def test_queue_full_rejects_whole_request_and_bound_holds() -> None:
    gate = threading.Event()

    def compute(rows: list[int]) -> list[int]:
        gate.wait(10)
        return rows

    async def main() -> None:
        b = make_batcher(compute, max_batch_size=1, queue_size=4, max_wait_s=0.0)
        b.start()
        first = b.submit([(0, 1)], deadline=time.monotonic() + 10)
        await asyncio.sleep(0.05)  # first row is computing, queue empty
        futs = b.submit([(i, 1) for i in range(4)], deadline=time.monotonic() + 10)
        with pytest.raises(QueueFull) as err:
            b.submit([(9, 1)], deadline=time.monotonic() + 10)
        assert err.value.retry_after is not None and err.value.status == 429
        assert b.depth == 4 and b.max_depth_seen == 4
        gate.set()
        await asyncio.gather(*first, *futs)
        await b.close(5)

    run(main())


def test_deadline_passed_in_queue_is_dropped_before_compute() -> None:
    computed: list[int] = []
    gate = threading.Event()

    def compute(rows: list[int]) -> list[int]:
        gate.wait(10)
        computed.extend(rows)
        return rows

    async def main() -> None:
        b = make_batcher(compute, max_batch_size=1, max_wait_s=0.0)
        b.start()
        slow = b.submit([(1, 1)], deadline=time.monotonic() + 10)
        await asyncio.sleep(0.05)
        late = b.submit([(2, 1)], deadline=time.monotonic() + 0.05)
        await asyncio.sleep(0.1)
        gate.set()
        await asyncio.gather(*slow)
        with pytest.raises(DeadlineExceeded):
            await late[0]
        await b.close(5)

    run(main())
    assert computed == [1]


def test_cancelled_rows_never_reach_compute() -> None:
    computed: list[int] = []
    gate = threading.Event()

    def compute(rows: list[int]) -> list[int]:
        gate.wait(10)
        computed.extend(rows)
        return rows

    async def main() -> None:
        b = make_batcher(compute, max_batch_size=8, max_wait_s=0.0)
        b.start()
        busy = b.submit([(0, 1)], deadline=time.monotonic() + 10)
        await asyncio.sleep(0.05)
        gone = b.submit([(i, 1) for i in range(1, 6)], deadline=time.monotonic() + 10)
        kept = b.submit([(99, 1)], deadline=time.monotonic() + 10)
        for f in gone:
            f.cancel()
        gate.set()
        await asyncio.gather(*busy, *kept)
        await b.close(5)
        assert b.depth == 0

    run(main())
    assert computed == [0, 99]


def test_exception_fails_only_its_batch_and_loop_continues() -> None:
    calls = {"n": 0}

    def compute(rows: list[int]) -> list[int]:
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("boom")
        return rows

    async def main() -> None:
        b = make_batcher(compute, max_batch_size=2, max_wait_s=0.0)
        b.start()
        first = b.submit([(1, 1), (2, 1)], deadline=time.monotonic() + 10)
        results = await asyncio.gather(*first, return_exceptions=True)
        assert all(isinstance(r, InferenceFailed) for r in results)
        second = b.submit([(3, 1)], deadline=time.monotonic() + 10)
        assert [t.value for t in await asyncio.gather(*second)] == [3]
        await b.close(5)

    run(main())


def test_on_the_loops_thread_batches_run_there_and_answer_as_on_threads() -> None:
    """`runtime_calls="loop"`: batches measured short compute on the event loop's own
    thread, rows are batched and answered as with a thread per instance, a failed batch
    fails only its rows, rows keep arriving between batches, and close drains."""
    threads: list[str] = []
    seen: list[list[int]] = []

    def compute(rows: list[int]) -> list[int]:
        threads.append(threading.current_thread().name)
        seen.append(list(rows))
        if 13 in rows:
            raise RuntimeError("boom")
        time.sleep(0.002)
        return [r * 10 for r in rows]

    async def main() -> str:
        b = make_batcher(compute, max_batch_size=4, max_wait_s=0.005,
                         max_batch_tokens=10_000, runtime_calls="loop")
        b.start()
        deadline = time.monotonic() + 10
        first = b.submit([(n, 1) for n in range(8)], deadline)
        await asyncio.sleep(0)  # the first batch starts: these arrive while it runs
        more = b.submit([(n, 1) for n in range(20, 26)], deadline)
        assert [t.value for t in await asyncio.gather(*first, *more)] == \
            [n * 10 for n in [*range(8), *range(20, 26)]]
        failed = await asyncio.gather(*b.submit([(13, 1)], deadline), return_exceptions=True)
        assert isinstance(failed[0], InferenceFailed)
        tail = b.submit([(n, 1) for n in range(30, 33)], deadline)
        closing = asyncio.ensure_future(b.close(10))
        assert await closing is True
        assert [t.value for t in await asyncio.gather(*tail)] == [300, 310, 320]
        return threading.current_thread().name

    loop_thread = run(main())
    # the first batch on the instance's thread (not measured yet; a batch handed over while
    # it runs waits there behind it), the later ones on the loop's
    assert threads[0] == "batch-test_0" and threads[-3:] == [loop_thread] * 3
    assert max(len(s) for s in seen) == 4 and sum(len(s) for s in seen) == 8 + 6 + 1 + 3


def test_close_drains_queued_work_and_refuses_new() -> None:
    def compute(rows: list[int]) -> list[int]:
        time.sleep(0.02)
        return rows

    async def main() -> None:
        b = make_batcher(compute, max_batch_size=2, max_wait_s=0.0)
        b.start()
        futs = b.submit([(i, 1) for i in range(10)], deadline=time.monotonic() + 10)
        closing = asyncio.ensure_future(b.close(10))
        await asyncio.sleep(0)
        with pytest.raises(ShuttingDown):
            b.submit([(99, 1)], deadline=time.monotonic() + 10)
        assert await closing is True
        assert [t.value for t in await asyncio.gather(*futs)] == list(range(10))

    run(main())
