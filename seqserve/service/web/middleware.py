"""The pure-ASGI middleware in front of every route.

- refuses bodies over `max_body_bytes` before reading them (Content-Length) and caps streamed
  reads; a body must arrive within `body_timeout_s` (else 408, connection closed); the
  accepted body is buffered and replayed, later `receive()` calls reach the server (so a
  handler can still see `http.disconnect`);
- while the server drains (the shutdown delay after SIGTERM) serves new work as usual but
  closes every connection after its answer (`Connection: close`: keep-alive clients move on
  to the endpoints that stay; the load balancer still routes some traffic here meanwhile);
- answers 429 + Retry-After at once to new inference work while this process already holds
  `max_in_flight` requests, each counted from its headers on, while its body still arrives
  (the engine's admission cannot see a backlog that waits for the API process's own CPU);
- adds `Server-Timing` (queue, compute, total in ms) to every response;
- counts requests and observes durations into the app's metrics.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

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


FORM_OR_NONE = (b"", b"application/x-www-form-urlencoded")
BODY = "seqserve.body"
"""The scope key of the request's whole body, read once here (the hot path takes it from the
scope; FastAPI's routes get it replayed as one message)."""


def _json_by_default(scope: Scope) -> None:
    """Every POST body here is JSON (or the OIP binary extension, which names its own type):
    a body sent with no content type or as a form (what `curl -d` sends) is read as JSON
    instead of failing validation with a confusing message. Changes `scope` in place: the
    router records the matched route in this same dict, which the request metrics read."""
    given = b""
    for k, v in scope["headers"]:
        if k == b"content-type":
            given = v
            break
    if given.split(b";")[0].strip().lower() in FORM_OR_NONE:
        headers = [(k, v) for k, v in scope["headers"] if k != b"content-type"]
        scope["headers"] = [*headers, (b"content-type", b"application/json")]


class ServingMiddleware:
    """See the module docstring."""

    def __init__(self, app: ASGIApp, state: AppState) -> None:
        self.app = app
        self.state = state
        self.admitted = 0
        """Inference requests this process is working on (admitted, not yet answered)."""
        self._series: dict[tuple[str, str, int], tuple[Any, ...]] = {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.monotonic()
        status = {"code": 500, "observed": 0}
        send_timed = self._timed_send(scope, send, start, status)
        try:
            await self._serve(scope, receive, send_timed)
        finally:
            if not status["observed"]:  # no response went out (an exception escaped)
                self._observe(scope, status["code"], time.monotonic() - start)

    async def _serve(self, scope: Scope, receive: Receive, send_timed: Send) -> None:
        inference = scope["method"] == "POST" and scope["path"].startswith(INFERENCE)
        answer = self._refusal(scope, inference)
        counted = inference and answer is None
        self.admitted += counted  # before the body is read: slow bodies count too
        try:
            got = await self._body_or_refusal(scope, receive) if answer is None else b""
            if isinstance(got, tuple):
                answer = got
            if answer is not None:
                code, message, retry_after, extra = answer
                await send_answer(send_timed, error_for(scope, code, message,
                                                        retry_after=retry_after, headers=extra))
                return
            body = got if isinstance(got, bytes) else b""
            if scope["method"] == "POST":
                _json_by_default(scope)
            scope[BODY] = body
            await self.app(scope, _replay(body, receive), send_timed)
        finally:
            self.admitted -= counted

    def _refusal(self, scope: Scope, inference: bool) -> Refusal | None:
        """429 beyond max_in_flight (draining refuses nothing: see the module doc)."""
        s = self.state.settings
        if inference and self.admitted >= s.max_in_flight:
            return (429, "server overloaded: this process already works on max_in_flight "
                    f"({s.max_in_flight}) requests", s.retry_after_s, [])
        return None

    async def _body_or_refusal(self, scope: Scope, receive: Receive) -> bytes | Refusal:
        """The whole body, or the answer to a body too slow (408) or too large (413)."""
        s = self.state.settings
        try:
            async with asyncio.timeout(s.body_timeout_s):
                body = await self._read_body(scope, receive)
        except TimeoutError:
            return (408, f"request body did not arrive within {s.body_timeout_s:g} s "
                    "(body_timeout_s)", None, [(b"connection", b"close")])
        if body is None:
            return 413, f"request body exceeds max_body_bytes ({s.max_body_bytes})", None, []
        return body

    async def _read_body(self, scope: Scope, receive: Receive) -> bytes | None:
        """The whole body, or None when it is (or announces itself) over the limit."""
        limit = self.state.settings.max_body_bytes
        for key, value in scope.get("headers", []):
            if key == b"content-length":
                try:
                    if int(value) > limit:
                        return None
                except ValueError:
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
                call = scope.get("state", {}).get("call")
                queue_ms = call.queue_s * 1000 if call else 0.0
                compute_ms = call.compute_s * 1000 if call else 0.0
                total_ms = (time.monotonic() - start) * 1000
                value = (f"queue;dur={queue_ms:.3f}, compute;dur={compute_ms:.3f}, "
                         f"total;dur={total_ms:.3f}")
                headers = [h for h in message.get("headers", []) if h[0] != b"server-timing"]
                headers.append((b"server-timing", value.encode()))
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
        requests, duration, queue, compute = self._children(model, endpoint or "unmatched",
                                                            status)
        requests.inc()
        duration.observe(seconds)
        call = scope.get("state", {}).get("call")
        if call is not None and call.computed:
            queue.observe(call.queue_s)
            compute.observe(call.compute_s)

    def _children(self, model: str, endpoint: str, status: int) -> tuple[Any, ...]:
        """The label-bound series of one (model, endpoint, status), looked up once."""
        key = (model, endpoint, status)
        found = self._series.get(key)
        if found is None:
            m = self.state.metrics
            found = self._series[key] = (
                m.requests.labels(model, endpoint, str(status)),
                m.request_duration.labels(model, endpoint),
                m.queue_time.labels(model, endpoint), m.compute_time.labels(model, endpoint))
        return found


def _replay(body: bytes, receive: Receive) -> Receive:
    sent = False

    async def replay() -> dict[str, Any]:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return dict(await receive())

    return replay
