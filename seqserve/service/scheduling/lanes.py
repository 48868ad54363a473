"""Work lanes: the decode loops' runtime calls on dedicated threads, results back in one hop
(`serve_jobs`, which the batcher's instance threads use too).

A lane is one thread that runs the work items put on it in order (`Lanes.put`); each
result (or the exception its run raised) comes back to the event loop with one
`call_soon_threadsafe`, and `await Lanes.completed()` returns every result that came back.
The translator's decode loop has two lanes (encoder, decoder steps), the language model's two
(prefill, steps).

It replaces `loop.run_in_executor` plus `asyncio.wait(FIRST_COMPLETED)` per work item (the
executor's concurrent future, its chaining to an asyncio future, the wait's callbacks on every
pending future): under translate load `ThreadPoolExecutor.submit` alone was 4.7% of an API
process's samples (py-spy), as much as the whole vectorised beam step, and with lanes the
hybrid layout answers 4% more translations at 3.6% less CPU per request (wrk -c64, seven
alternating rounds; docs/performance.md). On an idle machine the two cost the same.
"""

from __future__ import annotations

import asyncio
import queue
import threading
from collections import deque
from collections.abc import Callable, Sequence
from typing import Generic, TypeVar

W = TypeVar("W")
R = TypeVar("R")


class Lanes(Generic[W, R]):
    """`run(work)` on one thread per lane (named `names`); see the module doc. Start on the
    running loop with `start()`, end with `stop()` (after the last `completed()`)."""

    def __init__(self, run: Callable[[W], R], names: Sequence[str]) -> None:
        self.run = run
        self.names = list(names)
        self._jobs: list[queue.SimpleQueue[W | None]] = [queue.SimpleQueue() for _ in names]
        self._threads: list[threading.Thread] = []
        self._results: deque[tuple[W, R | Exception]] = deque()
        self._ready = asyncio.Event()
        self.in_flight = 0
        """Items put and not yet returned by `completed()`."""

    def start(self) -> None:
        if self._threads:
            return
        loop = asyncio.get_running_loop()
        self._threads = [threading.Thread(target=self._serve, args=(jobs, loop), name=name,
                                          daemon=True)
                         for jobs, name in zip(self._jobs, self.names, strict=True)]
        for thread in self._threads:
            thread.start()

    def put(self, lane: int, work: W) -> None:
        self.in_flight += 1
        self._jobs[lane].put(work)

    async def completed(self) -> list[tuple[W, R | Exception]]:
        """Every (work, result or exception) returned since the last call; waits for one."""
        while not self._results:
            self._ready.clear()
            await self._ready.wait()
        done = list(self._results)
        self._results.clear()
        self.in_flight -= len(done)
        return done

    def stop(self) -> None:
        """End the threads once they finish what they hold (blocks until they have)."""
        for jobs in self._jobs:
            jobs.put(None)
        for thread in self._threads:
            thread.join()
        self._threads = []

    def _serve(self, jobs: queue.SimpleQueue[W | None], loop: asyncio.AbstractEventLoop) -> None:
        serve_jobs(jobs, self.run, self._returned, loop)

    def _returned(self, work: W, result: R | Exception) -> None:
        self._results.append((work, result))
        self._ready.set()


J = TypeVar("J")


def serve_jobs(jobs: queue.SimpleQueue[J | None], run: Callable[[J], R],
               back: Callable[[J, R | Exception], None], loop: asyncio.AbstractEventLoop) -> None:
    """The one hand-back from a runtime thread to the event loop (the lanes' threads and the
    batcher's instance threads): run each job until a None, and hand (job, result or the
    exception its run raised) to `back` on `loop` with one `call_soon_threadsafe`."""
    while (job := jobs.get()) is not None:
        result: R | Exception
        try:
            result = run(job)
        except Exception as exc:  # the loop decides what a failed job means
            result = exc
        try:
            loop.call_soon_threadsafe(back, job, result)
        except RuntimeError:  # the loop is closed: nobody waits any more
            return
        del job, result
