"""The one lifecycle of an HTTP request (`HttpLifecycle`), the pure-ASGI middleware in front
of every route: what every request passes, in this order, whatever route answers it.

- the request id and the access line (`web.access_log`): the id is the client's
  `X-Request-Id` when sane, else a new one, and goes back on the answer; one access line per
  answered request; a server bug's line carries its traceback and, when nothing was
  answered yet, the request gets the one JSON 500;
- CORS (`cors_origins`: see `seqserve.service.web.cors`): a preflight is answered first, before
  the API-key and content-type checks, and every answer to an allowed origin carries the
  CORS headers;
- the head's decision (`_head`), one for every front: a POST body must be `application/json`
  or `application/*+json` (a charset, if given, UTF-8: what FastAPI reads as JSON) or have
  no content type (read as JSON), or, to an OIP infer route, `application/octet-stream`
  (the binary tensor extension: tritonclient sends it, or no type); any other type is a 415
  before the body is read (`text/plain`, forms and `multipart/form-data` too: what a browser
  sends cross-site without a CORS preflight), and so is a content coding other than `gzip`,
  `deflate` and identity; new inference work while this process already holds
  `max_in_flight` requests (HTTP and gRPC together: `AppState.in_flight`, each counted from
  its headers on, while its body still arrives, at the native front too: the engine's
  admission cannot see a backlog that waits for the API process's own CPU) gets 429 +
  Retry-After at once; a body announced
  over `max_body_bytes` a 413; a protected path without a valid API key a 401
  (`web.auth.Keys`); then the route's own decision from the head (the app's `head`: an
  overloaded model's 429, `api/hot_path.py`);
- the body: it must arrive within `body_timeout_s` (else 408, connection closed) and stay
  under `max_body_bytes` (a streamed one is cut there: 413); a `gzip` or `deflate` body is
  decompressed, to `max_body_bytes` at most (more: 413, however small the body sent). It is
  read once, kept in the scope (`BODY`) and replayed; later `receive()` calls reach the
  server (so a handler can still see `http.disconnect`);
- every answer leaves with its `Server-Timing` (queue, compute, total in ms), the CORS
  headers, Retry-After on a 503 that has none, the request id, its `traceparent` (W3C trace
  context: `web.access_log.Trace`), and, while the server drains
  (the shutdown delay after SIGTERM: new work is served as usual), `Connection: close`
  (keep-alive clients move on to the endpoints that stay; the load balancer still routes
  some traffic here meanwhile); it is counted in the request metrics before the client can
  see it (a refusal the native front writes itself, `FrontRule`: on the loop's next turn,
  within 10 ms, before any request the process takes after it).

`answer_head` is the same decision for a front that can answer a request before running the
app (our uvicorn protocol, `web/http_protocol.py`; the native front): the answer `__call__`
gives, when it is a refusal (429) from the head alone whose access line is not due; else
None, and the full path answers from the decision already made (kept in the scope), the drain
and CORS requests included. `front_rule` is that refusal's rule for a front that writes it
without a call into Python per request (the native front: `FrontRule`).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import re
import time
import zlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from seqserve.service.core.answers import Answer, Headers, bug_message
from seqserve.service.web.access_log import (
    AccessLog,
    request_id,
    route_of,
    trace_of,
    with_retry_after,
)
from seqserve.service.web.auth import Keys
from seqserve.service.web.cors import Cors
from seqserve.service.web.front_rule import FrontRule
from seqserve.service.web.http_protocol import BODY_LATE, RECEIVED
from seqserve.service.web.responses import error_for, request_id_of, send_answer
from seqserve.service.web.tracing import Spans

if TYPE_CHECKING:
    from seqserve.service.web.state import AppState

NOT_TRAFFIC = ("/v2/health", "/metrics", "/health")
"""Probes and scrapes: not counted as traffic in the request metrics."""
INFERENCE = ("/v1/models/", "/v2/models/")
"""Paths whose POSTs are inference work (refused first under overload)."""
Refusal = tuple[int, str, list[tuple[bytes, bytes]]]
"""Status, message and extra headers of a body's refusal (written by the one error answer,
`seqserve.service.web.responses.error_for`)."""
HEAD = "seqserve.head"
"""The scope key of the head's decision (`HttpLifecycle._head`) when `answer_head` made it and
left the answer to the full path."""
COUNTED = "seqserve.counted"
"""The scope key saying that `answer_head` admitted the request and counted it in flight."""
KIND = "seqserve.kind"
"""The scope key of the body kind `answer_head` read (`_body_kind`), which `answer_now` reads
again from there (the same headers)."""
REQUEST_ID = b"x-request-id"
TRACEPARENT = b"traceparent"
OWN = frozenset({b"server-timing", REQUEST_ID, TRACEPARENT})
"""The answer's headers the lifecycle writes itself (`_finish`), whatever the route set."""


BODY = "seqserve.body"
"""The scope key of the request's whole body, read once here (the hot path takes it from the
scope; FastAPI's routes get it replayed as one message)."""
JSON = b"application/json"
BINARY = b"application/octet-stream"
OIP_INFER = re.compile(r"^/v2/models/[^/]+(?:/versions/[^/]+)?/infer$")
"""The routes that also read `application/octet-stream` (OIP's binary tensor extension)."""
UTF8 = (b"utf-8", b"utf8")
WBITS = {b"gzip": 31, b"x-gzip": 31, b"deflate": 15}
"""The content codings read, with zlib's `wbits` (deflate: zlib's format, as HTTP means it;
raw deflate streams are read too)."""


def _body_kind(scope: Scope) -> tuple[bytes, bytes] | str:
    """A POST body's media type (b"": none given) and content coding (b"": none or identity),
    or why it is refused (415): see the module doc."""
    kind = b""
    codings: list[bytes] = []
    seen = False
    for k, v in scope["headers"]:
        if k == b"content-type" and not seen:
            kind, seen = v, True
        elif k == b"content-encoding":
            codings += [c.strip().lower() for c in v.split(b",")]
    media, _, params = kind.partition(b";")
    media = media.strip().lower()
    if media == JSON or media.startswith(b"application/") and media.endswith(b"+json"):
        for param in params.split(b";"):
            name, _, value = param.partition(b"=")
            if name.strip().lower() == b"charset" and \
                    value.strip().strip(b'"').lower() not in UTF8:
                return (f"unsupported charset in content type {_shown(kind)}: JSON bodies are "
                        "read as UTF-8")
    elif media and not (media == BINARY and OIP_INFER.match(scope["path"])):
        also = (", or application/octet-stream (the binary tensor extension)"
                if OIP_INFER.match(scope["path"]) else "")
        return (f"unsupported content type {_shown(kind)}: this route reads JSON "
                "(application/json or application/*+json, UTF-8; also when no content type "
                f"is given){also}")
    codings = [c for c in codings if c and c != b"identity"]
    if len(codings) > 1 or codings and codings[0] not in WBITS:
        return (f"unsupported content encoding {_shown(b', '.join(codings))}: gzip, deflate "
                "and identity are read")
    return media, codings[0] if codings else b""


def _shown(value: bytes) -> str:
    text = value.decode("latin-1")
    return repr(text if len(text) <= 80 else text[:80] + "...")


def _decoded(body: bytes, coding: bytes, limit: int) -> bytes | Refusal:
    """A gzip or deflate body decompressed, or the answer to one over `limit` once
    decompressed (413: a decompression bomb never takes more) or not of its coding (400).
    Several gzip members are read one after the other, as gzip reads them."""
    if not body:
        return body
    wbits = WBITS[coding]
    out: list[bytes] = []
    size = 0
    data = body
    while data:
        stream = zlib.decompressobj(wbits)
        try:
            chunk = stream.decompress(data, limit - size + 1)  # at most one byte too many
        except zlib.error:
            if wbits == 15 and not out:  # deflate without zlib's header: a raw stream
                wbits = -15
                continue
            return 400, f"request body is not valid {coding.decode()} data", []
        size += len(chunk)
        if size > limit:
            return 413, f"request body exceeds max_body_bytes ({limit}) once decompressed", []
        out.append(chunk)
        if not stream.eof:
            return 400, f"request body is truncated {coding.decode()} data", []
        data = stream.unused_data
        if data and wbits != 31:
            return 400, f"request body has data after its {coding.decode()} stream", []
    return b"".join(out)


def _as_read(scope: Scope, media: bytes, coding: bytes, size: int) -> None:
    """The request's headers as the routes read its body: a body with no content type is
    JSON (`model_validate_json`, not a guess from the bytes), a decompressed one has no
    content coding and its own length. Changes `scope` in place: the router records the
    matched route in this same dict, which the request metrics read."""
    drop = {b"content-encoding", b"content-length"} if coding else set()
    headers = [(k, v) for k, v in scope["headers"] if k not in drop]
    if not media:
        headers = [(k, v) for k, v in headers if k != b"content-type"]
        headers.append((b"content-type", JSON))
    if coding:
        headers.append((b"content-length", str(size).encode()))
    scope["headers"] = headers


class HttpLifecycle:
    """See the module docstring."""

    def __init__(self, app: ASGIApp, state: AppState, keys: Keys | None = None) -> None:
        self.app = app
        self.state = state
        s = state.settings
        self.cors = Cors(s.cors_origins, s.cors_headers, s.cors_expose_headers) \
            if s.cors_origins else None
        self.keys = keys
        self.log = AccessLog(enabled=s.access_log)
        self.spans = Spans.of(s)
        self.inner_head: Callable[[Scope], Answer | None] | None = getattr(app, "head", None)
        self.inner_direct: Callable[[Scope], Any] | None = getattr(app, "direct", None)
        self.inner_begin: Callable[..., None] | None = getattr(app, "begin", None)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start, rid = self._started(scope)
        origin = self.cors.origin(scope) if self.cors is not None else None
        status = [0, 0]  # the answer's status, whether it was observed in the metrics

        async def finishing(message: Message) -> None:
            if message["type"] == "http.response.start":
                code = status[0] = int(message["status"])
                status[1] = 1  # before the client can see the answer
                message = {**message, "headers": self._leaving(
                    scope, rid, code, message.get("headers", []), start, origin)}
            await send(message)

        try:
            await self._serve(scope, receive, finishing, origin)
        except Exception as exc:
            self.log.bug(scope, rid, start, exc)
            if not status[0]:  # nothing answered it (a bug outside the routes' handlers)
                with contextlib.suppress(Exception):  # the client may be gone already
                    await send_answer(finishing, error_for(scope, 500, bug_message(exc)))
            raise
        finally:
            if not status[1]:  # no response went out
                self._observe(scope, status[0] or 500, time.monotonic() - start)
            if self.spans is not None:
                self._end_span(scope, status[0] or 500)
        self.log.line(scope, rid, status[0], start)

    async def _serve(self, scope: Scope, receive: Receive, send: Send,
                     origin: bytes | None) -> None:
        if origin is not None and self.cors is not None and self.cors.is_preflight(scope):
            scope["endpoint_name"] = "cors_preflight"  # before keys, body and 415
            await send_answer(send, self.cors.preflight(scope, origin))
            return
        post = scope["method"] == "POST"
        inference = post and scope["path"].startswith(INFERENCE)
        kind = _body_kind(scope) if post else (JSON, b"")
        answer, counted = self._decide(scope, kind, inference)
        try:
            if answer is not None or isinstance(kind, str):
                await send_answer(send, answer or error_for(scope, 415, str(kind)))
                return
            media, coding = kind
            got = await self._body_or_refusal(scope, receive)
            if not isinstance(got, tuple):
                got = self._as_body(scope, got, media, coding)
            if isinstance(got, tuple):
                code, message, extra = got
                await send_answer(send, error_for(scope, code, message, headers=extra))
                return
            await self.app(scope, _replay(got, receive), send)
        finally:
            self.state.admitted -= counted

    def answer_now(self, scope: Scope, body: bytes,
                   write: Callable[[int, list[tuple[bytes, bytes]], bytes], None]) -> bool:
        """The lifecycle of a request whose whole body a front read (the native front), run
        without a task where its route answers from callbacks (the app's `direct` and
        `begin`: `api/hot_path.py`): the same steps as `__call__` (the head's decision, the
        body's coding and limit, the route, the answer's headers, metrics, access line and
        span) with the answer given to `write` when it is known. False, and nothing done:
        the front runs the app (another route, a CORS request)."""
        if self.inner_direct is None or self.inner_begin is None:
            return False
        found = self.inner_direct(scope)
        if found is None or self.cors is not None and self.cors.origin(scope) is not None:
            return False
        start, rid = self._started(scope)
        counted = [0]  # 1: counted in flight; -1: answered
        done = functools.partial(self._answered, scope, rid, start, counted, write)
        try:
            self._now(scope, body, found, counted, done)
        except Exception as exc:  # a bug outside the route's own handling: its 500
            done(exc)
        return True

    def _now(self, scope: Scope, body: bytes, found: Any, counted: list[int],
             done: Callable[[Answer | Exception], None]) -> None:
        """`answer_now` from the head's decision on: the answer goes to `done`, now or when
        the route's work is done."""
        kind = scope.pop(KIND) if KIND in scope else _body_kind(scope)
        answer, admitted = self._decide(scope, kind, True)
        counted[0] = int(admitted)
        if isinstance(kind, str) or answer is not None:
            done(answer or error_for(scope, 415, str(kind)))
            return
        got = self._as_body(scope, body, *kind)
        if isinstance(got, tuple):
            code, message, extra = got
            done(error_for(scope, code, message, headers=extra))
            return
        assert self.inner_begin is not None
        self.inner_begin(scope, got, found, done)

    def _answered(self, scope: Scope, rid: str, start: float, counted: list[int],
                  write: Callable[[int, list[tuple[bytes, bytes]], bytes], None],
                  answer: Answer | Exception) -> None:
        """`answer_now`'s end: as `__call__` ends a request (a bug's traceback logged, its
        JSON 500 answered). Once: a second call (a bug after the answer) only logs."""
        if counted[0] < 0:
            if isinstance(answer, Exception):
                self.log.bug(scope, rid, start, answer)
            return
        self.state.admitted -= counted[0]
        counted[0] = -1
        bug = isinstance(answer, Exception)
        if isinstance(answer, Exception):
            self.log.bug(scope, rid, start, answer)
            answer = error_for(scope, 500, bug_message(answer))
        status, headers, payload = answer
        write(status, self._leaving(scope, rid, status, headers, start, None), payload)
        if self.spans is not None:
            self._end_span(scope, status)
        if not bug:  # (a bug's line is its traceback's)
            self.log.line(scope, rid, status, start)

    def _started(self, scope: Scope) -> tuple[float, str]:
        """When the request started (the front's stamp when it reads requests itself) and
        its id (the head's, when `answer_head` asked), kept in its state."""
        start = scope.get("extensions", {}).get(RECEIVED) or time.monotonic()
        rid = request_id_of(scope) or request_id(scope)
        scope.setdefault("state", {})["request_id"] = rid
        return start, rid

    def _decide(self, scope: Scope, kind: tuple[bytes, bytes] | str,
                inference: bool) -> tuple[Answer | None, bool]:
        """The head's decision (`_head`, or the one `answer_head` made and kept in the
        scope; none for a body that came late: its 408 is due) and whether the request
        counts in flight: from now on, before its body is read (slow bodies count too),
        unless `answer_head` counted it already."""
        late = BODY_LATE in scope.get("extensions", ())
        answer = scope.pop(HEAD) if HEAD in scope else \
            None if late else self._head(scope, kind, inference)
        counted = inference and answer is None
        if not scope.pop(COUNTED, False):
            self.state.admitted += counted
        return answer, counted

    def _as_body(self, scope: Scope, body: bytes, media: bytes,
                 coding: bytes) -> bytes | Refusal:
        """A whole body as the routes read it: within `max_body_bytes`, decompressed
        (`coding`), the headers as read (`_as_read`), kept in the scope (`BODY`); or its
        refusal (413, 400)."""
        limit = self.state.settings.max_body_bytes
        if len(body) > limit:
            return 413, f"request body exceeds max_body_bytes ({limit})", []
        if coding:
            decoded = _decoded(body, coding, limit)
            if isinstance(decoded, tuple):
                return decoded
            body = decoded
        if not media or coding:
            _as_read(scope, media, coding, len(body))
        scope[BODY] = body
        return body

    def _leaving(self, scope: Scope, rid: str, status: int, headers: Headers, start: float,
                 origin: bytes | None) -> list[tuple[bytes, bytes]]:
        """An answer as it leaves: counted in the request metrics (before the client can
        see it), with its headers (`_finish`)."""
        self._observe(scope, status, time.monotonic() - start)
        return self._finish(scope, rid, status, headers, start, origin)

    def _head(self, scope: Scope, kind: tuple[bytes, bytes] | str,
              inference: bool) -> Answer | None:
        """The one answer a request gets from its head alone, in this order: 415 (a body
        this route does not read), 429 beyond max_in_flight, 413 (a Content-Length over
        max_body_bytes), 401 (API keys), then the route's own (`head` of the app inside: an
        overloaded model's 429); None: the body is read and the route answers."""
        s = self.state.settings
        if isinstance(kind, str):
            return error_for(scope, 415, kind)
        if inference and self.state.in_flight() >= s.max_in_flight:
            return error_for(scope, 429, "server overloaded: this process already works on "
                             f"max_in_flight ({s.max_in_flight}) requests",
                             retry_after=s.retry_after_s)
        if _announced_over(scope, s.max_body_bytes):
            return error_for(scope, 413,
                             f"request body exceeds max_body_bytes ({s.max_body_bytes})")
        if self.keys is not None:
            refused = self.keys.refusal(scope)
            if refused is not None:
                return refused
        return self.inner_head(scope) if self.inner_head is not None else None

    def answer_head(self, scope: Scope) -> Answer | None:
        """The answer `__call__` gives an inference POST from its head alone (`_head`), for
        a front to write without running the app (`web/http_protocol.py`, the native front),
        when it is a refusal (429) whose access line is not due now; None otherwise: the
        full path then answers, from the same decision (kept in the scope), a CORS request
        and the drain (its `Connection: close`) included."""
        if scope["method"] != "POST" or not scope["path"].startswith(INFERENCE) \
                or self.state.draining:
            return None
        if self.cors is not None and self.cors.origin(scope) is not None:
            return None
        start = time.monotonic()
        if self.log.due(start):  # the full path logs it, with what only it knows (the client
            return None  # behind a proxy)
        rid = request_id(scope)
        scope.setdefault("state", {})["request_id"] = rid
        kind = scope[KIND] = _body_kind(scope)
        answer = scope[HEAD] = self._head(scope, kind, True)
        if answer is None:  # admitted: counted from now on, as a front may decide on the
            self.state.admitted += 1  # heads of several requests before it runs any
            scope[COUNTED] = True
            return None
        if answer[0] != 429:
            return None
        del scope[HEAD]
        status, headers, body = answer
        self._observe(scope, status, time.monotonic() - start)
        self.log.line(scope, rid, status, start)  # (a refusal left out: counted, not logged)
        headers = self._finish(scope, rid, status, headers, start, None)
        if self.spans is not None:
            self._end_span(scope, status)
        return status, headers, body

    def _finish(self, scope: Scope, rid: str, status: int, headers: Headers, start: float,
                origin: bytes | None) -> list[tuple[bytes, bytes]]:
        """An answer's headers as they leave: its Server-Timing, `Connection: close` while
        draining, the CORS headers (`origin`), a 503's Retry-After, the request id and the
        trace context (`web.access_log.Trace`)."""
        out = [h for h in headers if h[0] not in OWN]
        out.append((b"server-timing", _timing(scope, start)))
        if self.state.draining and not any(h[0] == b"connection" for h in out):
            out.append((b"connection", b"close"))  # no reuse of a closing server
        if origin is not None and self.cors is not None:
            extra = self.cors.extra(origin)
            names = {name for name, _ in extra if name != b"vary"}  # Vary adds up
            out = [*(h for h in out if h[0] not in names), *extra]
        out = with_retry_after(status, out, self.state.settings.retry_after_s)
        out.append((REQUEST_ID, rid.encode()))
        trace = trace_of(scope, self.spans is not None)
        if self.spans is not None:  # (the span's sampling decides the flags written)
            scope["state"]["span"] = self.spans.start(
                trace, f"{scope.get('method', '')} {route_of(scope)}", start)
        out.append((TRACEPARENT, trace.traceparent.encode()))
        return out

    def _end_span(self, scope: Scope, status: int) -> None:
        """End the request's span (`web.tracing`), if it has one."""
        state = scope.get("state") or {}
        span = state.pop("span", None)
        if span is not None and self.spans is not None:
            params = scope.get("path_params") or {}
            self.spans.end(span, status, {
                "http.request.method": scope.get("method", ""), "http.route": route_of(scope),
                "seqserve.model": str(params.get("name", "")),
                "seqserve.version": str(params.get("version", "")),
                "seqserve.request_id": state.get("request_id", "")}, state.get("call"))

    @property
    def admitted(self) -> int:
        """Inference requests this process counts against `max_in_flight` (HTTP and gRPC:
        `AppState.in_flight`, bodies still arriving at a native front included)."""
        return self.state.in_flight()

    async def _body_or_refusal(self, scope: Scope, receive: Receive) -> bytes | Refusal:
        """The whole body as sent, or the answer to a body too slow (408) or too large
        (413)."""
        s = self.state.settings
        extensions = scope.get("extensions", {})
        read = extensions.get(RECEIVED)  # (a front that reads bodies itself)
        left = s.body_timeout_s - (0.0 if read is None else time.monotonic() - read)
        try:
            if BODY_LATE in extensions:
                raise TimeoutError
            async with asyncio.timeout(left):
                body = await self._read_body(receive)
        except TimeoutError:
            return (408, f"request body did not arrive within {s.body_timeout_s:g} s "
                    "(body_timeout_s)", [(b"connection", b"close")])
        if body is None:
            return 413, f"request body exceeds max_body_bytes ({s.max_body_bytes})", []
        return body

    async def _read_body(self, receive: Receive) -> bytes | None:
        """The whole body, or None when it is over the limit."""
        limit = self.state.settings.max_body_bytes
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                break  # disconnected while sending the body
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                return None
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        return b"".join(chunks)

    def _observe(self, scope: Scope, status: int, seconds: float) -> None:
        if scope["path"].startswith(NOT_TRAFFIC):
            return  # probes and scrapes are not traffic: a draining pod's 503 probes no error
        endpoint = scope.get("endpoint_name") or getattr(scope.get("route"), "name", None)
        name = scope.get("path_params", {}).get("name")
        model = ""
        if name is not None:
            model = name if name in self.state.repository.entries else "unknown"
        self.state.metrics.on_request(model, endpoint or "unmatched", status, seconds,
                                      scope.get("state", {}).get("call"))

    def front_rule(self) -> FrontRule | None:
        """The rule by which a front may write an overloaded model's 429 itself (`FrontRule`),
        or None where it may not: API keys (the 401 comes first) or spans (each refusal's
        span is Python's) configured, or an app without `head_routes`."""
        routes_of = getattr(self.app, "head_routes", None)
        waits_of = getattr(self.app, "head_waits", None)
        if self.keys is not None or self.spans is not None or routes_of is None \
                or waits_of is None:
            return None
        return FrontRule(self.state, self.cors is not None, self.log, routes_of,
                         waits_of)


def _announced_over(scope: Scope, limit: int) -> bool:
    """Whether a Content-Length of the request is over `limit` (or not a number)."""
    for key, value in scope.get("headers", []):
        if key == b"content-length":
            try:
                if int(value) > limit:
                    return True
            except ValueError:
                return True
    return False


def _timing(scope: Scope, start: float) -> bytes:
    """The Server-Timing value of a request that started at `start` (its call's queue and
    compute, in ms)."""
    call = scope.get("state", {}).get("call")
    queue_ms = call.queue_s * 1000 if call else 0.0
    compute_ms = call.compute_s * 1000 if call else 0.0
    total_ms = (time.monotonic() - start) * 1000
    return (f"queue;dur={queue_ms:.3f}, compute;dur={compute_ms:.3f}, "
            f"total;dur={total_ms:.3f}").encode()


def _replay(body: bytes, receive: Receive) -> Receive:
    sent = False

    async def replay() -> dict[str, Any]:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return dict(await receive())

    return replay
