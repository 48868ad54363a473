"""The native HTTP front: requests parsed, bodies read and answers written outside the
interpreter (`_front`, a Rust extension over hyper and tokio: native/front/), the
app run per request on the event loop as uvicorn runs it.

The front accepts on the listening socket in its own threads (where several API processes
share it, by accept.py's balance rule on the same shared counters: `balance`; so a
connection never waits for a busy event loop to be accepted), reads each request whole (head
limits, body limit, head and keep-alive deadlines are its own; a head over a limit gets the
uvicorn protocol's answer, `head_refusals`, and a chunked body's framing and trailers are
bounded like a head) and queues it; a body that does not arrive within `body_timeout_s` is
handed over without it, for the app's own 408; a connection's 429 written less than
`refusal_pace_s` after its last waits until then (or the server stops); an eventfd
tells the event loop that requests wait, and one `take` per loop turn hands it every waiting
request at once. Each becomes the ASGI scope uvicorn would have built, with the same
disconnect future (`web.http_protocol.DISCONNECT`), and runs the same app (`create_app`'s
middleware chain: access log, serving middleware, API keys, hot path or FastAPI). A request
the app refuses from its head alone (`answer_head`: an overloaded model's 429) is answered
without a task, as the uvicorn protocol does; most never reach Python at all: the front
writes an overloaded model's 429 itself (native/front/src/shed.rs) by the rule the event
loop publishes from the turns it runs (`FrontRule`: each model's expected wait, whether the
process may refuse, the access log's quiet time; `publish`), and the loop
counts those refusals in the metrics on its next turn (the front wakes it). The answers of
one loop turn leave in one `respond_many` call; a streamed answer (SSE) goes chunk by chunk.

Draining: `close()` stops accepting (connections already open keep being served, and every
answer carries `Connection: close` while the server drains: the middleware's; the front
leaves it out while requests the client already sent on that connection wait behind the
answer, so that the last of them closes it), uvicorn then waits for the requests in flight
(`server_state.tasks`), and `wait_closed()` closes the connections as they finish, still
serving them (a connection that has sent nothing yet gets FIRST_REQUEST_GRACE_S for its
first request), and stops the front within the drain's bound.

The choice is `--front`: `native` where `_front` imports (built by
native/build.sh), `uvicorn` otherwise or when asked; `serve` logs which and why.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import math
import socket
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import unquote

from seqserve.service.core.answers import error_answer
from seqserve.service.server.accept import Slots, take_waiting
from seqserve.service.web.front_rule import FrontRule
from seqserve.service.web.http_protocol import BODY_LATE, DISCONNECT, RECEIVED, head_refusals
from seqserve.service.web.middleware import INFERENCE

log = logging.getLogger("seqserve.app")

TAKE = 512
"""Most requests taken from the front in one loop turn (the rest on the next turn)."""
PUBLISH_GAP_S = 0.001
"""Least time between two publications of the front's refusal rule while a model's queue
builds up (`FrontRule.publish`: each costs the models' expected waits; one turn moves them
by little) ..."""
CALM_GAP_S = 0.05
"""... and while none does (a front that refuses nothing passes requests to the full
decision, which refuses what it must: publishing every turn cost ~3% of the event loop
under a closed loop of short texts)."""
Message = dict[str, Any]


def native_front() -> tuple[Any | None, str]:
    """The front's class and why it is (or is not) available."""
    try:
        from seqserve.service.server._front import Front  # type: ignore[import-not-found]
    except ImportError as exc:
        return None, f"seqserve.service.server._front is not built ({exc}); run native/build.sh"
    return Front, "seqserve.service.server._front is built"


class NativeListener:
    """Serves `app` on `sock` through the native front; stands in for uvicorn's asyncio
    server (`close`, `wait_closed`) in `DrainingServer.servers`."""

    def __init__(self, sock: socket.socket, app: Any,
                 answer_head: Callable[[dict[str, Any]], Any] | None,
                 answer_now: Callable[..., bool] | None, settings: Any,
                 app_state: dict[str, Any], tasks: set[asyncio.Task[None]],
                 stop_bound_s: float, balance: tuple[Slots, int] | None = None,
                 rule: FrontRule | None = None) -> None:
        front_class, why = native_front()
        if front_class is None:
            raise RuntimeError(why)
        self.loop = asyncio.get_running_loop()
        self.sock = sock
        self.app = app
        self.answer_head = answer_head
        self.answer_now = answer_now
        self.now = 0
        """Requests answered without a task (`answer_now`) whose answers are not written."""
        self.held: asyncio.Future[None] | None = None
        """Done when `now` drops to 0: a task on it stands for them in `tasks` (the drain
        waits for those)."""
        self.rule = rule
        """The rule of the refusals the front writes itself (None: it writes none)."""
        self.publish_at = -math.inf
        """When the rule is published next (`publish`)."""
        self.app_state = app_state
        self.tasks = tasks
        self.stop_bound_s = stop_bound_s
        s = settings
        refusals = {what: error_answer(status, message, headers=[(b"connection", b"close")])
                    for what, (status, message) in head_refusals(
                        s.header_timeout_s, s.max_headers, s.max_header_bytes,
                        s.max_url_bytes).items()}
        # the socket's file is shared with the front's copy (and other API processes):
        # non-blocking, or an accept after another process took the connection would stall
        # the front's thread
        sock.setblocking(False)
        self.front = front_class(
            sock.fileno(), threads=1, max_head_bytes=s.max_header_bytes,
            max_headers=s.max_headers, max_url_bytes=s.max_url_bytes,
            max_body_bytes=s.max_body_bytes, head_timeout_s=s.header_timeout_s,
            keep_alive_s=s.keepalive_timeout_s, body_timeout_s=s.body_timeout_s,
            pace_s=s.refusal_pace_s, refusals=refusals, counted=list(INFERENCE),
            slots=None if balance is None else balance[0].rule(balance[1]))
        host, port = sock.getsockname()[:2]
        self.server = (str(host), int(port))
        self.gone: dict[int, asyncio.Future[None]] = {}
        """The disconnect future of every request in flight, by the front's id."""
        self.answers: list[tuple[int, int, list[tuple[bytes, bytes]], bytes]] = []
        """Whole answers written this loop turn, sent together at its end."""
        self._flush_due = False
        self._closed = False
        self.loop.add_reader(self.front.fileno(), self._ready)

    def _ready(self) -> None:
        front = self.front
        if self.rule is not None:  # the front's own refusals counted before anything is read
            self.rule.refused(front.refused())
        for rid in front.gone():
            future = self.gone.pop(rid, None)
            if future is not None and not future.done():
                future.set_result(None)
        for rid, method, path, query, headers, body, client, received, whole in front.take(TAKE):
            gone: asyncio.Future[None] = self.loop.create_future()
            scope = {
                "type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"},
                "http_version": "1.1", "server": self.server, "client": client,
                "scheme": "http", "method": method, "root_path": "",
                "path": unquote(path), "raw_path": path.encode("latin-1"),
                "query_string": query, "headers": headers, "state": self.app_state.copy(),
                "extensions": {DISCONNECT: gone, RECEIVED: received},
            }
            if not whole:
                scope["extensions"][BODY_LATE] = True
            elif self.answer_head is not None:
                try:
                    answer = self.answer_head(scope)
                except Exception:  # a server bug: the full path meets it too, and answers
                    answer = None  # its 500 (logged once, with the request)
                if answer is not None:  # (a refusal: the rule is published this turn)
                    self.publish_at = -math.inf
                    self._write(rid, *answer)
                    continue
            self.gone[rid] = gone
            if whole and self.answer_now is not None and not _proxied(headers):
                self._hold()
                if self.answer_now(scope, body, functools.partial(self._answer, rid)):
                    continue
                self._release()
            task = self.loop.create_task(self._run(rid, scope, body if whole else None, gone))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)
        self.publish()

    def publish(self, now: bool = False) -> None:
        """The front's refusal rule for this turn (`FrontRule.publish`), unless the last
        was less than PUBLISH_GAP_S ago (CALM_GAP_S when no model was pressed) and no
        refusal was answered from a head since, or `now`."""
        if self.rule is None:
            return
        at = time.monotonic()
        if now or at >= self.publish_at:
            pressed = self.rule.publish(self.front)
            self.publish_at = at + (PUBLISH_GAP_S if pressed else CALM_GAP_S)

    def _hold(self) -> None:
        self.now += 1
        if self.held is None:
            held = self.held = self.loop.create_future()
            task = self.loop.create_task(_until(held))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)

    def _release(self) -> None:
        self.now -= 1
        if not self.now and self.held is not None:
            self.held.set_result(None)
            self.held = None

    def _answer(self, rid: int, status: int, headers: list[tuple[bytes, bytes]],
                body: bytes) -> None:
        """The answer of a request answered without a task (`answer_now`)."""
        self.gone.pop(rid, None)
        self._write(rid, status, headers, body)
        self._release()

    def _write(self, rid: int, status: int, headers: list[tuple[bytes, bytes]],
               body: bytes) -> None:
        self.answers.append((rid, status, headers, body))
        if not self._flush_due:
            self._flush_due = True
            self.loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_due = False
        answers, self.answers = self.answers, []
        if answers:
            self.front.respond_many(answers)
        self.publish()

    async def _run(self, rid: int, scope: dict[str, Any], body: bytes | None,
                   gone: asyncio.Future[None]) -> None:
        """One request through the app; `body` None: it did not arrive within the body
        timeout (the front read it from the head on: the app's 408 is due at once)."""
        front = self.front
        pending: Message = {} if body is None else {
            "type": "http.request", "body": body, "more_body": False}
        start: Message | None = None
        streaming = False

        async def receive() -> Message:
            nonlocal pending
            if pending:
                message, pending = pending, {}
                return message
            await gone
            return {"type": "http.disconnect"}

        async def send(message: Message) -> None:
            nonlocal start, streaming
            kind = message["type"]
            if kind == "http.response.start":
                start = message
                return
            if kind != "http.response.body" or start is None:
                return
            chunk = message.get("body", b"")
            more = message.get("more_body", False)
            if not streaming and not more:
                self._write(rid, start["status"], list(start.get("headers", ())), chunk)
                self.gone.pop(rid, None)
                return
            if not streaming:
                streaming = True
                if not front.start(rid, start["status"], list(start.get("headers", ()))):
                    _leave(gone)
                    return
            if chunk and not front.send(rid, chunk):
                _leave(gone)
            if not more:
                front.end(rid)
                self.gone.pop(rid, None)

        try:
            await self.app(scope, receive, send)
        except Exception:  # logged once, by the app's access log; a 500 if nothing was sent
            if start is None:
                self._write(rid, 500, [(b"content-type", b"application/json")],
                            b'{"error":"internal server error","status":500}')
        finally:
            if self.gone.pop(rid, None) is not None and streaming:
                front.end(rid)

    def close(self) -> None:
        """Stop accepting (connections already open are still served; a shared slot reads
        GONE), after taking the connections waiting in the socket's listen queue, and close
        it: a client connecting now is refused, as by uvicorn's closed server (not left in a
        listen queue nobody takes from, then reset), or taken by another API process."""
        if not self._closed:
            self._closed = True
            self.front.pause()
            for conn in take_waiting(self.sock):
                self.front.adopt(conn.detach())
            self.sock.close()

    async def wait_closed(self) -> None:
        """Close the connections as they finish, still serving what they send (requests
        pipelined behind those in flight, a fresh connection's first request within its
        grace), within the drain's bound; then stop the front."""
        self.front.shutdown()
        deadline = self.loop.time() + self.stop_bound_s
        while self.front.connections() and self.loop.time() < deadline:
            await asyncio.sleep(0.01)
        self._flush()
        self.loop.remove_reader(self.front.fileno())
        stats = self.front.stats()
        await asyncio.to_thread(self.front.close, 0.2)
        self.sock.close()
        log.info("native front stopped: %d connections, %d requests handed to the app, %d "
                 "refused by the front itself", stats["accepted"], stats["requests"],
                 stats["shed"])

    def stats(self) -> dict[str, Any]:
        return dict(self.front.stats())


async def _until(held: asyncio.Future[None]) -> None:
    await held


def _proxied(headers: list[tuple[bytes, bytes]]) -> bool:
    """Whether a request carries proxy headers (uvicorn's proxy middleware, run by the app's
    full path, may then change its client and scheme)."""
    return any(k == b"x-forwarded-for" or k == b"x-forwarded-proto" for k, _ in headers)


def _leave(gone: asyncio.Future[None]) -> None:
    if not gone.done():
        gone.set_result(None)
