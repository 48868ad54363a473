"""The pure-ASGI middleware in front of every route.

- refuses bodies over `max_body_bytes` before reading them (Content-Length) and caps streamed
  reads; a body must arrive within `body_timeout_s` (else 408, connection closed); the
  accepted body is buffered and replayed, later `receive()` calls reach the server (so a
  handler can still see `http.disconnect`);
- reads only what the routes understand (every POST route reads JSON): a POST body must be
  `application/json` or `application/*+json` (a charset, if given, UTF-8: what FastAPI reads
  as JSON) or have no content type (read as JSON), or,
  to an OIP infer route, `application/octet-stream` (the binary tensor extension: tritonclient
  sends it, or no type); any other type is a 415 before the body is read (`text/plain`, forms
  and `multipart/form-data` too: what a browser sends cross-site without a CORS preflight). A
  `gzip` or `deflate` body is decompressed, to `max_body_bytes` at most (more: 413, however
  small the body sent); any other content coding is a 415;
- while the server drains (the shutdown delay after SIGTERM) serves new work as usual but
  closes every connection after its answer (`Connection: close`: keep-alive clients move on
  to the endpoints that stay; the load balancer still routes some traffic here meanwhile);
- answers 429 + Retry-After at once to new inference work while this process already holds
  `max_in_flight` requests (HTTP and gRPC together: `AppState.admitted`), each counted from
  its headers on, while its body still arrives
  (the engine's admission cannot see a backlog that waits for the API process's own CPU);
- answers CORS preflights and adds the CORS headers to answers (`cors_origins`: see
  `seqserve.service.web.cors`), before the API-key and content-type checks;
- adds `Server-Timing` (queue, compute, total in ms) to every response;
- counts requests and observes durations into the app's metrics;
- `answer_head`: the same answer from a request's head alone, where the head decides it (a
  refusal: max_in_flight, or the route's own refusal of an overloaded model), for our uvicorn
  protocol to write without running the app (`web/http_protocol.py`); None wherever the body,
  CORS or the drain could change the answer.
"""

from __future__ import annotations

import asyncio
import re
import time
import zlib
from typing import TYPE_CHECKING, Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from seqserve.service.core.answers import Answer
from seqserve.service.web.cors import Cors
from seqserve.service.web.http_protocol import RECEIVED
from seqserve.service.web.responses import error_for, send_answer

if TYPE_CHECKING:
    from seqserve.service.web.state import AppState

NOT_TRAFFIC = ("/v2/health", "/metrics", "/health")
"""Probes and scrapes: not counted as traffic in the request metrics."""
INFERENCE = ("/v1/models/", "/v2/models/")
"""Paths whose POSTs are inference work (refused first under overload)."""
Refusal = tuple[int, str, float | None, list[tuple[bytes, bytes]]]
"""Status, message, Retry-After and extra headers of an answer the middleware gives itself
(written by the one error answer, `seqserve.service.web.responses.error_for`)."""


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
            return 400, f"request body is not valid {coding.decode()} data", None, []
        size += len(chunk)
        if size > limit:
            return (413, f"request body exceeds max_body_bytes ({limit}) once decompressed",
                    None, [])
        out.append(chunk)
        if not stream.eof:
            return 400, f"request body is truncated {coding.decode()} data", None, []
        data = stream.unused_data
        if data and wbits != 31:
            return 400, f"request body has data after its {coding.decode()} stream", None, []
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


class ServingMiddleware:
    """See the module docstring."""

    def __init__(self, app: ASGIApp, state: AppState) -> None:
        self.app = app
        self.state = state
        origins = state.settings.cors_origins
        self.cors = Cors(origins) if origins else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = scope.get("extensions", {}).get(RECEIVED) or time.monotonic()
        status = {"code": 500, "observed": 0}
        origin = self.cors.origin(scope) if self.cors is not None else None
        if self.cors is not None and origin is not None:
            send = self.cors.sending(send, origin)
        send_timed = self._timed_send(scope, send, start, status)
        try:
            if self.cors is not None and origin is not None and self.cors.is_preflight(scope):
                scope["endpoint_name"] = "cors_preflight"  # before keys, body and 415
                await send_answer(send_timed, self.cors.preflight(scope, origin))
                return
            await self._serve(scope, receive, send_timed)
        finally:
            if not status["observed"]:  # no response went out (an exception escaped)
                self._observe(scope, status["code"], time.monotonic() - start)

    async def _serve(self, scope: Scope, receive: Receive, send_timed: Send) -> None:
        post = scope["method"] == "POST"
        inference = post and scope["path"].startswith(INFERENCE)
        media, coding = JSON, b""
        unread: Refusal | None = None
        if post:
            kind = _body_kind(scope)
            if isinstance(kind, str):
                unread = 415, kind, None, []
            else:
                media, coding = kind
        answer = unread or self._refusal(scope, inference)
        counted = inference and answer is None
        self.state.admitted += counted  # before the body is read: slow bodies count too
        try:
            got = await self._body_or_refusal(scope, receive, coding) if answer is None else b""
            if isinstance(got, tuple):
                answer = got
            if answer is not None:
                code, message, retry_after, extra = answer
                await send_answer(send_timed, error_for(scope, code, message,
                                                        retry_after=retry_after, headers=extra))
                return
            body = got if isinstance(got, bytes) else b""
            if not media or coding:
                _as_read(scope, media, coding, len(body))
            scope[BODY] = body
            await self.app(scope, _replay(body, receive), send_timed)
        finally:
            self.state.admitted -= counted

    def answer_head(self, scope: Scope) -> Answer | None:
        """The answer `__call__` gives an inference POST, from its head alone: a refusal
        (max_in_flight here, or the app's own `answer_head`: an overloaded model), with its
        Server-Timing and counted in the metrics; None when the full path must answer: a
        body it would refuse by type, coding or announced size (those answers come first
        there), a CORS request, the drain (its `Connection: close`)."""
        if scope["method"] != "POST" or not scope["path"].startswith(INFERENCE) \
                or self.state.draining:
            return None
        if self.cors is not None and self.cors.origin(scope) is not None:
            return None
        start = time.monotonic()
        refusal = self._refusal(scope, True)
        answer: Answer | None
        if refusal is not None:
            code, message, retry_after, extra = refusal
            answer = error_for(scope, code, message, retry_after=retry_after, headers=extra)
        else:
            inner = getattr(self.app, "answer_head", None)
            answer = inner(scope) if inner is not None else None
            if answer is None:  # (most requests: asked first, the checks below only then)
                return None
        if isinstance(_body_kind(scope), str) or _announced_over(
                scope, self.state.settings.max_body_bytes):
            return None  # the full path's 415 / 413 come first
        status, headers, body = answer
        self._observe(scope, status, time.monotonic() - start)
        headers = [h for h in headers if h[0] != b"server-timing"]
        headers.append((b"server-timing", _timing(scope, start)))
        return status, headers, body

    @property
    def admitted(self) -> int:
        """Inference requests this process works on (`AppState.admitted`: HTTP and gRPC)."""
        return self.state.admitted

    def _refusal(self, scope: Scope, inference: bool) -> Refusal | None:
        """429 beyond max_in_flight (draining refuses nothing: see the module doc)."""
        s = self.state.settings
        if inference and self.state.admitted >= s.max_in_flight:
            return (429, "server overloaded: this process already works on max_in_flight "
                    f"({s.max_in_flight}) requests", s.retry_after_s, [])
        return None

    async def _body_or_refusal(self, scope: Scope, receive: Receive,
                               coding: bytes) -> bytes | Refusal:
        """The whole body (decompressed: `coding`), or the answer to a body too slow (408),
        too large (413) or not of its coding (400)."""
        s = self.state.settings
        try:
            async with asyncio.timeout(s.body_timeout_s):
                body = await self._read_body(scope, receive)
        except TimeoutError:
            return (408, f"request body did not arrive within {s.body_timeout_s:g} s "
                    "(body_timeout_s)", None, [(b"connection", b"close")])
        if body is None:
            return 413, f"request body exceeds max_body_bytes ({s.max_body_bytes})", None, []
        return _decoded(body, coding, s.max_body_bytes) if coding else body

    async def _read_body(self, scope: Scope, receive: Receive) -> bytes | None:
        """The whole body, or None when it is (or announces itself) over the limit."""
        limit = self.state.settings.max_body_bytes
        if _announced_over(scope, limit):
            return None
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

    def _timed_send(self, scope: Scope, send: Send, start: float, status: dict[str, int]) -> Send:
        async def wrapped(message: Message) -> None:
            if message["type"] == "http.response.start":
                status["code"] = int(message["status"])
                status["observed"] = 1  # before the client can see the answer
                self._observe(scope, status["code"], time.monotonic() - start)
                headers = [h for h in message.get("headers", []) if h[0] != b"server-timing"]
                headers.append((b"server-timing", _timing(scope, start)))
                if self.state.draining and not any(h[0] == b"connection" for h in headers):
                    headers.append((b"connection", b"close"))  # no reuse of a closing server
                message = {**message, "headers": headers}
            await send(message)

        return wrapped

    def _observe(self, scope: Scope, status: int, seconds: float) -> None:
        if scope["path"].startswith(NOT_TRAFFIC):
            return  # probes and scrapes are not traffic: a draining pod's 503 probes no error
        endpoint = scope.get("endpoint_name") or getattr(scope.get("route"), "name", None)
        name = scope.get("path_params", {}).get("name")
        model = ""
        if name is not None:
            model = name if name in self.state.repository.entries else "unknown"
        requests, duration, queue, compute = self.state.metrics.request_series(
            model, endpoint or "unmatched", status)
        requests.inc()
        duration.observe(seconds)
        call = scope.get("state", {}).get("call")
        if call is not None and call.computed:
            queue.observe(call.queue_s)
            compute.observe(call.compute_s)


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
