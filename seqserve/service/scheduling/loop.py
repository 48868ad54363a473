"""The one loop driver of every decoding scheduler: schedule -> execute -> update.

A scheduler (`Scheduled`: the translator's `DecodeScheduler`, the language models'
`LMScheduler`, anything later) is synchronous and model-free: `schedule()` says what to run
next (an admission batch, one step per group), `execute(work)` runs one item (on a lane's
thread: lanes.py), `update(work, result)` applies what came back and returns the `Outcome`s of
the requests that left, `settle()` those whose answers it built only after the driver launched
the next work (so the runtime does not wait for them), `fail_all(error)` fails every request
(a bug must not hang clients), `abort(error)` ends every request with `error` (a shutdown
past its grace). `LoopDriver` is the asyncio task that feeds it: launch what it schedules on
the item's lane, wait for any item to come back, update, resolve, report, and sleep when
nothing runs until
`kick()` wakes it; `stop()` ends it once the scheduler is closing and idle, `drain(timeout,
error)` stops it within a grace and aborts what is left. Every request of every scheduler has
one `Status`.
"""

from __future__ import annotations

import asyncio
import enum
import itertools
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

from seqserve.service.scheduling.lanes import Lanes

W = TypeVar("W")
R = TypeVar("R")
Q = TypeVar("Q", bound="Keyed")

log = logging.getLogger("seqserve.loop")


class Status(enum.Enum):
    """Where a request is. A scheduler's table holds each live request with one status."""

    WAITING = "waiting"  # queued for admission
    ENCODING = "encoding"  # admitted, its first batch (encoder, prefill) running
    DECODING = "decoding"  # live: stepped with the others
    FINISHED = "finished"  # answered
    ABORTED = "aborted"  # cancelled or failed


@dataclass(frozen=True, eq=False)
class Outcome:
    """A request that left the scheduler: its result, or the exception to raise."""

    request: Any
    result: Any


class Keyed(Protocol):
    """A scheduler's request: its id in the table."""

    rid: int


class RequestTable(Generic[Q]):
    """What every scheduler keeps of its requests: `table` (request id -> request, each with
    one `Status`), the rows waiting for admission (`queued`), `closing`; and `abort`, on top
    of the scheduler's own `cancel`."""

    def __init__(self) -> None:
        self.closing = False
        self.table: dict[int, Q] = {}
        self._ids = itertools.count()
        self._waiting = 0

    def cancel(self, rid: int) -> None:
        """The caller gave up on request `rid` (the scheduler frees its rows)."""
        raise NotImplementedError

    def answer_error(self, request: Q, error: BaseException) -> None:
        """End `request` with `error` where the scheduler answers its requests (the
        language models' sinks); by default the driver's `resolve` does."""

    def settle(self) -> list[Outcome]:
        """Requests that left in the last updates and are answered only now, after the
        driver launched the next work (the translator's: building its n-best answers off
        the decoder's path); none by default."""
        return []

    def abort(self, error: Exception) -> list[Outcome]:
        """Every live request is aborted (shutdown past its grace): they leave with
        `error`."""
        aborted = list(self.table.values())
        for r in aborted:
            self.cancel(r.rid)
            self.answer_error(r, error)
        return [Outcome(r, error) for r in aborted]

    @property
    def queued(self) -> int:
        """Rows (sources, prompts, texts) waiting for admission; cancelled ones excluded."""
        return self._waiting


class Scheduled(Protocol[W, R]):
    """What the driver needs of a scheduler (see the module doc)."""

    closing: bool

    def schedule(self) -> Sequence[W]: ...

    def lane(self, work: W) -> int: ...

    def execute(self, work: W) -> R: ...

    def update(self, work: W, result: R) -> list[Outcome]: ...

    def settle(self) -> list[Outcome]: ...

    def fail_all(self, error: Exception) -> list[Outcome]: ...

    def abort(self, error: Exception) -> list[Outcome]: ...

    def has_work(self) -> bool: ...


class LoopDriver(Generic[W, R]):
    """Drives `scheduler` on lanes named `lanes` (their calls on the loop's thread while short
    with `on_loop`; `DecodeConfig.runtime_calls`); subclasses answer their requests
    (`resolve`) and report their gauges (`report`)."""

    def __init__(self, scheduler: Scheduled[W, R], lanes: Sequence[str],
                 on_loop: bool = False) -> None:
        self.scheduler = scheduler
        self._lanes: Lanes[W, R] = Lanes(scheduler.execute, lanes, on_loop=on_loop)
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._task is None:
            self._lanes.start()
            self._task = asyncio.get_running_loop().create_task(self._loop())

    async def stop(self) -> None:
        """Refuse new work, finish what was admitted or queued, then end the loop."""
        self.scheduler.closing = True
        self._wake.set()
        if self._task is not None:
            await self._task
            self._task = None
        self._lanes.stop()

    def abort(self, error: Exception) -> None:
        """Fail every queued and admitted request with `error` (shutdown past its grace)."""
        self.scheduler.closing = True
        self.resolve(self.scheduler.abort(error))
        self.kick()

    async def drain(self, timeout: float, error: Exception) -> bool:
        """`stop` within `timeout` (True when every request finished); past it, `abort` the
        rest with `error` and give the loop 5 s more to end (False)."""
        stopping = asyncio.ensure_future(self.stop())
        done, _ = await asyncio.wait({stopping}, timeout=timeout)
        if done:
            return True
        self.abort(error)
        await asyncio.wait({stopping}, timeout=5.0)
        return False

    def kick(self) -> None:
        """New work or a cancellation: the loop looks again."""
        self._wake.set()

    def resolve(self, outcomes: list[Outcome]) -> None:
        """Answer the requests that left (their futures or sinks)."""

    def report(self) -> None:
        """Publish the queue and live gauges."""

    async def _loop(self) -> None:
        """Launch the scheduler's work, apply each item as it finishes, until closed and idle."""
        scheduler, lanes = self.scheduler, self._lanes
        while True:
            try:
                for work in scheduler.schedule():
                    lanes.put(scheduler.lane(work), work)
                self.resolve(scheduler.settle())  # after the puts: off the runtime's path
            except Exception as exc:  # a bug here must not hang every waiting client
                log.exception("%s schedule failed", type(scheduler).__name__)
                self.resolve(scheduler.fail_all(exc))
            if not lanes.in_flight:
                if scheduler.closing and not scheduler.has_work():
                    return
                self.report()  # idle: cancelled requests no longer count
                self._wake.clear()
                await self._wake.wait()
                continue
            for work, result in await lanes.completed():
                try:
                    if isinstance(result, Exception):
                        raise result
                    outcomes = scheduler.update(work, result)
                except Exception as exc:
                    log.exception("%s update failed", type(scheduler).__name__)
                    outcomes = scheduler.fail_all(exc)
                self.resolve(outcomes)
            self.report()
