"""uvicorn's httptools protocol with a deadline on request headers (slowloris, idle sockets).

uvicorn closes a keep-alive connection that stays idle after a response
(`timeout_keep_alive`), but not a new connection that never sends a request, nor one whose
request headers trickle in: each held a connection open for as long as the client liked
(70+ s measured). Here a connection must deliver complete request headers within
`header_timeout_s` of being opened (or of its request's first byte); otherwise it gets a 408
and is closed. A body that stalls is the middleware's business (`body_timeout_s`).

Every request's scope carries a future that is done once its client is gone (the connection
was lost before its response completed): `scope["extensions"]["seqserve.disconnect"]`
(`DISCONNECT`). The routes wait on it directly (`RequestContext.gone`) instead of a task per
request that waits for `http.disconnect` (measured: that task, its cancellation and the
reference cycle its CancelledError left for the garbage collector were a sixth of the API
process's CPU per request).

Every response goes out in one write where it can: uvicorn writes the status line and headers
(`http.response.start`) and then the body as two socket writes (two syscalls, two TCP
segments); here a response's first write waits for its next one (the body, sent right after
by every whole answer) and both leave joined, or it leaves on the loop's next turn when
nothing follows at once (a stream's first chunk may take a while).
"""

from __future__ import annotations

import asyncio
from http import HTTPStatus
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from seqserve.service.core.answers import error_answer

DISCONNECT = "seqserve.disconnect"
"""The scope extension: a future done when the request's client is gone (see module doc)."""


def timeout_answer(message: str) -> bytes:
    """A whole 408 response that closes the connection: the one error answer, written as
    HTTP/1.1 bytes (no request id: the request never got as far as its headers)."""
    status, headers, body = error_answer(408, message, headers=[(b"connection", b"close")])
    lines = [f"HTTP/1.1 {status} {HTTPStatus(status).phrase}".encode()]
    lines += [name + b": " + value for name, value in headers]
    return b"\r\n".join(lines) + b"\r\n\r\n" + body


class OneWrite:
    """A response cycle's transport: its first write (the status line and headers) is held
    until the next write joins it, a close, or the loop's next turn (see the module doc)."""

    __slots__ = ("transport", "loop", "held", "first")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self.transport = transport
        self.loop = loop
        self.held: bytes | None = None
        self.first = True

    def write(self, data: bytes) -> None:
        if self.first:
            self.first = False
            self.held = data
            self.loop.call_soon(self.flush)
            return
        if self.held is not None:
            data, self.held = self.held + data, None
        self.transport.write(data)

    def flush(self) -> None:
        if self.held is not None:
            data, self.held = self.held, None
            if not self.transport.is_closing():
                self.transport.write(data)

    def close(self) -> None:
        self.flush()
        self.transport.close()

    def is_closing(self) -> bool:
        return self.transport.is_closing()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.transport, name)


def guarded_protocol(header_timeout_s: float) -> type[HttpToolsProtocol]:
    """The protocol class for uvicorn's `http=` with this header deadline."""

    class GuardedHttpToolsProtocol(HttpToolsProtocol):
        _header_timer: asyncio.TimerHandle | None = None
        _open: list[tuple[Any, asyncio.Future[None]]]
        """Requests of this connection whose response is not complete, with their futures."""

        def connection_made(self, transport: Any) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._open = []
            self._arm()

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self._arm()

        def on_headers_complete(self) -> None:
            self._disarm()
            before = self.cycle
            super().on_headers_complete()
            cycle = self.cycle
            if cycle is not None and cycle is not before:
                cycle.transport = OneWrite(self.transport, self.loop)  # type: ignore[assignment]
                gone: asyncio.Future[None] = self.loop.create_future()
                cycle.scope.setdefault("extensions", {})[DISCONNECT] = gone  # type: ignore[assignment]
                self._open = [o for o in self._open if not o[0].response_complete]
                self._open.append((cycle, gone))

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            for cycle, gone in self._open:
                if not cycle.response_complete and not gone.done():
                    gone.set_result(None)
            self._open = []
            super().connection_lost(exc)

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
                if not self.transport.is_closing():
                    self.transport.write(timeout_answer(
                        f"request headers did not arrive within {header_timeout_s:g} s"))
                self.transport.close()

    return GuardedHttpToolsProtocol
