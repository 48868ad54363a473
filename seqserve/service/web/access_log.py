"""Request ids, the access log and the one traceback of a server bug, as the request
lifecycle (`web.middleware.HttpLifecycle`) applies them to every request:

- every request gets an id: its `X-Request-Id` header when that is 1-128 characters of
  `[A-Za-z0-9._:/+=~-]`, else a new random one; the response carries it back in
  `X-Request-Id` and it is `scope["state"]["request_id"]` for the handlers;
- with `access_log`, one line per request (logger `seqserve.access`): method, route (the
  path template), model, version, status, queue/compute/total ms, request id, client. Client
  errors (4xx) are this one line, no traceback. Refusals (429, 503) are logged at most 10 a
  second per process, the next logged one saying how many were left out
  (`refusals_not_logged`; `RefusalLines`): the metrics count every one; a refusal whose line
  is left out may be answered from the request's head (`answer_head`, for the uvicorn
  protocol: `web/http_protocol.py`), one whose line is due goes the full path that logs it;
- an exception that escapes the routes (a server bug, answered 500 by the app's handler) is
  logged once, as that request's line with a short traceback (`seqserve.service.core.logs`);
  uvicorn's own copy of the same traceback ("Exception in ASGI application") is filtered out.
  One that escapes before any answer went out is answered by the lifecycle: the one error
  answer, a JSON 500 with the request id, not uvicorn's plain-text one;
- W3C trace context: a request's `traceparent` (version 00, a trace id and parent span id not
  all zeros) is continued, else a new trace is started (not sampled); the answer carries a
  `traceparent` naming this server's span of that trace (`Trace`), and the access line the
  trace id (`trace_id`), so a request is found in the log from any tracer's view of it;
- every 503 carries `Retry-After` (`with_retry_after`): one whose code set none (a version
  loading or failed, the readiness routes, a drain) gets `retry_after_s`, added where every
  answer passes.
"""

from __future__ import annotations

import contextlib
import logging
import math
import random
import re
import string
import time
from typing import Any

from starlette.types import Scope

from seqserve.service.core.answers import Headers, retry_after_value

log = logging.getLogger("seqserve.access")
HEADER = b"x-request-id"
ID_BYTES = string.ascii_letters.encode() + string.digits.encode() + b"._:/+=~-"
ID_MAX = 128
"""A client's X-Request-Id is kept when it is 1 to ID_MAX of these bytes (the native front
reads the same rule: `FrontRule`)."""
VALID_ID = re.compile(b"[%s]{1,%d}" % (re.escape(ID_BYTES), ID_MAX))
LOGGED = "_seqserve_logged"
"""Attribute set on an exception once its traceback is logged."""


def request_id(scope: Scope) -> str:
    """The client's X-Request-Id when it is a sane token, else a new one."""
    for name, value in scope.get("headers", []):
        if name == HEADER:
            if VALID_ID.fullmatch(value):
                return value.decode("ascii")
            break
    return new_id()


TRACEPARENT = re.compile(rb"00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})")
"""W3C trace context's `traceparent` header, version 00 (lower-case hex)."""


class Trace:
    """One request's place in a W3C trace: the trace it belongs to and this server's span
    (module doc)."""

    __slots__ = ("trace_id", "parent_id", "span_id", "flags")

    def __init__(self, value: bytes | str | None, sampled: bool = False) -> None:
        raw = value.encode("latin-1") if isinstance(value, str) else value
        found = TRACEPARENT.fullmatch(raw.strip()) if raw else None
        if found is not None and found[1] != b"0" * 32 and found[2] != b"0" * 16:
            self.trace_id, self.flags = found[1].decode(), found[3].decode()
            self.parent_id = found[2].decode()
        else:  # none, or not one we can continue: a new trace, sampled when spans are on
            self.trace_id = f"{random.getrandbits(128) or 1:032x}"
            self.flags, self.parent_id = ("01" if sampled else "00"), ""
        self.span_id = f"{random.getrandbits(64) or 1:016x}"

    @property
    def traceparent(self) -> str:
        """The answer's `traceparent`: this server's span as the parent of what follows."""
        return f"00-{self.trace_id}-{self.span_id}-{self.flags}"


def trace_of(scope: Scope, sampled: bool = False) -> Trace:
    """The request's trace (its `traceparent` header, else a new one: `sampled` when spans
    are recorded), made once per request and kept in the scope's state."""
    state = scope.setdefault("state", {})
    trace = state.get("trace")
    if trace is None:
        value = None
        for name, header in scope.get("headers", ()):
            if name == b"traceparent":
                value = header
                break
        trace = state["trace"] = Trace(value, sampled)
    return trace  # type: ignore[no-any-return]


UUID4_CLEAR = ~((0xF << 76) | (0x3 << 62))
UUID4_SET = (0x4 << 76) | (0x2 << 62)
"""The version (4) and variant (RFC 4122) bits of a version-4 UUID as an integer."""


def new_id() -> str:
    """A random version-4 UUID as 32 hex digits (`uuid.uuid4().hex`), from the process's
    Mersenne Twister (reseeded in a forked child by `random` itself): a request id
    correlates, it guards nothing, and `os.urandom`'s system call per request was ~6% of an
    API process's event loop at 3x overload (docs/performance.md section 20)."""
    return f"{random.getrandbits(128) & UUID4_CLEAR | UUID4_SET:032x}"


class RefusalLines:
    """At most `per_s` access lines a second for refusals (429 and 503: overload, draining),
    each saying how many were left out before it: at 3x overload a line per refusal (2,000+
    a second) cost more than the refusal itself; every one is still counted in the request
    metrics (`seqserve_requests_total{status}`)."""

    __slots__ = ("per_s", "second", "lines", "hidden")

    def __init__(self, per_s: int = 10) -> None:
        self.per_s = per_s
        self.second = 0
        self.lines = 0
        self.hidden = 0

    def full(self, now: float) -> bool:
        """Whether a refusal at `now` would be left out (this second's lines are used)."""
        return int(now) == self.second and self.lines >= self.per_s

    def admit(self, now: float) -> int | None:
        """None: leave this refusal's line out; else log it, with this many left out
        since the last one logged."""
        second = int(now)
        if second != self.second:
            self.second, self.lines = second, 0
        if self.lines >= self.per_s:
            self.hidden += 1
            return None
        self.lines += 1
        hidden, self.hidden = self.hidden, 0
        return hidden


REFUSALS = frozenset({429, 503})


class _AlreadyLogged(logging.Filter):
    """Drops uvicorn's record of an exception this module already logged."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        return not getattr(exc, LOGGED, False)


def _filter_uvicorn_duplicates() -> None:
    logger = logging.getLogger("uvicorn.error")
    if not any(isinstance(f, _AlreadyLogged) for f in logger.filters):
        logger.addFilter(_AlreadyLogged())


RETRY_AFTER = b"retry-after"


def with_retry_after(status: int, headers: Headers, seconds: float) -> Headers:
    """`headers` with `Retry-After: seconds` added where the answer is a 503 without one."""
    if status != 503 or any(k.lower() == RETRY_AFTER for k, _ in headers):
        return headers
    return [*headers, (RETRY_AFTER, retry_after_value(seconds))]


class AccessLog:
    """The access lines of one app (module doc): `line` per answered request, `bug` for a
    server bug's; `due` says whether a refusal's line would be written now."""

    def __init__(self, *, enabled: bool = True) -> None:
        self.enabled = enabled
        self.refusals = RefusalLines()
        _filter_uvicorn_duplicates()

    def due(self, now: float) -> bool:
        """Whether a refusal answered at `now` would get its line (logging on, this second's
        refusal lines not used up)."""
        return self.enabled and log.isEnabledFor(logging.INFO) and not self.refusals.full(now)

    def quiet_until(self, now: float) -> float:
        """Until when a refusal's line is left out (`due` false), as of `now`: for ever with
        logging off, to the end of this second once its lines are used, else not at all
        (0: due now)."""
        if not (self.enabled and log.isEnabledFor(logging.INFO)):
            return math.inf
        return self.refusals.second + 1.0 if self.refusals.full(now) else 0.0

    def left_out(self, count: int) -> None:
        """`count` refusals answered elsewhere (a front's own) whose lines were left out: the
        next logged refusal's line says so."""
        self.refusals.hidden += count

    def line(self, scope: Scope, rid: str, code: int, start: float) -> None:
        """The request's access line, unless logging is off or it is a refusal left out."""
        if self.enabled and log.isEnabledFor(logging.INFO):  # no fields built for nothing
            hidden = 0
            if code in REFUSALS:
                left_out = self.refusals.admit(start)
                if left_out is None:
                    return
                hidden = left_out
            self._log(scope, rid, code, start, None, hidden)

    def bug(self, scope: Scope, rid: str, start: float, exc: Exception) -> None:
        """The line of a request a server bug ended, with its short traceback (once)."""
        self._log(scope, rid, 500, start, exc)

    def _log(self, scope: Scope, rid: str, status: int, start: float,
             exc: Exception | None, hidden: int = 0) -> None:
        fields = access_fields(scope, rid, status, time.monotonic() - start)
        message = f'{fields["method"]} {fields["route"]} {status}'
        if hidden:
            fields["refusals_not_logged"] = hidden
            message += f" ({hidden} more refusals not logged before this one)"
        if exc is None:  # `log.info` without its search of the caller's frame (unused here)
            log.handle(log.makeRecord(log.name, logging.INFO, "(unknown file)", 0, message, (),
                                      None, extra={"fields": fields}))
            return
        log.error(message + " (server bug)", exc_info=exc, extra={"fields": fields})
        with contextlib.suppress(AttributeError):  # no attributes: uvicorn logs it too
            setattr(exc, LOGGED, True)


def route_of(scope: Scope) -> str:
    """The request's route as a path template (the hot path's or FastAPI's), "unmatched"
    when no route took it."""
    route = scope.get("route")
    return str(scope.get("route_path") or getattr(route, "path", None) or "unmatched")


def access_fields(scope: Scope, rid: str, status: int, seconds: float) -> dict[str, Any]:
    """The access-log fields of one finished request."""
    params = scope.get("path_params") or {}
    call = (scope.get("state") or {}).get("call")
    client = scope.get("client")
    return {
        "method": scope.get("method", ""),
        "route": route_of(scope),
        "model": str(params.get("name", ""))[:128],
        "version": str(params.get("version", ""))[:32],
        "status": status,
        "queue_ms": round(call.queue_s * 1000, 3) if call else 0.0,
        "compute_ms": round(call.compute_s * 1000, 3) if call else 0.0,
        "total_ms": round(seconds * 1000, 3),
        "request_id": rid,
        "trace_id": trace_of(scope).trace_id,
        "client": f"{client[0]}:{client[1]}" if client else "",
    }
