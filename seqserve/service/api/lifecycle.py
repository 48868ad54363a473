"""The one request lifecycle of every inference route, plain and streamed, transport-neutral.

A front (HTTP: `asgi_call` builds it from the ASGI scope; gRPC: `api/grpc/front.py`, from the call)
describes one request as a `Call`: the model and version it names, the timeout its client
asked for, how to tell that the client left, and where the transport keeps the request's
context (Server-Timing and the request metrics read it there). Then, once for every route:

- `lookup`: the model's ready worker of the route's kind (`SeriesWorker`: any
  feature-sequence worker), or ModelNotFound / ModelNotReady saying why;
- `admit`: the request's deadline (the server's `request_timeout_s`, or less when the client
  asks), early shedding before any tokenization (the model's expected queue wait against what
  the request may wait), the route's own checks; plain and streamed answers both pass it;
- `answer`: then its work inside `RequestCall`: a `RequestContext` with that deadline,
  counted in flight, that notices the client leaving;
- `RequestCall` is that context for streamed answers too (`api/generate.py` `EventStream`):
  the stream lives inside it, so its in-flight count and disconnect are the same ones.

Each inference route is declared once, as a `Route` (its path, its task's worker kind and
request model, its docs): the HTTP front dispatches by the table of them
(`api/hot_path.py`, `api/routes.py`) and the OpenAPI document is built from it
(`server/openapi.py`); `serve` runs one route's answer for any front.

Errors are raised as `core.errors` classes; the front maps them to its protocol's answer once
(`web.responses.error_for` for HTTP).
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from pydantic import BaseModel
from starlette.types import Receive, Scope

from seqserve.service.api.common import ERRORS, header
from seqserve.service.core.errors import BadRequest, QueueFull, ServiceError
from seqserve.service.repository.entries import ModelEntry
from seqserve.service.web.http_protocol import DISCONNECT, RECEIVED
from seqserve.service.web.state import AppState
from seqserve.service.workers.base import Begun, RequestContext, settle

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
    header: Callable[[bytes], str | None] = lambda name: None
    """The value of one request header (metadata) by its lower-case name, or None."""
    peer: str = ""
    """The client's address, where the transport knows it."""
    entry: ModelEntry | None = None
    """The model version `admit` found (its statistics: `Metrics.on_inference`)."""
    received: float | None = None
    """When the front read the request (`time.monotonic()`; `web.http_protocol.RECEIVED`),
    where it reads requests off the event loop: the deadline and the queue wait allowed
    count from then. None: from when the lifecycle saw it."""
    shed: bool = False
    """`shed_early` already passed for this request just now, on its head (`shed_unread`)
    with its whole body read and nothing run between: `admit` does not ask again (the same
    model, deadline and estimate; the hot path's `begin`)."""

    @property
    def scope(self) -> str:
        """Whose request this is, for what must not be shared across clients (the prefix
        cache): a digest of its Authorization header ("" without one)."""
        key = self.header(b"authorization")
        return hashlib.sha256(key.encode()).hexdigest()[:16] if key else ""

    @property
    def owner(self) -> str:
        """Whose sessions these are (`--max-sessions-per-key`): the API key's digest, else
        the client's address."""
        return self.scope or f"addr:{self.peer}"


def asgi_call(scope: Scope, receive: Receive, model: str, version: str | None,
              asked_s: float | None = None) -> Call:
    """The `Call` of an HTTP request: its X-Request-Timeout, our uvicorn protocol's
    disconnect future (`web.http_protocol.DISCONNECT`) or a watch for `http.disconnect`,
    the scope's state and its headers."""
    client = scope.get("client")
    extensions = scope.get("extensions", {})
    return Call(model, version, header(scope, TIMEOUT_HEADER), asked_s,
                extensions.get(DISCONNECT), lambda: http_disconnect(receive),
                scope.setdefault("state", {}), lambda name: header(scope, name),
                peer=client[0] if client else "", received=extensions.get(RECEIVED))


Reply = Any
"""What a route answers: a dict (a JSON body, status 200), an `Answer` (status, headers,
body: `core.answers`), or a streamed answer (`api/generate.py` `EventStream`)."""


@dataclass(frozen=True, slots=True)
class Route:
    """One inference route, declared once (module doc). Its path is
    `{prefix}/models/{name}[/versions/{version}]/{verb}` (`:{verb}` when `joined` is ":",
    KServe V1's `:predict`), or `{prefix}/{verb}` when not `by_model`. Its answer:
    `run(worker, body, context)` on the ready worker of `kind`, in the v1 shape `{"model",
    "version", "results"}`; or `answer(state, call, body)`, a route's own flow (through
    `answer` / `RequestCall` too). `body` is the request model (None: the answer takes the
    body's bytes); the rest documents the route (OpenAPI)."""

    prefix: str
    verb: str
    name: str
    """The endpoint's name: request metrics, access log, OpenAPI operation ids."""
    body: type[BaseModel] | None
    kind: type[Any] | None = None
    run: Callable[[Any, Any, RequestContext], Awaitable[Any]] | None = None
    answer: Callable[[AppState, Call, Any], Awaitable[Reply]] | None = None
    begin: Callable[[Any, Any, RequestContext], Begun] | None = None
    by_model: bool = True
    joined: str = "/"
    """What joins the model (or its version) to the verb in the path: "/", or ":" (KServe
    V1's `/v1/models/{name}:predict`)."""
    reads: str = "json"
    """How the body becomes `body`: "json", pydantic's JSON parser (`model_validate_json`) for
    an application/json body and FastAPI's reading for another type; "fastapi", FastAPI's
    reading of every body (`json.loads`, then Python-mode validation: the language-model
    routes' rules since they were written); "any", the JSON parser whatever the type."""
    refused: Callable[[Any], Exception] | None = None
    """The route's own error for a body that fails validation (given pydantic's
    ValidationError); None: the usual 422 naming every field."""
    model_of: Callable[[Any], str] | None = None
    """A route whose path names no model (not `by_model`): the model its validated body
    names (OpenAI's `model`), for the request metrics and the access log."""
    doc: str = ""
    """The operation's description, default version (the route, when not by_model)."""
    version_doc: str = ""
    """The description of the pinned-version operation."""
    response_model: type[BaseModel] | None = None
    responses: Mapping[int | str, dict[str, Any]] = field(default_factory=lambda: ERRORS)
    tags: tuple[str, ...] = ()
    """OpenAPI tags (none: the prefix's, `v1` or `v2`)."""
    events: bool = False
    """Answers only as server-sent events (its 200 is not JSON)."""
    documented: bool = True
    """In the OpenAPI document (OIP infer is documented per model instead)."""

    def path(self, pinned: bool = False) -> str:
        """The path template (of the pinned-version route with `pinned`)."""
        if not self.by_model:
            return f"{self.prefix}/{self.verb}"
        return (f"{self.prefix}/models/{{name}}{'/versions/{version}' if pinned else ''}"
                f"{self.joined}{self.verb}")


async def serve(state: AppState, route: Route, call: Call, body: Any) -> Reply:
    """One route's answer to one validated body (module doc), for any front."""
    if route.answer is not None:
        return await route.answer(state, call, body)
    run, begun = route.run, route.begin
    entry, results = await answer(
        state, call, route.kind, (lambda w, ctx: run(w, body, ctx)) if run is not None
        else lambda w, ctx: settle(begun(w, body, ctx), ctx))  # type: ignore[misc]
    return {"model": call.model, "version": entry.version, "results": results}


def begin(state: AppState, route: Route, call: Call, body: Any,
          answered: Callable[[Reply | None, BaseException | None], None]) -> None:
    """`serve` for a route with `begin`, without a task: the same lifecycle (`admit`, then
    the work inside `RequestCall`), its reply (or error) given to `answered` from the
    callback that sees the work done (`RequestContext.watch`). An error before any work is
    raised here."""
    entry, worker, timeout = admit(state, call, route.kind)
    assert route.begin is not None
    request = RequestCall(state, call, timeout)
    context = request.open()
    try:
        futures, finish = route.begin(worker, body, context)
    except BaseException as exc:
        request.close(exc)
        raise

    def settled(rows: list[Any] | None, error: BaseException | None) -> None:
        reply: Reply | None = None
        if error is None:
            try:
                reply = {"model": call.model, "version": entry.version,
                         "results": finish(rows or [])}
            except Exception as exc:
                error = exc
        request.close(error)
        answered(reply, error)

    context.watch(futures, settled)


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


def shed_early(state: AppState, model: Any, timeout_s: float,
               received: float | None = None) -> None:
    """429 before any work when the model's queue is already longer than this request may
    wait (the engine's last report, or the in-process batcher's own estimate), less what it
    waited since the front read it (`received`): the cheap refusal; the model's own
    admission decides for the rest, with the request's size."""
    wait = model.expected_wait()
    budget = min(timeout_s, state.settings.max_queue_wait_s)
    waited = 0.0 if received is None else time.monotonic() - received
    if waited > budget or wait is not None and waited + wait > budget:
        ahead = wait or 0.0
        front = SHED_AFTER.format(waited=f"{waited:.3f}") \
            if waited >= 0.001 and ahead <= budget else ""  # (only where it is the reason)
        raise QueueFull(SHED_MESSAGE.format(ahead=f"{ahead:.3f}", front=front,
                                            budget=f"{budget:.3f}"),
                        retry_after=max(state.settings.retry_after_s, ahead))


SHED_MESSAGE = "overloaded: expected queue wait {ahead} s{front} > {budget} s allowed"
SHED_AFTER = " after {waited} s read and waiting"
"""`shed_early`'s refusal message (seconds to 3 decimals), and what it adds when the time
since the front read the request is the reason; the native front writes the same
(`web.front_rule.FrontRule`)."""


def scheduled_model(state: AppState, model: str, version: str | None) -> Any:
    """The scheduled model whose `expected_wait` `shed_early` reads for a request to `model`
    (`version`: as the path names it, None: the default); ServiceError when that version is
    not ready."""
    _, worker = state.repository.ready(model, version)
    return worker.ctx.model  # type: ignore[attr-defined]


def shed_unread(state: AppState, call: Call) -> None:
    """`shed_early` before the body is read into a request (parsed, validated, tokenized):
    the model version the path names and the deadline its headers allow (a body may only
    shorten it), else nothing (the route's own answer then says what is wrong). Under 3x
    overload of 16-text classify a refusal after parsing and tokenizing cost ~0.7 ms of the
    API process's CPU; here it costs the route's match and the answer
    (docs/performance.md section 20). Where it cannot decide, `admit` raises what stopped it
    before its own shed."""
    try:
        _, worker = state.repository.ready(call.model, call.version)
        timeout = request_timeout(state, call)
    except ServiceError:
        return
    shed_early(state, worker.ctx.model, timeout, call.received)  # type: ignore[attr-defined]


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
    entry, worker, timeout = admit(state, call, kind, check, read)
    async with RequestCall(state, call, timeout) as context:
        return entry, await work(worker, context)


def admit(state: AppState, call: Call, kind: type[W] | None,
          check: Callable[[W], object] | None = None,
          read: Callable[[Call], None] | None = None) -> tuple[ModelEntry, W, float]:
    """What every request passes before its work, plain or streamed: the worker (`lookup`),
    `read`, the deadline's seconds, early shedding, `check` (module doc)."""
    entry, worker = lookup(state, call, kind)
    call.entry = entry
    if read is not None:
        read(call)
    timeout = request_timeout(state, call)
    if not call.shed or read is not None:  # (a body's own timeout may shorten the budget)
        shed_early(state, worker.ctx.model, timeout, call.received)  # type: ignore[attr-defined]
    if check is not None:
        check(worker)  # 4xx before any queueing
    return entry, worker, timeout


class RequestCall:
    """One request's `RequestContext` (deadline `timeout_s` from now, or the given
    `context`'s), kept where the transport says (Server-Timing and the request metrics read
    it), counted in flight, with `gone` the transport's disconnect future or a watcher task;
    `RequestContext.wait` waits on it directly. A class, not a generator-based context
    manager: that cost twice as much."""

    __slots__ = ("state", "call", "timeout_s", "context", "gauge", "gone", "watcher",
                 "started")

    def __init__(self, state: AppState, call: Call, timeout_s: float | None = None,
                 context: RequestContext | None = None) -> None:
        self.state, self.call, self.timeout_s = state, call, timeout_s
        self.context = context
        self.gauge: Any = None
        self.gone: asyncio.Future[Any] | None = None
        self.watcher: asyncio.Future[Any] | None = None
        self.started = 0.0

    async def __aenter__(self) -> RequestContext:
        return self.open()

    async def __aexit__(self, *exc: object) -> None:
        self.close(exc[1])  # type: ignore[arg-type]

    def open(self) -> RequestContext:
        """The request's context, counted in flight from now (`__aenter__`)."""
        state, call = self.state, self.call
        self.started = time.monotonic()
        context = self.context
        if context is None:
            seconds = request_timeout(state, call) if self.timeout_s is None else self.timeout_s
            since = time.monotonic() if call.received is None else call.received
            context = self.context = RequestContext(deadline=since + seconds)
        context.caller = call
        if call.keep is not None:
            call.keep["call"] = context
        gauge = self.gauge = state.metrics.child(state.metrics.in_flight, call.model) \
            if call.model in state.repository.entries else None
        if gauge is not None:
            state.metrics.tally.inc(gauge)
        gone = self.gone = call.gone
        if gone is not None:
            context.gone = gone
            gone.add_done_callback(context.client_left)
        elif call.watch is not None:  # another server: a task waits for the client to leave
            watcher = self.watcher = context.gone = asyncio.ensure_future(
                _watch(call.watch, context))
            watcher.add_done_callback(_quiet)
        return context

    def close(self, error: BaseException | object | None) -> None:
        """The request's end (`__aexit__`), `error` what ended it, if anything did."""
        context = self.context
        assert context is not None
        if self.gone is not None:
            self.gone.remove_done_callback(context.client_left)  # no reference cycle left
        elif self.watcher is not None:
            self.watcher.cancel()  # not awaited: it ends on the loop's next turn, holding nothing
            context.gone = None  # its CancelledError's frames hold `context`: no cycle
        if self.gauge is not None:
            self.state.metrics.tally.inc(self.gauge, -1.0)
        entry = self.call.entry
        if entry is not None:
            self.state.metrics.on_inference(entry.name, entry.version, error is None,
                                            time.monotonic() - self.started, context)
        context.caller = None  # the state (`keep`) holds the context for the access line,
        # and the call holds the state: freed with the answer, not by the collector


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
