"""The one request lifecycle of every inference route, plain and streamed, transport-neutral.

A front (HTTP today: `asgi_call` builds it from the ASGI scope; a gRPC front builds its own)
describes one request as a `Call`: the model and version it names, the timeout its client
asked for, how to tell that the client left, and where the transport keeps the request's
context (Server-Timing and the request metrics read it there). Then, once for every route:

- `lookup`: the model's ready worker of the route's kind (`SeriesWorker`: any
  feature-sequence worker), or ModelNotFound / ModelNotReady saying why;
- `answer`: the request's deadline (the server's `request_timeout_s`, or less when the client
  asks), early shedding before any tokenization (the model's expected queue wait against what
  the request may wait), the route's own checks, and its work inside `request_call`: a
  `RequestContext` with that deadline, counted in flight, that notices the client leaving;
- `RequestCall` is that context for streamed answers too (`api/streams.py`): the stream
  lives inside it, so its in-flight count and disconnect are the same ones.

Errors are raised as `core.errors` classes; the front maps them to its protocol's answer once
(`web.responses.error_for` for HTTP).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from starlette.types import Receive, Scope

from seqserve.service.api.common import header
from seqserve.service.core.errors import BadRequest, QueueFull
from seqserve.service.web.http_protocol import DISCONNECT
from seqserve.service.web.repository import ModelEntry
from seqserve.service.web.state import AppState
from seqserve.service.workers.base import RequestContext

W = TypeVar("W")
T = TypeVar("T")

TIMEOUT_HEADER = b"x-request-timeout"


@dataclass(slots=True)
class Call:
    """One request as the lifecycle sees it, whatever its transport."""

    model: str
    version: str | None
    timeout: str | None = None
    """The client's own timeout in seconds as it sent it (HTTP: X-Request-Timeout), if any."""
    asked_s: float | None = None
    """A timeout the protocol's body asks for (OIP `parameters.timeout`), if any."""
    gone: asyncio.Future[Any] | None = None
    """Done when the client left, where the transport has such a future."""
    watch: Callable[[], Awaitable[None]] | None = None
    """Else: returns when the client left (it may raise: then nothing is known)."""
    keep: dict[str, Any] | None = None
    """Where the transport keeps the request's context (under "call")."""


def asgi_call(scope: Scope, receive: Receive, model: str, version: str | None,
              asked_s: float | None = None) -> Call:
    """The `Call` of an HTTP request: its X-Request-Timeout, our uvicorn protocol's
    disconnect future (`web.http_protocol.DISCONNECT`) or a watch for `http.disconnect`,
    and the scope's state."""
    return Call(model, version, header(scope, TIMEOUT_HEADER), asked_s,
                scope.get("extensions", {}).get(DISCONNECT), lambda: http_disconnect(receive),
                scope.setdefault("state", {}))


async def http_disconnect(receive: Receive) -> None:
    """Returns when the ASGI server reports the client gone (the body was read)."""
    while (await receive())["type"] != "http.disconnect":
        pass


def request_timeout(state: AppState, call: Call) -> float:
    """Seconds this request may take: `request_timeout_s`, or less when the client asks."""
    limit = state.settings.request_timeout_s
    if call.timeout is not None:
        try:
            seconds = float(call.timeout)
        except ValueError:
            seconds = -1.0
        if not 0 < seconds < float("inf"):
            raise BadRequest("X-Request-Timeout must be a positive number of seconds")
        limit = min(limit, seconds)
    return limit if call.asked_s is None else min(limit, call.asked_s)


def shed_early(state: AppState, model: Any, timeout_s: float) -> None:
    """429 before any work when the model's queue is already longer than this request may
    wait (the engine's last report, or the in-process batcher's own estimate): the cheap
    refusal; the model's own admission decides for the rest, with the request's size."""
    wait = model.expected_wait()
    budget = min(timeout_s, state.settings.max_queue_wait_s)
    if wait is not None and wait > budget:
        raise QueueFull(f"overloaded: expected queue wait {wait:.3f} s > {budget:.3f} s "
                        "allowed", retry_after=max(state.settings.retry_after_s, wait))


def lookup(state: AppState, call: Call, kind: type[W] | None) -> tuple[ModelEntry, W]:
    """The ready worker of the call's model version: of `kind` (None: any task)."""
    if kind is None:
        return state.repository.ready(call.model, call.version)  # type: ignore[return-value]
    return state.repository.worker(call.model, call.version, kind)  # type: ignore[type-var]


async def answer(state: AppState, call: Call, kind: type[W] | None,
                 work: Callable[[W, RequestContext], Awaitable[T]],
                 check: Callable[[W], object] | None = None,
                 read: Callable[[Call], None] | None = None) -> tuple[ModelEntry, T]:
    """One plain request's lifecycle (module doc): its entry and what `work` returned.
    `read(call)` reads what the deadline needs of the body (the OIP `timeout`) once the
    model is found; `check(worker)` refuses what the body asks of this model before any
    queueing."""
    entry, worker = lookup(state, call, kind)
    if read is not None:
        read(call)
    timeout = request_timeout(state, call)
    shed_early(state, worker.ctx.model, timeout)  # type: ignore[attr-defined]
    if check is not None:
        check(worker)  # 4xx before any queueing
    async with RequestCall(state, call, timeout) as context:
        return entry, await work(worker, context)


class RequestCall:
    """One request's `RequestContext` (deadline `timeout_s` from now, or the given
    `context`'s), kept where the transport says (Server-Timing and the request metrics read
    it), counted in flight, with `gone` the transport's disconnect future or a watcher task;
    `RequestContext.wait` waits on it directly. A class, not a generator-based context
    manager: that cost twice as much."""

    __slots__ = ("state", "call", "timeout_s", "context", "gauge", "gone", "watcher")

    def __init__(self, state: AppState, call: Call, timeout_s: float | None = None,
                 context: RequestContext | None = None) -> None:
        self.state, self.call, self.timeout_s = state, call, timeout_s
        self.context = context
        self.gauge: Any = None
        self.gone: asyncio.Future[Any] | None = None
        self.watcher: asyncio.Future[Any] | None = None

    async def __aenter__(self) -> RequestContext:
        state, call = self.state, self.call
        context = self.context
        if context is None:
            seconds = request_timeout(state, call) if self.timeout_s is None else self.timeout_s
            context = self.context = RequestContext(deadline=time.monotonic() + seconds)
        if call.keep is not None:
            call.keep["call"] = context
        gauge = self.gauge = state.metrics.child(state.metrics.in_flight, call.model) \
            if call.model in state.repository.entries else None
        if gauge is not None:
            gauge.inc()
        gone = self.gone = call.gone
        if gone is not None:
            context.gone = gone
            gone.add_done_callback(context.client_left)
        elif call.watch is not None:  # another server: a task waits for the client to leave
            watcher = self.watcher = context.gone = asyncio.ensure_future(
                _watch(call.watch, context))
            watcher.add_done_callback(_quiet)
        return context

    async def __aexit__(self, *exc: object) -> None:
        context = self.context
        assert context is not None
        if self.gone is not None:
            self.gone.remove_done_callback(context.client_left)  # no reference cycle left
        elif self.watcher is not None:
            self.watcher.cancel()  # not awaited: it ends on the loop's next turn, holding nothing
            context.gone = None  # its CancelledError's frames hold `context`: no cycle
        if self.gauge is not None:
            self.gauge.dec()


async def _watch(watch: Callable[[], Awaitable[None]], context: RequestContext) -> None:
    """Set `context.disconnected` when the client left; ends only then (it is the context's
    `gone`): a watch that fails says nothing about the client, so the watcher then waits
    until it is cancelled."""
    try:
        await watch()
    except Exception:
        await asyncio.get_running_loop().create_future()
        return
    context.disconnected.set()


def _quiet(task: asyncio.Future[Any]) -> None:
    """Retrieve a finished watcher's exception (a watch that failed: nothing to report)."""
    if not task.cancelled():
        task.exception()
