"""The gRPC front's share of every call: what the HTTP request lifecycle does for a request.

`Front.run` is, for one RPC (or one request of a stream), what `web/middleware.py`
`HttpLifecycle` (with `web/access_log.py` and `web/auth.py`) is for an HTTP request, and
hands the work a transport-neutral `lifecycle.Call`:

- a request id: the `x-request-id` metadata when it is a sane token, else a new one (sent
  back as trailing metadata of a unary RPC), and W3C trace context: the `traceparent`
  metadata continued (else a new trace), this server's span sent back as `traceparent`
  trailing metadata of a unary RPC, the trace id in the access line (`web.access_log.Trace`);
- API keys (when on): `authorization: Bearer KEY` metadata, compared as HTTP compares them
  (`web.auth`); the health RPCs (ServerLive, ServerReady, grpc.health.v1) stay open unless
  `auth_health`; else UNAUTHENTICATED before any work;
- `max_in_flight`: inference counts against the same per-process count as HTTP's
  (`AppState.admitted`), RESOURCE_EXHAUSTED beyond it;
- the deadline: the client's gRPC deadline (`grpc-timeout`) is the request's timeout (at most
  `request_timeout_s`; the OIP `timeout` parameter may shorten it), as X-Request-Timeout is;
  the RPC's end (a cancel, a hang-up) is the `Call`'s `gone`;
- the request metrics (`seqserve_requests_total`, durations, queue and compute time) with
  endpoint `grpc_<rpc>` and the HTTP status the outcome stands for (probes not counted, as
  over HTTP), and the access-log line (`seqserve.access`: method GRPC, route the RPC's path,
  `grpc_status`);
- every `ServiceError` becomes its gRPC status (`CODES`: 400 INVALID_ARGUMENT, 404 NOT_FOUND,
  429 and 413 RESOURCE_EXHAUSTED, 503 UNAVAILABLE, 504 DEADLINE_EXCEEDED, ...) with its
  message as details and `retry-after` trailing metadata where HTTP sends Retry-After; an
  unexpected exception is INTERNAL, its traceback logged once with the request id.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import grpc

from seqserve.service.api.lifecycle import Call
from seqserve.service.core.answers import bug_message, retry_after_value
from seqserve.service.core.errors import QueueFull, ServiceError
from seqserve.service.web.access_log import VALID_ID, Trace, new_id
from seqserve.service.web.auth import key_matches, load_keys
from seqserve.service.web.state import AppState

log = logging.getLogger("seqserve.access")
SC = grpc.StatusCode
CODES: dict[int, grpc.StatusCode] = {
    200: SC.OK, 400: SC.INVALID_ARGUMENT, 401: SC.UNAUTHENTICATED, 403: SC.PERMISSION_DENIED,
    404: SC.NOT_FOUND, 408: SC.DEADLINE_EXCEEDED, 409: SC.ABORTED,
    413: SC.RESOURCE_EXHAUSTED, 415: SC.INVALID_ARGUMENT, 422: SC.INVALID_ARGUMENT,
    429: SC.RESOURCE_EXHAUSTED, 499: SC.CANCELLED, 500: SC.INTERNAL, 501: SC.UNIMPLEMENTED,
    503: SC.UNAVAILABLE, 504: SC.DEADLINE_EXCEEDED,
}
"""The gRPC status of each HTTP status a `ServiceError` carries (409, a session's chunk
already in flight: ABORTED, a concurrency conflict to retry)."""


def code_of(status: int) -> grpc.StatusCode:
    """The gRPC status of an HTTP status (another 4xx: INVALID_ARGUMENT; 5xx: INTERNAL)."""
    found = CODES.get(status)
    if found is not None:
        return found
    return SC.INVALID_ARGUMENT if status < 500 else SC.INTERNAL


class Unauthenticated(ServiceError, status=401):
    """No valid API key in the call's metadata."""


@dataclass(frozen=True)
class Rpc:
    """One RPC of the front: its path, metrics endpoint and the rules it is served by."""

    path: str
    """`/package.Service/Method`: the access log's route."""
    endpoint: str
    """The request metrics' endpoint label."""
    traffic: bool = True
    """Counted in the request metrics (probes are not, as over HTTP)."""
    health: bool = False
    """A health RPC: open without a key unless `auth_health`."""
    inference: bool = False
    """Inference work: counted against `max_in_flight`."""


@dataclass(slots=True)
class Outcome:
    """How one request ended: its answer, or the status (HTTP's number) and message."""

    response: Any = None
    status: int = 200
    message: str = ""
    retry_after: float | None = None
    code: grpc.StatusCode | None = None
    """The gRPC status when the error names one (`grpc_code`), else `code_of(status)`."""


Work = Callable[[Call], Awaitable[Any]]


def metadata_of(context: Any) -> dict[str, str]:
    """The call's metadata, first value of each (lower-case) key; binary values left out."""
    out: dict[str, str] = {}
    for key, value in context.invocation_metadata() or ():
        if isinstance(value, str):
            out.setdefault(key.lower(), value)
    return out


def done_future(context: Any) -> asyncio.Future[Any]:
    """A future done when the RPC ends (cancelled by its client, deadline, or finished)."""
    gone: asyncio.Future[Any] = asyncio.get_running_loop().create_future()

    def ended(_: object) -> None:
        if not gone.done():
            gone.set_result(None)

    context.add_done_callback(ended)
    return gone


class Front:
    """The share of every call (module doc), for one app's state."""

    def __init__(self, state: AppState) -> None:
        self.state = state
        s = state.settings
        self.digests = load_keys(s.api_key, s.api_key_file) if s.keys_on else None
        self.auth_health = s.auth_health

    def authenticate(self, rpc: Rpc, metadata: dict[str, str]) -> None:
        """Unauthenticated unless the call may go on (module doc)."""
        if self.digests is None or rpc.health and not self.auth_health:
            return
        value = metadata.get("authorization", "").strip()
        scheme, _, key = value.partition(" ")
        if scheme.lower() != "bearer" or not key.strip():
            raise Unauthenticated("missing API key: send the metadata "
                                  "'authorization: Bearer <key>'")
        if not key_matches(key.strip().encode(), self.digests):
            raise Unauthenticated("invalid API key")

    async def unary(self, rpc: Rpc, context: Any, model: str, version: str | None,
                    work: Work) -> Any:
        """A unary RPC's answer, or its status (aborts the RPC)."""
        metadata = metadata_of(context)
        rid = request_id(metadata)
        trace = Trace(metadata.get("traceparent"))
        outcome = await self.run(rpc, context, model, version, work, metadata, rid,
                                 done_future(context), check_key=True, trace=trace)
        trailing: list[tuple[str, str]] = [("x-request-id", rid),
                                           ("traceparent", trace.traceparent)]
        if outcome.status == 200:
            context.set_trailing_metadata(tuple(trailing))
            return outcome.response
        retry = outcome.retry_after
        if retry is None and outcome.status == 503:  # every 503 says when (HTTP's too)
            retry = self.state.settings.retry_after_s
        if retry is not None:
            trailing.append(("retry-after", retry_after_value(retry).decode()))
        await context.abort(outcome.code or code_of(outcome.status), outcome.message,
                            tuple(trailing))

    async def opened(self, rpc: Rpc, context: Any) -> dict[str, str]:
        """A streaming RPC's start: its metadata once its key is checked (else the RPC ends
        UNAUTHENTICATED, logged and counted as one request)."""
        metadata = metadata_of(context)
        try:
            self.authenticate(rpc, metadata)
        except Unauthenticated as exc:
            rid = request_id(metadata)
            self.record(rpc, context, "", None, 401, 0.0, {}, rid)
            await context.abort(SC.UNAUTHENTICATED, exc.message, (("x-request-id", rid),))
        return metadata

    async def run(self, rpc: Rpc, context: Any, model: str, version: str | None, work: Work,
                  metadata: dict[str, str], rid: str, gone: asyncio.Future[Any],
                  check_key: bool, trace: Trace | None = None) -> Outcome:
        """One request: key, in-flight count, `work(call)`, metrics and access log; its
        outcome (a client gone or a deadline passed while it ran: recorded, re-raised).
        `trace`: its W3C trace context (None: from its `traceparent` metadata)."""
        start = time.monotonic()
        if trace is None:
            trace = Trace(metadata.get("traceparent"))
        keep: dict[str, Any] = {}
        outcome = Outcome()
        counted = False
        bug: Exception | None = None
        s = self.state.settings
        try:
            if check_key:
                self.authenticate(rpc, metadata)
            if rpc.inference:
                if self.state.in_flight() >= s.max_in_flight:
                    raise QueueFull("server overloaded: this process already works on "
                                    f"max_in_flight ({s.max_in_flight}) requests",
                                    retry_after=s.retry_after_s)
                self.state.admitted += 1
                counted = True
            call = Call(model, version, deadline_of(context), gone=gone, keep=keep,
                        header=lambda name: metadata.get(name.decode("latin-1")),
                        peer=context.peer().rpartition(":")[0])  # ipv4:ADDRESS:PORT
            outcome.response = await work(call)
        except ServiceError as exc:
            outcome = Outcome(None, exc.status, exc.message, exc.retry_after,
                              getattr(exc, "grpc_code", None))
        except asyncio.CancelledError:
            left = context.time_remaining()
            status = 504 if left is not None and left <= 0 else 499
            self.record(rpc, context, model, version, status, time.monotonic() - start, keep,
                        rid, trace=trace)
            raise
        except Exception as exc:  # a server bug: INTERNAL, its traceback logged once below
            bug = exc
            outcome = Outcome(None, 500, bug_message(exc))
        finally:
            if counted:
                self.state.admitted -= 1
        self.record(rpc, context, model, version, outcome.status, time.monotonic() - start,
                    keep, rid, bug, outcome.code, trace)
        return outcome

    def record(self, rpc: Rpc, context: Any, model: str, version: str | None, status: int,
               seconds: float, keep: dict[str, Any], rid: str,
               bug: Exception | None = None, code: grpc.StatusCode | None = None,
               trace: Trace | None = None) -> None:
        """The request metrics and the access-log line of one finished request."""
        call = keep.get("call")
        if rpc.traffic:
            label = "" if not model else (
                model if model in self.state.repository.entries else "unknown")
            self.state.metrics.on_request(label, rpc.endpoint, status, seconds, call)
        if bug is None and not (self.state.settings.access_log
                                and log.isEnabledFor(logging.INFO)):
            return
        fields = {
            "method": "GRPC", "route": rpc.path, "model": model[:128],
            "version": (version or "")[:32], "status": status,
            "grpc_status": (code or code_of(status)).name,
            "queue_ms": round(call.queue_s * 1000, 3) if call else 0.0,
            "compute_ms": round(call.compute_s * 1000, 3) if call else 0.0,
            "total_ms": round(seconds * 1000, 3), "request_id": rid,
            "trace_id": trace.trace_id if trace is not None else "",
            "client": _peer(context),
        }
        message = f"GRPC {rpc.path} {status}"
        if bug is not None:
            log.error(message + " (server bug)", exc_info=bug, extra={"fields": fields})
        else:
            log.info(message, extra={"fields": fields})


def request_id(metadata: dict[str, str]) -> str:
    """The client's x-request-id when it is a sane token, else a new one."""
    given = metadata.get("x-request-id")
    if given is not None and given.isascii() and VALID_ID.fullmatch(given.encode()):
        return given
    return new_id()


def deadline_of(context: Any) -> str | None:
    """The client's gRPC deadline as the request's own timeout in seconds (None: none)."""
    left = context.time_remaining()
    if left is None:
        return None
    return repr(max(float(left), 1e-6))


def _peer(context: Any) -> str:
    with contextlib.suppress(Exception):
        return str(context.peer())
    return ""
