"""The translator's decode loop: step-level continuous batching, driven from the event loop.

The logic is the synchronous scheduler in scheduler.py (`DecodeScheduler`: schedule, execute,
update; one table of requests, each with one status) and the vectorised beam search in
beam_search.py; the loop is the one loop driver (loop.py). This module only feeds it and
answers its requests:

- `submit` adds sources to the scheduler and hands back one future per source; a cancelled
  future tells the scheduler, whose next schedule or update drops the request and frees its
  rows;
- the driver takes the scheduler's work (an encoder batch, one decoder step per idle group),
  runs each item on a work lane (lanes.py: the encoder on a thread of its own, the decoder
  steps on another, so an admission batch encodes while a step runs), hands each finished
  item back to the scheduler, and `resolve` answers the futures of the requests that left.

With `DecodeConfig.groups` G > 1 the scheduler splits the requests into G groups whose steps
take turns on the decoder thread: while one group's step computes, the loop updates another
group's beams (results are the same). Runtime calls run on the lanes' threads, or on the event
loop's own thread while short with `DecodeConfig.runtime_calls` "loop" (lanes.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Callable, Sequence

from seqserve.service.core.errors import QueueFull
from seqserve.service.runtimes.base import Runtime
from seqserve.service.scheduling import beam_native
from seqserve.service.scheduling.base import NullObserver, Observer
from seqserve.service.scheduling.loop import LoopDriver, Outcome
from seqserve.service.scheduling.scheduler import DecodeScheduler
from seqserve.service.scheduling.search import DecodeLimits, SearchOptions
from seqserve.service.scheduling.work import (
    DecodeConfig,
    Decoded,
    EncodeResult,
    StepResult,
    StepStats,
    Work,
)

__all__ = ["Decoded", "DecodeLoop", "DecodeConfig", "StepStats"]

log = logging.getLogger("seqserve.decoding")


class DecodeLoop(LoopDriver[Work, EncodeResult | StepResult]):
    """See module doc. Start with `start()`, submit with `translate()`, stop with `stop()`."""

    scheduler: DecodeScheduler

    def __init__(self, runtime: Runtime, limits: DecodeLimits, config: DecodeConfig,
                 observer: Observer | None = None) -> None:
        self.runtime = runtime
        self.limits = limits
        self.config = config
        self.observer: Observer = observer or NullObserver()
        super().__init__(DecodeScheduler(runtime, limits, self.config, self.observer),
                         ["encode", "decode"], self.config.runtime_calls == "loop")
        self._futures: dict[int, tuple[asyncio.Future[Decoded], Callable[..., None]]] = {}
        """Each live source's future and its done callback (`_on_done`), by request id."""
        log.info("beam search step: %s", beam_native.STEP)

    @property
    def stats(self) -> StepStats:
        return self.scheduler.stats

    @stats.setter
    def stats(self, value: StepStats) -> None:
        self.scheduler.stats = value

    @property
    def live_rows(self) -> int:
        return self.scheduler.live_rows

    @property
    def queued(self) -> int:
        """Sources waiting for admission (cancelled ones excluded)."""
        return self.scheduler.queued

    def expected_wait(self) -> float | None:
        """Seconds a source would wait for admission now (None: not measured yet)."""
        return self.scheduler.expected_wait()

    # -- submission -----------------------------------------------------------------------

    def submit(self, sources: Sequence[list[int]], options: SearchOptions,
               deadline: float | None = None) -> list[asyncio.Future[Decoded]]:
        """Queue each source (token ids, non-empty) for decoding; one future per source.

        All or none: raises QueueFull when the queue cannot take every source, ShuttingDown
        while draining. Options are trusted (the HTTP schema checked them). Cancelling a
        future frees that source's rows at the next step.
        """
        try:
            requests = self.scheduler.add(sources, options, deadline)
        except QueueFull:
            self.kick()  # a refusal may have queued a probe (DecodeScheduler._probe)
            raise
        loop = asyncio.get_running_loop()
        futures = []
        for r in requests:
            future: asyncio.Future[Decoded] = loop.create_future()
            cancelled = functools.partial(self._on_done, r.rid)
            future.add_done_callback(cancelled)
            self._futures[r.rid] = future, cancelled
            futures.append(future)
        self.kick()  # (the gauges: reported by the loop's turn that takes them)
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
        if future.cancelled():  # the scheduler frees its rows; the gauges must not wait
            self.scheduler.cancel(rid)
            self.report()
            self.kick()

    # -- the driver's hooks ---------------------------------------------------------------

    def resolve(self, outcomes: list[Outcome]) -> None:
        for o in outcomes:
            found = self._futures.pop(o.request.rid, None)
            if found is None or found[0].done():
                continue
            future, cancelled = found
            future.remove_done_callback(cancelled)  # (it only frees a cancelled one's rows)
            if isinstance(o.result, Exception):
                future.set_exception(o.result)
            else:
                future.set_result(o.result)

    def report(self) -> None:
        self.observer.on_depth(self.scheduler.queued, self.scheduler.live_rows)

    async def __aenter__(self) -> DecodeLoop:
        self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        with contextlib.suppress(Exception):
            await self.stop()
