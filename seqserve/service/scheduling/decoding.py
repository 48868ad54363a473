"""The translator decode scheduler: step-level continuous batching, driven from the event loop.

The engine's logic is the synchronous scheduler in scheduler.py (`DecodeScheduler`: schedule,
execute, update; one table of requests, each with one status) and the vectorised beam search
in beams.py. This module only feeds it and drains it:

- `submit` adds sources to the core and hands back one future per source; a cancelled future
  tells the core, whose next schedule or update drops the request and frees its rows;
- one task loops: take the core's work (an encoder batch, one decoder step per idle group),
  run each item on a work lane (lanes.py: the encoder on a thread of its own, the decoder
  steps on another, so an admission batch encodes while a step runs), hand each finished
  item back to the core, and resolve the futures of the requests that left.

With `DecodeConfig.groups` G > 1 the core splits the requests into G groups whose steps take
turns on the decoder thread: while one group's step computes, the loop updates another
group's beams (uses a second core; results are the same). Runtime calls never run on the
event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Sequence

from seqserve.service.core.errors import QueueFull
from seqserve.service.runtimes.base import Runtime
from seqserve.service.scheduling.base import NullObserver, Observer
from seqserve.service.scheduling.lanes import Lanes
from seqserve.service.scheduling.scheduler import DecodeScheduler, Outcome
from seqserve.service.scheduling.search import DecodeLimits, SearchOptions
from seqserve.service.scheduling.work import (
    DecodeConfig,
    Decoded,
    EncodeResult,
    EncodeWork,
    StepResult,
    StepStats,
    Work,
)

__all__ = ["Decoded", "DecodeLoop", "DecodeConfig", "StepStats"]

log = logging.getLogger("seqserve.decoding")


class DecodeLoop:
    """See module doc. Start with `start()`, submit with `translate()`, stop with `stop()`."""

    def __init__(self, runtime: Runtime, limits: DecodeLimits, config: DecodeConfig,
                 observer: Observer | None = None) -> None:
        self.runtime = runtime
        self.limits = limits
        self.config = config
        self.observer: Observer = observer or NullObserver()
        self.core = DecodeScheduler(runtime, limits, self.config, self.observer)
        self._futures: dict[int, asyncio.Future[Decoded]] = {}
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._lanes: Lanes[Work, EncodeResult | StepResult] = Lanes(
            self.core.execute, ["encode", "decode"])

    @property
    def stats(self) -> StepStats:
        return self.core.stats

    @stats.setter
    def stats(self, value: StepStats) -> None:
        self.core.stats = value

    # -- lifecycle ------------------------------------------------------------------------

    def start(self) -> None:
        if self._task is None:
            self._lanes.start()
            self._task = asyncio.get_running_loop().create_task(self._loop())

    async def stop(self) -> None:
        """Refuse new work, finish what was admitted or queued, then end the loop."""
        self.core.closing = True
        self._wake.set()
        if self._task is not None:
            await self._task
            self._task = None
        self._lanes.stop()

    def abort(self, error: Exception) -> None:
        """Fail every queued and admitted request with `error` (shutdown past its grace)."""
        self.core.closing = True
        for r in self.core.abort():
            future = self._futures.get(r.rid)
            if future is not None and not future.done():
                future.set_exception(error)
        self._wake.set()

    @property
    def live_rows(self) -> int:
        return self.core.live_rows

    @property
    def queued(self) -> int:
        """Sources waiting for admission (cancelled ones excluded)."""
        return self.core.queued

    # -- submission -----------------------------------------------------------------------

    def submit(self, sources: Sequence[list[int]], options: SearchOptions,
               deadline: float | None = None) -> list[asyncio.Future[Decoded]]:
        """Queue each source (token ids, non-empty) for decoding; one future per source.

        All or none: raises QueueFull when the queue cannot take every source, ShuttingDown
        while draining. Options are trusted (the HTTP schema checked them). Cancelling a
        future frees that source's rows at the next step.
        """
        try:
            requests = self.core.add(sources, options, deadline)
        except QueueFull:
            self._wake.set()  # a refusal may have queued a probe (DecodeScheduler._probe)
            raise
        loop = asyncio.get_running_loop()
        futures = []
        for r in requests:
            future: asyncio.Future[Decoded] = loop.create_future()
            future.add_done_callback(functools.partial(self._on_done, r.rid))
            self._futures[r.rid] = future
            futures.append(future)
        self._wake.set()
        self._report_depth()
        return futures

    async def translate(self, sources: Sequence[list[int]],
                        options: SearchOptions) -> list[Decoded]:
        """`submit` and wait for every source; cancelling the caller cancels every source."""
        futures = self.submit(sources, options)
        try:
            return list(await asyncio.gather(*futures))
        except BaseException:
            for f in futures:
                f.cancel()
            raise

    def _on_done(self, rid: int, future: asyncio.Future[Decoded]) -> None:
        self._futures.pop(rid, None)
        if future.cancelled():  # the core frees its rows; the gauges must not wait for that
            self.core.cancel(rid)
            self._report_depth()
            self._wake.set()

    # -- the loop -------------------------------------------------------------------------

    async def _loop(self) -> None:
        """Launch the core's work, apply each item as it finishes, until closed and idle."""
        while True:
            try:
                for work in self.core.schedule():
                    self._lanes.put(0 if isinstance(work, EncodeWork) else 1, work)
            except Exception as exc:  # a bug here must not hang every waiting client
                log.exception("decode scheduler schedule failed")
                self._resolve(self.core.fail_all(exc))
            if not self._lanes.in_flight:
                if self.core.closing and not self.core.has_work():
                    return
                self._report_depth()  # idle: cancelled requests no longer count
                self._wake.clear()
                await self._wake.wait()
                continue
            for work, result in await self._lanes.completed():
                try:
                    if isinstance(result, Exception):
                        raise result
                    outcomes = self.core.update(work, result)
                except Exception as exc:
                    log.exception("decode scheduler update failed")
                    outcomes = self.core.fail_all(exc)
                self._resolve(outcomes)
            self._report_depth()

    def _resolve(self, outcomes: list[Outcome]) -> None:
        for o in outcomes:
            future = self._futures.get(o.request.rid)
            if future is None or future.done():
                continue
            if isinstance(o.result, Exception):
                future.set_exception(o.result)
            else:
                future.set_result(o.result)

    def _report_depth(self) -> None:
        self.observer.on_depth(self.core.queued, self.core.live_rows)

    async def __aenter__(self) -> DecodeLoop:
        self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        with contextlib.suppress(Exception):
            await self.stop()
