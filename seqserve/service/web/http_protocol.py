"""uvicorn's httptools protocol with limits on request heads: a deadline (slowloris, idle
sockets), a size, a count of header fields and a URL length.

uvicorn closes a keep-alive connection that stays idle after a response
(`timeout_keep_alive`), but not a new connection that never sends a request, nor one whose
request headers trickle in: each held a connection open for as long as the client liked
(70+ s measured). Here a connection must deliver complete request headers within
`header_timeout_s` of being opened (or of its request's first byte); otherwise it gets a 408
and is closed. A body that stalls is the middleware's business (`body_timeout_s`), but a
request answered before its body arrived (a refusal: 413 by its Content-Length, 415, 429)
must finish sending it within `header_timeout_s` of its answer, else the connection is closed
(uvicorn dropped the rest of such a body for as long as the client went on sending it).

Request heads have no size limit in uvicorn or httptools: an 8 MB header or 200,000 header
fields were served, and an unterminated header grew the process by its size (httptools joins
the pieces of a header value until it ends). Here the bytes of a request head (request line
and header fields) are counted as they arrive, before the parser sees them: past
`max_header_bytes` the request gets a 431 at once; more than `max_headers` fields, a 431; a
request target over `max_url_bytes`, a 414. Each is the one JSON error answer with
`Connection: close`, written before the request reaches the app (no route, no API key check),
after which the connection reads and drops what the client still sends for a moment
(`LINGER_S`, `LINGER_BYTES`: a close with unread data resets the connection, and the client
may lose the answer), then closes. A chunked body's framing and trailers (header fields after
the body, which httptools joins the same way) are bounded by `max_header_bytes` as well: past
it, between two body bytes, the connection is closed (the request is under way; the app sees
a disconnect).

Every request's scope carries a future that is done once its client is gone (the connection
was lost before its response completed): `scope["extensions"]["seqserve.disconnect"]`
(`DISCONNECT`). The routes wait on it directly (`RequestContext.gone`) instead of a task per
request that waits for `http.disconnect` (measured: that task, its cancellation and the
reference cycle its CancelledError left for the garbage collector were a sixth of the API
process's CPU per request).

Stopping loses nothing a client already sent, and a connection closes between requests,
never inside one (`draining`: the server's drain has begun):
- while draining, a response that would close its connection (`Connection: close`: the
  drain's, or uvicorn's at shutdown) keeps it open when the client has already sent more:
  a pipelined request parsed and waiting, or bytes unread in the socket (peeked, only then);
  the last request answered closes it;
- at shutdown (uvicorn's `shutdown()`, and the keep-alive timeout) an idle connection with
  bytes unread is not closed: its request is read and answered (with `Connection: close`);
  a connection that has sent nothing yet (a new one: its client connected to send a request)
  is given `FIRST_REQUEST_GRACE_S` for it, then closes if it sent none;
- the server closes a connection after an answer by half-closing it (FIN after the answer)
  and reading and dropping what still arrives for `LINGER_S`: a close with unread data
  resets the connection, and the client may lose the answer it has not read yet.

A request the app can answer from its head alone is answered here, without an ASGI task
(`answer_head`: the app's `answer_head(scope)`, an `Answer` or None): under overload most
requests are refusals (429 + Retry-After before the body is read), and the task, the
middleware chain's coroutines and their sends cost more than the refusal's own decision
(measured: 0.17-0.19 ms of server CPU per refused request through the app, 0.11-0.13 ms
answered here by the same rules, 0.07 ms for the bytes alone; docs/performance.md section
25). The app decides, with the one decision its full path makes too
(`web.middleware.HttpLifecycle.answer_head` says which); the request's body, when it comes,
is read and dropped as for any request answered before its body. Only on a keep-alive
connection that is not closing and whose client does not wait for `100 Continue`: the full
path handles every other case.

A client that resends at once after a 429 is paced (`pace_s`, `--refusal-pace-s`): a 429
from a request's head due less than `pace_s` after its connection's last 429 is written at
`pace_s` after that one (what else the client sends waits behind it, as pipelined requests
do). Each refusal costs the event loop its read, parse and write; clients that ignored
Retry-After and resent on the same connection at once made refusals the loop's whole work,
admitted batches waited behind them, the estimates rose with those waits and admission
refused more: a closed loop of 128 such clients kept a fifth of the capacity
(docs/performance.md section 29). Paced, such a connection costs at most one refusal per
`pace_s`, and a request the server takes is never delayed. (Holding the request instead and
deciding again at the pace cost each refusal ~0.07 ms more of the loop under an open loop at
3x capacity, whose arrivals reuse a connection just refused, for as many refusals.)
"""

from __future__ import annotations

import asyncio
import logging
import math
import socket
from collections.abc import Callable, Sequence
from typing import Any

import httptools
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from seqserve.service.core.answers import Answer, ErrorShape, error_answer
from seqserve.service.web.responses import shape_of
from seqserve.service.web.settings import Settings

DISCONNECT = "seqserve.disconnect"
"""The scope extension: a future done when the request's client is gone (see module doc)."""
RECEIVED = "seqserve.received"
"""The scope extension a front that reads requests off the event loop sets (the native
front, server/native.py): the `time.monotonic()` at which the request's head was read. The
request's deadline, its allowed queue wait, its body's deadline and its Server-Timing count
from it (absent: from when the app saw the request)."""
LINGER_S = 1.0
"""After the answer to a refused request head: how long the connection goes on reading (and
dropping) what the client still sends before it closes (see the module doc)."""
LINGER_BYTES = 1 << 20
"""... and how much of it at most."""
BODY_LATE = "seqserve.body_late"
"""The scope extension a front that reads bodies itself sets on a request whose body did not
arrive within `body_timeout_s` (handed over without it): the app answers its 408 at once."""
FIRST_REQUEST_GRACE_S = 1.0
"""At shutdown, how long a connection that has not sent a byte yet (accepted just before, or
taken from the listen queue at close) is given for its first request before it closes: its
client connected to send one, and closed at once it lost it (the request crossed the close)."""
HeadAnswer = Callable[[dict[str, Any]], Answer | None]
"""The app's answer to a request from its scope alone (its head), or None (module doc)."""
log = logging.getLogger("seqserve.http")


def closing_answer(status: int, message: str, shape: ErrorShape = ErrorShape.PLAIN) -> bytes:
    """A whole error response that closes the connection: the one error answer, written as
    HTTP/1.1 bytes (no request id: the request never got past its head)."""
    return answer_bytes(error_answer(status, message, shape=shape,
                                     headers=[(b"connection", b"close")]))


def answer_bytes(answer: Answer, first: Sequence[tuple[bytes, bytes]] = ()) -> bytes:
    """A whole answer as HTTP/1.1 bytes, the header fields `first` (the server's defaults)
    before its own."""
    status, headers, body = answer
    lines = [STATUS_LINE[status]]
    for name, value in (*first, *headers):
        lines += (name, b": ", value, b"\r\n")
    lines += (b"\r\n", body)
    return b"".join(lines)


def _default(name: str) -> Any:
    return Settings.model_fields[name].default


def head_refusals(header_timeout_s: float, max_headers: int, max_header_bytes: int,
                  max_url_bytes: int) -> dict[str, tuple[int, str]]:
    """Each refusal of a request head over a limit, as (status, message), by what it refuses:
    the one list of both fronts (this protocol, and the native front's: server/native.py)."""
    return {
        "fields": (431, f"more than max_headers ({max_headers}) header fields"),
        "head": (431, "request head (request line and header fields) exceeds "
                      f"max_header_bytes ({max_header_bytes})"),
        "url": (414, f"request target exceeds max_url_bytes ({max_url_bytes})"),
        "timeout": (408, f"request headers did not arrive within {header_timeout_s:g} s"),
        "invalid": (400, "Invalid HTTP request received."),
    }


class _Refused(Exception):
    """Raised by a parser callback to stop parsing a request the protocol refused."""


class AnswerTransport:
    """A response cycle's transport. Its first write (the status line and headers) stamps a
    429 (`refused_at`, for the pace); while the server drains (`protocol.draining()`), a head
    that closes the connection keeps it open when the client has already sent more
    (`keep_open`); the cycle's close is the protocol's lingering close
    (`protocol.close_after_answer`)."""

    __slots__ = ("transport", "loop", "first", "protocol", "cycle")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop,
                 protocol: Any = None, cycle: Any = None) -> None:
        self.transport = transport
        self.loop = loop
        self.first = True
        self.protocol = protocol
        self.cycle = cycle

    def write(self, data: bytes) -> None:
        if self.first:
            self.first = False
            protocol = self.protocol
            if protocol is not None:
                if data[9:12] == b"429":  # (after "HTTP/1.1 "): the app's refusal
                    protocol.refused_at = self.loop.time()
                if protocol.closing_soon():
                    data = protocol.keep_open(self.cycle, data)
        self.transport.write(data)

    def close(self) -> None:
        if self.protocol is not None:
            self.protocol.close_after_answer()
        else:
            self.transport.close()

    def is_closing(self) -> bool:
        return self.transport.is_closing()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.transport, name)


CLOSE_LINE = b"\r\nconnection: close\r\n"
"""How uvicorn writes a closing head's Connection field (names lower-cased)."""


def unread(transport: Any) -> bool:
    """Whether the connection's socket holds bytes not read yet (a peek: nothing consumed)."""
    raw = transport.get_extra_info("socket")
    if raw is None:
        return False
    sock = socket.socket(fileno=raw.fileno())
    try:
        return bool(sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT))
    except (BlockingIOError, InterruptedError):
        return False
    except OSError:
        return False
    finally:
        sock.detach()


def guarded_protocol(header_timeout_s: float, *,
                     max_headers: int = _default("max_headers"),
                     max_header_bytes: int = _default("max_header_bytes"),
                     max_url_bytes: int = _default("max_url_bytes"),
                     draining: Callable[[], bool] | None = None,
                     answer_head: HeadAnswer | None = None,
                     pace_s: float = _default("refusal_pace_s")) -> type[HttpToolsProtocol]:
    """The protocol class for uvicorn's `http=` with this header deadline and these limits
    on request heads (the settings of the same names), `draining`, whether the server's
    drain has begun, `answer_head`, the app's answer from a request's head, and `pace_s`,
    how long a connection's next refusal waits after its last (see the module doc)."""
    is_draining = draining
    refusals = head_refusals(header_timeout_s, max_headers, max_header_bytes, max_url_bytes)

    class GuardedHttpToolsProtocol(HttpToolsProtocol):
        draining = staticmethod(is_draining) if is_draining is not None else None
        _header_timer: asyncio.TimerHandle | None = None
        _open: list[tuple[Any, asyncio.Future[None]]]
        """Requests of this connection whose response is not complete, with their futures."""
        _room: int | None
        """Bytes the request head being read may still take; None while a body is read."""
        _quiet: int
        """Bytes read in a body since its last body byte (a chunked body's framing,
        trailers)."""
        _refused: bool
        """A request head over a limit was refused: what arrives now is dropped."""
        _dropped: int
        _waiting: bytes | None
        """The refusal's answer, while the responses to earlier (pipelined) requests are not
        complete yet."""
        _linger: asyncio.TimerHandle | None
        _closing: bool
        """Closed after an answer (`close_after_answer`): what arrives now is dropped."""
        _stopping: bool
        """The server stops: each request is its connection's last unless more waits."""
        _fresh: bool
        """Nothing was received on this connection yet."""
        refused_at: float
        """When this connection's last 429 was written or is due (-inf: none)."""
        _late: tuple[asyncio.TimerHandle, Any, Answer] | None
        """A 429 due later (`pace_s`): its timer, its request's cycle, the answer."""

        def connection_made(self, transport: Any) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._closing = self._stopping = False
            self._fresh = True
            self._open = []
            self._room = max_header_bytes
            self._quiet = 0
            self._refused = False
            self._dropped = 0
            self._waiting = None
            self._linger = None
            self.refused_at = -math.inf
            self._late = None
            self._arm()

        def data_received(self, data: bytes) -> None:
            # uvicorn's, on `_feed`; a callback's `_Refused` ends up a parser error here
            self._fresh = False
            if self._refused:
                self._dropped += len(data)
                if self._dropped > LINGER_BYTES:
                    self.transport.close()
                return
            self._unset_keepalive_if_required()
            try:
                self._feed(data)
            except httptools.HttpParserError:
                if self._refused:
                    return
                msg = refusals["invalid"][1]
                self.logger.warning(msg)
                self.send_400_response(msg)
            except httptools.HttpParserUpgrade:
                if self._should_upgrade():
                    self.handle_websocket_upgrade()
                else:
                    self._unsupported_upgrade_warning()

        def _feed(self, data: bytes) -> None:
            """Feed the parser, counting the bytes of request heads: never more than
            `max_header_bytes` of one head reach it (a read that ends a head and starts the
            next may add to the next uncounted: at most one read more)."""
            feed = self.parser.feed_data
            while True:
                room = self._room
                if room is None:  # a body: its framing and trailers are bounded too
                    self._quiet += len(data)  # on_body resets it
                    feed(data)
                    if self._room is None and self._quiet > max_header_bytes:
                        self._refused = True
                        self.transport.close()
                    return
                if len(data) <= room:
                    self._room = room - len(data)
                    feed(data)
                    return
                self._room = 0
                if room:
                    feed(data[:room])
                if self._room == 0:  # the head goes on past the limit
                    self._refuse(*refusals["head"])
                    return
                data = data[room:]

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self._arm()

        def on_url(self, url: bytes) -> None:
            super().on_url(url)
            if len(self.url) > max_url_bytes:
                self._refuse(*refusals["url"])
                raise _Refused

        def on_header(self, name: bytes, value: bytes) -> None:
            if len(self.headers) >= max_headers:
                if self._room is None:  # a trailer: the request is under way
                    self._refused = True
                    self.transport.close()
                else:
                    self._refuse(*refusals["fields"])
                raise _Refused
            super().on_header(name, value)

        def on_headers_complete(self) -> None:
            self._disarm()
            self._room = None
            self._quiet = 0
            before = self.cycle
            super().on_headers_complete()
            cycle = self.cycle
            if cycle is not None and cycle is not before and not cycle.response_complete:
                cycle.transport = AnswerTransport(self.transport, self.loop, self, cycle)  # type: ignore[assignment]
                gone: asyncio.Future[None] = self.loop.create_future()
                cycle.scope.setdefault("extensions", {})[DISCONNECT] = gone  # type: ignore[assignment]
                self._open = [o for o in self._open if not o[0].response_complete]
                self._open.append((cycle, gone))
                if self._stopping:
                    cycle.keep_alive = False

        def _start_asgi_task(self, cycle: Any, app: Any) -> None:
            if answer_head is not None and app is self.app and cycle.keep_alive \
                    and not cycle.waiting_for_100_continue and not self.closing_soon():
                try:
                    answer = answer_head(cycle.scope)
                except Exception:  # a bug in the app's decision: its full path answers
                    log.exception("answer_head failed; the request goes to the app")
                    answer = None
                if answer is not None:
                    if answer[0] == 429:
                        now = self.loop.time()
                        due = self.refused_at + pace_s
                        if now < due:  # resent at once after a refusal: answered at the pace
                            self.refused_at = due
                            timer = self.loop.call_at(due, self._answer_late)
                            self._late = (timer, cycle, answer)
                            return
                        self.refused_at = now
                    self._answer_head(cycle, answer)
                    return
            super()._start_asgi_task(cycle, app)

        def _answer_late(self) -> None:
            """Write the 429 due now (`pace_s`), or at once when the server stops."""
            late = self._drop_late()
            if late is not None and not self.transport.is_closing() \
                    and not late[0].disconnected:
                self._answer_head(*late)

        def _drop_late(self) -> tuple[Any, Answer] | None:
            """The 429 due later, if any, as (cycle, answer), its timer cancelled."""
            if self._late is None:
                return None
            timer, cycle, answer = self._late
            timer.cancel()
            self._late = None
            return cycle, answer

        def _answer_head(self, cycle: Any, answer: Answer) -> None:
            """Write the app's whole answer to a request head (one write, the server's
            default headers first, as uvicorn writes a response); the request is complete
            for the connection, its body (if any) is read and dropped."""
            cycle.response_started = cycle.response_complete = True
            self.transport.write(answer_bytes(answer, self.server_state.default_headers))
            cycle.on_response()

        def on_body(self, body: bytes) -> None:
            self._quiet = 0
            super().on_body(body)

        def on_message_complete(self) -> None:
            self._room = max_header_bytes  # what follows is the next request's head
            self._disarm()  # (armed when its answer went out before its body came)
            super().on_message_complete()

        def on_response_complete(self) -> None:
            if self._closing:  # closed after this answer: nothing more is served
                self.server_state.total_requests += 1
                return
            super().on_response_complete()
            if self._room is None and self.cycle.response_complete:
                self._arm()  # answered before its body came: the rest must come soon
            if self._waiting is not None and self.cycle.response_complete:
                answer, self._waiting = self._waiting, None
                self.loop.call_soon(self._answer_and_close, answer)
            elif self._stopping and not self.pipeline and self.cycle.response_complete \
                    and not self.transport.is_closing():
                self.loop.call_soon(self._close_idle)  # the server stops

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            self._drop_late()
            if self._linger is not None:
                self._linger.cancel()
                self._linger = None
            for cycle, gone in self._open:
                if not cycle.response_complete and not gone.done():
                    gone.set_result(None)
            self._open = []
            super().connection_lost(exc)

        # -- closing between requests (module doc) ---------------------------------------

        def closing_soon(self) -> bool:
            """The server drains or stops: a response may close its connection."""
            return self._stopping or (self.draining is not None and self.draining())

        def keep_open(self, cycle: Any, head: bytes) -> bytes:
            """A response head written while draining: without its `Connection: close`
            when the client has sent more already (answered next, on this connection)."""
            if CLOSE_LINE not in head or not self._client_keeps_alive(cycle):
                return head
            if not self.pipeline and not unread(self.transport):
                return head
            cycle.keep_alive = True
            return head.replace(CLOSE_LINE, b"\r\n", 1)

        def _client_keeps_alive(self, cycle: Any) -> bool:
            headers = cycle.scope.get("headers", ())
            if cycle.scope.get("http_version") == "1.0":
                return False
            return not any(n == b"connection" and b"close" in v.lower() for n, v in headers)

        def close_after_answer(self) -> None:
            """Close after an answer: FIN after it, then read and drop what still arrives
            for LINGER_S (a close with unread data resets the connection)."""
            transport = self.transport
            if transport.is_closing():
                return
            self._refused = self._closing = True
            self._disarm()
            self.flow.resume_reading()  # (paused while a request was pipelined): drop it
            if transport.can_write_eof():
                transport.write_eof()
                self._linger = self.loop.call_later(LINGER_S, transport.close)
            else:
                transport.close()

        def _close_idle(self) -> bool:
            """Close an idle connection unless its client sent a request already (then it
            is read and answered; the drain closes after it); True when closing."""
            if self.transport.is_closing() or (
                    self.cycle is not None and not self.cycle.response_complete):
                return False  # closed already, or a request came in meanwhile
            if self._room is not None and self._room < max_header_bytes:
                return False  # a request head is coming (the header deadline bounds it)
            if unread(self.transport):
                return False
            self.close_after_answer()
            return True

        def shutdown(self) -> None:
            """The server stops (uvicorn's call on every connection; ours on a connection
            taken from the listen queue at close): idle, close unless a request was sent
            already; in a request, close after the last one the client has sent."""
            self._stopping = True
            if self._fresh:  # its first request may be on its way (FIRST_REQUEST_GRACE_S)
                self.loop.call_later(FIRST_REQUEST_GRACE_S, self._close_idle)
            elif self.cycle is None or self.cycle.response_complete:
                self._close_idle()
            else:
                self.cycle.keep_alive = False  # (keep_open lifts it while more waits)
                self._answer_late()  # a 429 due later goes now

        def timeout_keep_alive_handler(self) -> None:
            if not self.transport.is_closing() and not self._close_idle():
                self.timeout_keep_alive_task = None  # a request came in: it re-arms

        def _refuse(self, status: int, message: str) -> None:
            """Answer a request head over a limit (Connection: close), after the responses
            to the requests before it; the request never reaches the app."""
            self._refused = True
            self._disarm()
            path = getattr(self, "url", b"").split(b"?", 1)[0].decode("latin-1")
            answer = closing_answer(status, message, shape_of({"path": path}))
            if self.cycle is None or self.cycle.response_complete:
                self._answer_and_close(answer)
            else:
                self._waiting = answer

        def _answer_and_close(self, answer: bytes) -> None:
            transport = self.transport
            if transport.is_closing():
                return
            transport.write(answer)
            if transport.can_write_eof():  # then linger (module doc)
                transport.write_eof()
                self._linger = self.loop.call_later(LINGER_S, transport.close)
            else:
                transport.close()

        def _arm(self) -> None:
            self._disarm()
            self._header_timer = self.loop.call_later(header_timeout_s, self._expire)

        def _disarm(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def _expire(self) -> None:
            self._header_timer = None
            if self.cycle is None or self.cycle.response_complete:  # no request in progress
                if self._room is not None and not self.transport.is_closing():
                    self.transport.write(closing_answer(*refusals["timeout"]))
                self.transport.close()

    return GuardedHttpToolsProtocol
