"""Dynamic batcher: one per model, model-free, one asyncio task owns the queue.

Callers `submit` rows (payload + token length) and await futures. The loop task waits for the
first row and, while another instance is busy, lets more arrive until the batch is full (max
rows, or rows x longest row at the token budget) or the oldest row has waited `max_wait_s`
(with every instance idle it does not wait: a lone request at low load pays no `max_wait_s`,
and under load rows gather while the instances are busy), then takes the oldest row plus its
nearest neighbours by length among the oldest few batches' worth of rows (a contiguous window
of those, sorted by length, so padding stays small and the queue is served nearly in order),
drops rows whose client left or whose deadline passed, and runs `compute` in a thread.
An exception fails that batch's rows only; the loop goes on.

Each runtime instance has its own thread, fed by a queue; the thread hands a finished batch
back with one `call_soon_threadsafe` that answers its rows (measured with py-spy in the engine
under load: `run_in_executor`'s concurrent future, its chaining to an asyncio future and the
task step that resumed the batch cost more than the hand-back itself).

Which rows: the queue's oldest rows (`PLAN_AGE` batches' worth), sorted by length, are split
into contiguous groups that minimise the total cost sum(overhead + rows x longest) under the
row and token limits (`plan_batch`); the group holding the oldest row runs. A padded model
pays rows x longest row, so this trades padding against the fixed cost of a batch instead of
always filling batches to the top.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
import math
import time
import weakref
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, Literal, TypeVar

from seqserve.service.core.errors import DeadlineExceeded, InferenceFailed, QueueFull, ShuttingDown
from seqserve.service.scheduling.base import (
    Admission,
    BatchCost,
    CostEstimate,
    NullObserver,
    Observer,
    Timed,
    Timing,
    WaitMargin,
    admit_by_wait,
)
from seqserve.service.scheduling.lanes import JobLane
from seqserve.service.scheduling.plan import PLAN_AGE, plan_batch, plan_window

log = logging.getLogger("seqserve.batcher")

P = TypeVar("P")
R = TypeVar("R")

PROBE_DEADLINE_S = 60.0
"""Deadline of rows computed for no one after a stale refusal (they only measure)."""


def _ignore(future: asyncio.Future[Any]) -> None:
    """Retrieve a probe's outcome: no one waits for it."""
    if not future.cancelled():
        future.exception()


@dataclass(eq=False)
class _Row(Generic[P, R]):
    payload: P
    length: int
    deadline: float  # time.monotonic() seconds
    future: asyncio.Future[Timed[R]]
    enqueued: float = field(default_factory=time.monotonic)
    queued: bool = True  # counted in the batcher's live depth
    admission: Admission | None = None  # its request's (None: a probe)


@dataclass(frozen=True, kw_only=True)
class BatcherConfig:
    """Limits of one batcher (the server's come from its settings through
    `EngineOptions.model_config`; no defaults here that could disagree with them)."""

    max_batch_size: int
    """Most rows per batch."""
    max_batch_tokens: int
    """Padded-token budget per batch: rows x longest row."""
    max_wait_s: float
    """Longest the oldest row waits for the batch to fill while another instance is busy."""
    queue_size: int
    """Most rows waiting; a submit that would exceed it raises QueueFull."""
    retry_after_s: float
    """Retry-After of QueueFull / ShuttingDown."""
    max_queue_wait_s: float | None
    """Admission by expected wait: rows whose expected queue wait (the tokens ahead of them
    from the batches they fill and their tokens, at the recently measured fixed cost per batch
    and cost per token) exceeds this, or their deadline, are refused
    at once (QueueFull, Retry-After = the backlog's drain time); None: the depth bound only."""
    overhead_tokens: float
    """Fixed cost of starting one batch, in padded-token units: how much padding length
    grouping accepts to run fewer, larger batches (0: only equal lengths share a batch)."""
    runtime_calls: Literal["loop", "threads"] = "threads"
    """Where a batch's compute runs: on a thread per instance, or on the event loop's own
    thread (lanes.py `JobLane`; the server's `--runtime-calls`)."""


class Batcher(Generic[P, R]):
    """Batches rows for `compute(payloads) -> results` (one result per payload, same order).

    With several computes (model instances, each its own runtime session) up to that many
    batches run at once, each on its own thread; a batch is formed when an instance is free,
    so it holds everything that arrived while the instances were busy. While an instance
    computes and a full batch waits, that batch is handed to its thread too, to start as soon
    as the one it runs ends: the thread goes from batch to batch without waiting for the event
    loop to answer the first and form the next. (Without it an instance idled for a loop turn
    or two after every batch; a loop busy with refusals made those turns long, the measured
    cost of a batch grew with them, admission refused more, and the refusals kept the loop
    busy: a closed loop of 128 clients that resend at once refused ~14,000 requests a second
    and served a fifth of the capacity, docs/performance.md section 29.) A row handed over
    whose deadline passes or whose client leaves before its batch starts is not computed.
    """

    def __init__(
        self,
        compute: Callable[[list[P]], Sequence[R]] | Sequence[Callable[[list[P]], Sequence[R]]],
        config: BatcherConfig,
        *,
        name: str = "model",
        observer: Observer | None = None,
    ) -> None:
        self.computes = list(compute) if isinstance(compute, Sequence) else [compute]
        self.config = config
        self.name = name
        self.observer: Observer = observer or NullObserver()
        self._pending: deque[_Row[P, R]] = deque()
        self._live = 0  # pending rows whose future is not done (cancelled rows leave at once)
        self._wake = asyncio.Event()
        self._closing = False
        self._task: asyncio.Task[None] | None = None
        self._free = deque(range(len(self.computes)))  # idle instances
        self._freed = asyncio.Event()
        self._running: set[asyncio.Future[None]] = set()
        """One future per batch in flight, done when its rows are answered."""
        self._lanes = [JobLane(functools.partial(_run_batch, compute), _finish_job,
                               f"batch-{name}_{i}", config.runtime_calls == "loop")
                       for i, compute in enumerate(self.computes)]
        """One lane per instance: its thread, or the loop's (`BatcherConfig.runtime_calls`)."""
        self._queued_tokens = 0  # tokens of the rows counted in _live
        self._next_deadline = math.inf  # no queued row's deadline is earlier
        self._left = False  # a queued row was cancelled since `_drop_dead` last looked
        self.cost = BatchCost()
        """Seconds of a batch, fixed + per token, fitted from recent batches (warm-up
        included): from its start to its end on its instance's thread."""
        self.drain = CostEstimate()
        """Seconds per row at which a backlog drains, per instance: from the end of an
        instance's batch on its thread, with rows waiting, to the end of its next, over that
        batch's rows (`expected_wait`). (Measured from a batch's start to the instance's next
        launch from idle, it was seen only where no batch was handed over, a few times a
        second at most under a steady load, each time over a lone small batch: long texts
        in a closed loop at capacity read ~6 ms a row against ~1.6 ms served, and refused
        requests whose queue wait was ~50 ms.)"""
        self._backlog_since: list[float | None] = [None] * len(self.computes)
        """Per instance, when its thread ended its last batch with work waiting for it (a
        batch handed over, or rows queued before then); None: it went idle."""
        self.margin = WaitMargin(config.max_queue_wait_s)
        """What `expected_wait` adds to the estimate for its own error."""
        self.gap = CostEstimate()
        """Seconds between batches while rows wait: from the end of an instance's batch on
        its thread to its next launch (the loop's turn to answer it, filling, `plan_batch`),
        which `cost` does not hold; none for a batch handed to a busy instance."""
        self._busy: list[deque[tuple[float, int]]] = [deque() for _ in self.computes]
        """Per instance, (launch time, tokens) of the batch it runs and of the one handed
        over after it, if any."""
        self._freed_at: list[float | None] = [None] * len(self.computes)
        """Per instance, when its thread ended its last batch with rows waiting (None: idle
        with none)."""
        self.max_depth_seen = 0
        """Highest queue depth ever observed (tests check the bound)."""
        self.batches_run = 0
        """Batches handed to `compute` (failed ones included)."""

    @property
    def depth(self) -> int:
        """Rows waiting for a batch (cancelled rows excluded)."""
        return self._live

    def expected_wait(self) -> float | None:
        """Seconds a row submitted now would wait before computing (None: not measured): the
        batches the queue needs (`batches_for`) at the measured fixed cost each and the gap
        between batches, its tokens at the measured cost per token, and what the running
        batches have left of their expected cost, shared by the instances running in
        parallel. (Without the last two it ran low at 3x load on 16-text requests, by 20-50
        ms at the median, 26% of rows by over 0.1 s: `seqserve_queue_wait_estimate_error_seconds`,
        docs/performance.md section 19.) At least the queue's rows at the rate a backlog was
        last seen to drain (`drain`): the cost model prices full batches of the queue's
        tokens, but batches split by length run partly full, and a starved CPU adds delays
        it does not see (at 3x overload on 2 cores 16-text classify's rows then waited ~2x
        the model's estimate and the admitted waits' p99 passed the bound: section 20).
        Times `margin`, for the estimate's own recent error (`WaitMargin`)."""
        cost = self.cost
        if cost.per_unit is None:
            return None
        batches = self.batches_for(self._live, self._queued_tokens)
        work = batches * (cost.fixed + (self.gap.per_unit or 0.0))
        work += self._queued_tokens * cost.per_unit
        now = time.monotonic()
        for jobs in self._busy:  # what the running batches have left, and those after them
            for k, (start, tokens) in enumerate(jobs):
                whole = cost.fixed + tokens * cost.per_unit
                work += max(whole - (now - start), 0.0) if k == 0 else whole
        wait = work / len(self.computes)
        drain = self.drain
        if drain.per_unit is not None and not drain.stale():
            wait = max(wait, self._live * drain.per_unit / len(self.computes))
        return wait * self.margin.factor

    def batches_for(self, rows: int, tokens: int) -> int:
        """Fewest batches that hold `rows` rows of `tokens` tokens in all under the row and
        token limits (0 for none)."""
        if rows <= 0:
            return 0
        cfg = self.config
        return max(math.ceil(rows / cfg.max_batch_size),
                   math.ceil(tokens / cfg.max_batch_tokens), 1)

    def start(self) -> None:
        """Start the loop task on the running event loop."""
        if self._task is None:
            loop = asyncio.get_running_loop()
            self._task = loop.create_task(self._run(), name=self.name)
            for lane in self._lanes:
                lane.start(loop)
            weakref.finalize(self, _close_lanes, self._lanes)  # a batcher never closed

    def submit(
        self, rows: Sequence[tuple[P, int]], deadline: float
    ) -> list[asyncio.Future[Timed[R]]]:
        """Admit all `(payload, length)` rows or none; returns one future per row."""
        if self._closing:
            raise ShuttingDown("server is shutting down", retry_after=self.config.retry_after_s)
        if self._live + len(rows) > self.config.queue_size:
            raise QueueFull(
                f"model {self.name!r} queue is full ({self._live} of "
                f"{self.config.queue_size} waiting)",
                retry_after=self.config.retry_after_s,
            )
        wait = self.expected_wait()
        self._admit_by_wait(rows, deadline, wait)
        return self._enqueue(rows, deadline, wait or 0.0, self.margin.factor)  # unmeasured: 0

    def _enqueue(self, rows: Sequence[tuple[P, int]], deadline: float,
                 expected: float | None = None, margin: float = 1.0
                 ) -> list[asyncio.Future[Timed[R]]]:
        loop = asyncio.get_running_loop()
        futures = []
        admission = None if expected is None else Admission(expected, margin, len(rows))
        for payload, length in rows:
            row: _Row[P, R] = _Row(payload, max(int(length), 1), deadline, loop.create_future(),
                                   admission=admission)
            row.future.add_done_callback(functools.partial(self._on_done, row))
            self._pending.append(row)
            futures.append(row.future)
            self._queued_tokens += row.length
            if deadline < self._next_deadline:
                self._next_deadline = deadline
        self._live += len(rows)
        self._depth_changed()
        self._wake.set()
        return futures

    def _admit_by_wait(self, rows: Sequence[tuple[P, int]], deadline: float,
                       wait: float | None) -> None:
        """QueueFull when `rows` would wait too long, or miss their deadline. An idle batcher
        whose estimate is stale still refuses by it, and computes the refused rows for no
        one, to measure again (a slow spell's estimate cannot refuse forever; no request is
        let through on a guess only to miss its deadline)."""
        tokens = sum(max(int(n), 1) for _, n in rows)

        def probe() -> None:
            for future in self._enqueue(rows, time.monotonic() + PROBE_DEADLINE_S):
                future.add_done_callback(_ignore)

        admit_by_wait(f"model {self.name!r}", wait,
                      self.cost.seconds(tokens, self.batches_for(len(rows), tokens)),
                      deadline, self.config.max_queue_wait_s, self.config.retry_after_s,
                      not self._live and not self._running and self.cost.stale(), probe)

    async def close(self, timeout: float) -> bool:
        """Refuse new rows, finish the queued ones within `timeout`; True when all finished."""
        self._closing = True
        self._wake.set()
        drained = True
        if self._task is not None:
            try:
                await asyncio.wait_for(asyncio.shield(self._draining()), timeout)
            except TimeoutError:
                drained = False
                self._task.cancel()
                for row in self._pending:
                    self._dequeue(row)
                    if not row.future.done():
                        row.future.set_exception(ShuttingDown("drain timeout passed"))
                self._pending.clear()
        _close_lanes(self._lanes)
        return drained

    async def _draining(self) -> None:
        if self._task is not None:
            await self._task
        if self._running:
            await asyncio.wait(set(self._running))

    async def _run(self) -> None:
        while True:
            if not self._pending:
                if self._closing:
                    return
                self._freed_at = [None] * len(self.computes)  # no gap: nothing waits
                self._wake.clear()
                await self._wake.wait()
                continue
            idle = bool(self._free)
            if idle:
                await self._fill()
                instance = self._free[-1]
            else:  # every instance busy: rows keep arriving meanwhile
                ahead = self._next_in_line()
                if ahead is None:
                    if any(len(jobs) == 1 for jobs in self._busy):
                        self._wake.clear()  # an arrival may fill a batch (or a batch ends)
                        await self._wake.wait()
                    else:
                        self._freed.clear()
                        await self._freed.wait()
                    continue
                instance = ahead
            self._drop_dead()
            batch = self._take_batch()
            if batch:
                if idle:
                    self._free.pop()
                self._launch(batch, instance)

    def _next_in_line(self) -> int | None:
        """The busy instance to hand the next batch to while it computes (the one whose
        batch started first), when a full batch waits and one of them has none after its
        own; else None."""
        best = None
        for i, jobs in enumerate(self._busy):
            if len(jobs) == 1 and (best is None or jobs[0][0] < self._busy[best][0][0]):
                best = i
        return best if best is not None and self._full() else None

    async def _fill(self) -> None:
        """Wait until the batch is full or the oldest row has waited max_wait_s; with every
        instance idle, not at all."""
        if len(self._free) == len(self.computes):
            return
        close_at = self._pending[0].enqueued + self.config.max_wait_s
        while not self._closing and not self._full():
            left = close_at - time.monotonic()
            if left <= 0:
                return
            self._wake.clear()
            try:
                await asyncio.wait_for(self._wake.wait(), left)
            except TimeoutError:
                return

    def _full(self) -> bool:
        """Whether a full batch waits (called on every submit while filling: O(1) once the
        live rows reach the row limit, else a look at fewer rows than that limit's worth)."""
        if self._live >= self.config.max_batch_size:
            return True
        live = [r.length for r in self._pending if not r.future.done()]
        return len(live) * max(live, default=0) >= self.config.max_batch_tokens

    def _drop_dead(self) -> None:
        """Remove rows nobody waits for (future done) or whose deadline passed; a look at the
        whole queue only once its earliest deadline may have passed or a client left (a scan
        per batch of a 2,048-row queue cost more than the batch: docs/performance.md section
        20)."""
        now = time.monotonic()
        if now < self._next_deadline and not self._left:
            return
        self._left = False
        self._next_deadline = min((r.deadline for r in self._pending), default=math.inf)
        keep: deque[_Row[P, R]] = deque()
        for row in self._pending:
            if row.future.done():
                continue
            if row.deadline <= now:
                self._dequeue(row)
                row.future.set_exception(DeadlineExceeded("deadline passed while queued"))
                continue
            keep.append(row)
        if len(keep) != len(self._pending):
            self._pending = keep
            self._depth_changed()

    def _take_batch(self) -> list[_Row[P, R]]:
        """The next batch: the oldest row and its nearest neighbours by length among the
        oldest PLAN_AGE x max_batch_size rows (`plan_batch` on that window, sorted by
        length). Choosing from the whole queue let a row of an unusual length wait behind
        up to one batch per older row while rows of common lengths passed it (at 3x
        overload the queue waits' p99 passed the bound the estimate kept: the estimate
        prices a queue served in order, docs/performance.md section 20), and cost
        O(queue) per batch; from the oldest few batches' worth, the queue is served nearly
        in order and a batch costs the same at any depth."""
        pending = self._pending
        if not pending:
            return []
        cfg = self.config
        window = list(itertools.islice(pending, PLAN_AGE * cfg.max_batch_size))
        anchor = window[0]
        ordered = sorted(window, key=_length)
        lengths = [r.length for r in ordered]
        at = ordered.index(anchor)
        lo, hi = plan_window(len(lengths), at, cfg.max_batch_size)
        i, j = plan_batch(lengths[lo:hi], at - lo, cfg.max_batch_size, cfg.max_batch_tokens,
                          cfg.overhead_tokens)
        chosen = {id(r) for r in ordered[lo + i:lo + j]}
        batch = [r for r in window if id(r) in chosen]  # FIFO order
        for r in batch:
            self._dequeue(r)
        for _ in window:  # the window is the queue's head: put back what stays, in order
            pending.popleft()
        pending.extendleft(reversed([r for r in window if id(r) not in chosen]))
        self._depth_changed()
        return batch

    def _launch(self, batch: list[_Row[P, R]], instance: int) -> None:
        """Hand `batch` to the instance's thread (idle, or busy: it starts after the batch
        it runs); `_finish` answers its rows on the loop."""
        lengths = [r.length for r in batch]
        self.observer.on_batch(len(batch), len(batch) * max(lengths), sum(lengths))
        self.batches_run += 1
        done = asyncio.get_running_loop().create_future()
        self._running.add(done)
        now = time.monotonic()
        jobs = self._busy[instance]
        freed = self._freed_at[instance]
        if jobs:  # handed over while it computes: no gap after the batch it runs
            self.gap.observe(1, 0.0)
        elif freed is not None:  # rows waited while this instance was between batches
            self.gap.observe(1, now - freed)
        times = [now, now]  # [start, end] on the thread (`_run_batch`)
        jobs.append((now, sum(lengths)))
        self._lanes[instance].put((batch, [r.payload for r in batch], times, done,
                                   instance, self._finish))

    def _finish(self, job: tuple[Any, ...], outcome: Sequence[R] | Exception) -> None:
        batch, _, times, done, instance, _ = job
        try:
            self._answer(batch, times, outcome)
        finally:
            jobs = self._busy[instance]
            if jobs:
                jobs.popleft()
            self._drained(instance, len(batch), times[1], bool(jobs))
            if not jobs:
                self._freed_at[instance] = times[1] if self._live else None
                self._free.append(instance)
            self._freed.set()
            self._wake.set()  # (`_run` may wait for an instance with room for a batch)
            self._running.discard(done)
            done.set_result(None)

    def _drained(self, instance: int, rows: int, end: float, handed: bool) -> None:
        """`drain`: an instance's batch of `rows` ended at `end` on its thread; the time since
        its last batch ended counts when work waited for it then, and this end starts the
        next such time when work waits now (a batch handed over after it, or a row queued
        before `end`)."""
        since = self._backlog_since[instance]
        if since is not None:
            self.drain.observe(rows, end - since)
        waiting = handed or bool(self._pending) and self._pending[0].enqueued <= end
        self._backlog_since[instance] = end if waiting else None

    def _answer(self, batch: list[_Row[P, R]], times: list[float],
                outcome: Sequence[R] | Exception) -> None:
        start = times[0]
        if isinstance(outcome, Exception):
            log.error("model %s: batch of %d failed", self.name, len(batch), exc_info=outcome)
            for row in batch:
                if not row.future.done():
                    row.future.set_exception(InferenceFailed(f"inference failed: {outcome}"))
            return
        compute_s = time.monotonic() - start
        ran = [r for r, result in zip(batch, outcome, strict=True) if result is not _SKIPPED]
        if ran:
            self.cost.observe(sum(r.length for r in ran), times[1] - start)
        self.margin.started(self.observer, [(start - r.enqueued, r.admission) for r in ran
                                            if r.admission is not None])
        for row, result in zip(batch, outcome, strict=True):
            if row.future.done():
                continue
            if result is _SKIPPED:  # its deadline passed while the batch waited for the thread
                row.future.set_exception(DeadlineExceeded("deadline passed while queued"))
                continue
            timing = Timing(start - row.enqueued, compute_s, len(ran), 0)
            row.future.set_result(Timed(result, timing))

    def _dequeue(self, row: _Row[P, R]) -> None:
        if row.queued:
            row.queued = False
            self._live -= 1
            self._queued_tokens -= row.length

    def _on_done(self, row: _Row[P, R], _: object) -> None:
        if row.queued and row.future.cancelled():
            self._dequeue(row)
            self._left = True  # `_drop_dead` removes it from the queue
            self._depth_changed()

    def _depth_changed(self) -> None:
        depth = self._live
        self.max_depth_seen = max(self.max_depth_seen, depth)
        self.observer.on_depth(depth)


_SKIPPED = object()
"""A row's result in a batch whose thread did not compute it (`_run_batch`)."""


def _run_batch(compute: Callable[[list[Any]], Sequence[Any]], job: tuple[Any, ...]
               ) -> Sequence[Any]:
    """One batch job on its instance's thread: the compute of its payloads, one result per
    row (`_SKIPPED` for a row whose deadline passed or whose client left while the batch
    waited for the thread: a batch handed over behind another), its start and end time in
    the job's `times`."""
    batch, payloads, times = job[0], job[1], job[2]
    now = times[0] = time.monotonic()
    try:
        live = [r.deadline > now and not r.future.done() for r in batch]
        run = payloads if all(live) else [p for p, ok in zip(payloads, live, strict=True) if ok]
        results = compute(run) if run else []
        if len(results) != len(run):
            raise RuntimeError(f"compute returned {len(results)} results for {len(run)}")
        if run is payloads:
            return results
        ran = iter(results)
        return [next(ran) if ok else _SKIPPED for ok in live]
    finally:
        times[1] = time.monotonic()


def _finish_job(job: tuple[Any, ...], outcome: Sequence[Any] | Exception) -> None:
    """On the loop: the job's own `_finish` (the thread holds no batcher, so one never
    closed can still be collected)."""
    job[-1](job, outcome)


def _close_lanes(lanes: list[JobLane[Any, Any]]) -> None:
    for lane in lanes:
        lane.close()  # each instance's thread ends after the batch it runs, if any


def _length(row: _Row[Any, Any]) -> int:
    return row.length
