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

`on_loop=True` runs an item on the event loop's own thread instead, at once, and hands its
result back the same way, in a callback of its own (`JobLane`, which the batcher's instances
use too), while the lane's calls are measured short (`INLINE_MAX_S`) and none is on its
thread; a call measured long, or not measured yet, runs on the thread, so a slow call never
holds the loop (its health answers, deadlines, refusals). That is `--runtime-calls loop`:
where each API process has its own models, one runtime thread each, on a CPU, and the
native front reads requests outside the interpreter while a call runs, a thread hand-off per
call (a wake of a sleeping thread, a GIL hand-back, a self-pipe write) is pure cost
(docs/performance.md section 33).
"""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any, Generic, TypeVar

W = TypeVar("W")
R = TypeVar("R")


class Lanes(Generic[W, R]):
    """`run(work)` on one lane each (named `names`; on the loop's thread with `on_loop`);
    see the module doc. Start on the running loop with `start()`, end with `stop()` (after
    the last `completed()`)."""

    def __init__(self, run: Callable[[W], R], names: Sequence[str],
                 on_loop: bool = False) -> None:
        self.run = run
        self.names = list(names)
        self._lanes = [JobLane(run, self._returned, name, on_loop) for name in names]
        self._results: deque[tuple[W, R | Exception]] = deque()
        self._ready = asyncio.Event()
        self.in_flight = 0
        """Items put and not yet returned by `completed()`."""

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        for lane in self._lanes:
            lane.start(loop)

    def put(self, lane: int, work: W) -> None:
        self.in_flight += 1
        self._lanes[lane].put(work)

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
        for lane in self._lanes:
            lane.close()
        for lane in self._lanes:
            lane.join()

    def _returned(self, work: W, result: R | Exception) -> None:
        self._results.append((work, result))
        self._ready.set()


J = TypeVar("J")

INLINE_MAX_S = 0.01
"""`on_loop`: a lane's calls run on the loop's thread while their recent duration (an
average, `JobLane.typical`) is at most this; the loop answers nothing else meanwhile."""


class JobLane(Generic[J, R]):
    """Runs `run(job)` for each job put, in order, and hands (job, result or the exception
    its run raised) to `back` on the event loop, one callback each: on a thread of its own
    (`serve_jobs`), or with `on_loop` at once on the loop's thread while the lane's calls
    are measured short and none is on the thread (the result's callback still comes in a
    later turn, as a thread's would; see the module doc). `start(loop)` once on the running
    loop; `close()` ends the thread after what it holds (without waiting), `join()` waits
    for it. The thread holds the lane, `run` and `back`, never their owner (an owner never
    closed can still be collected: `close` from its finalizer)."""

    def __init__(self, run: Callable[[J], R], back: Callable[[J, R | Exception], None],
                 name: str, on_loop: bool = False, inline_max_s: float = INLINE_MAX_S) -> None:
        self.run = run
        self.back = back
        self.name = name
        self.on_loop = on_loop
        self.inline_max_s = inline_max_s
        self.typical: float | None = None
        """Seconds of this lane's recent calls (None: none yet; `_observe`; `on_loop` only)."""
        self._on_thread = 0  # jobs put on the thread and not yet back
        self._jobs: queue.SimpleQueue[J | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        if self._loop is not None:
            return
        self._loop = loop
        # Timed (and counted) only where the timings choose between the loop and the thread.
        run, back = (self._timed, self._came_back) if self.on_loop else (self.run, self.back)
        self._thread = threading.Thread(target=serve_jobs, args=(self._jobs, run, back, loop),
                                        name=self.name, daemon=True)
        self._thread.start()

    def put(self, job: J) -> None:
        typical = self.typical
        if (self.on_loop and not self._on_thread and typical is not None
                and typical <= self.inline_max_s):
            assert self._loop is not None, "put before start"
            result: R | Exception
            start = time.perf_counter()
            try:
                result = self.run(job)
            except Exception as exc:  # the loop decides what a failed job means
                result = exc
            else:
                self._observe(time.perf_counter() - start)
            self._loop.call_soon(self.back, job, result)
            return
        if self.on_loop:
            self._on_thread += 1
        self._jobs.put(job)

    def _timed(self, job: J) -> tuple[R, float]:
        """On the thread: the job's result and its duration."""
        start = time.perf_counter()
        result = self.run(job)
        return result, time.perf_counter() - start

    def _came_back(self, job: J, outcome: tuple[R, float] | Exception) -> None:
        """On the loop: a job the thread ran."""
        self._on_thread -= 1
        if isinstance(outcome, Exception):
            self.back(job, outcome)
            return
        result, seconds = outcome
        self._observe(seconds)
        self.back(job, result)

    def _observe(self, seconds: float) -> None:
        """A call's duration: the typical one rises with a longer call at once and falls
        back over a few shorter ones (a slow spell moves the calls to the thread at once)."""
        typical = self.typical
        self.typical = seconds if typical is None else max(seconds, 0.8 * typical + 0.2 * seconds)

    def close(self) -> None:
        close_queue(self._jobs)

    def join(self) -> None:
        if self._thread is not None:
            self._thread.join()
            self._thread = None


def close_queue(jobs: queue.SimpleQueue[Any]) -> None:
    """End the thread serving `jobs` after the jobs it holds (a lane's `close`, also from a
    finalizer that holds the queue, not the lane)."""
    jobs.put(None)


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
