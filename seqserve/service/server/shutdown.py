"""Graceful shutdown on top of uvicorn's own signal handling.

On SIGTERM/SIGINT: readiness turns false at once (AppState.draining), but for
`shutdown_delay_s` the server keeps accepting and serving new requests as usual (an
orchestrator stops routing to a pod only seconds after it sent SIGTERM: kube-proxy and ingress
controllers lag); every answer meanwhile carries `Connection: close`, so keep-alive clients
move on. Then uvicorn closes the listener (under the supervisor every API process closes its
copy at the same moment; the supervisor closed its own at the signal), waits up to
`drain_timeout_s` for admitted requests, then runs the lifespan shutdown, which drains the
batchers. A second signal exits at once.

Stopping to listen loses nothing already sent: the connections waiting in the listen queue
are taken before the listener closes and their requests answered (accept.py
`take_waiting`), idle connections whose client already sent a request are not closed under
it, and a connection closes between requests, never inside one (web/http_protocol.py).

Under the supervisor with several API processes, the shared listening socket is accepted on
by the rule of accept.py (the least loaded process takes each new connection): by the native
front in its own threads, or, on the uvicorn front, by a `BalancedListener` on the event loop
instead of uvicorn's own asyncio server.

With `grpc` on, the gRPC front (`api/grpc/server.py`) starts once the app is loaded, before
HTTP listens (so it serves once readiness can say so), and joins uvicorn's listeners: it stops
taking new RPCs when they close, and its RPCs in flight finish within the same drain budget,
before the lifespan drains the models. A gRPC port that cannot be bound fails the start, as
an HTTP one does.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import signal
import socket
import time
from collections.abc import Awaitable, Callable
from types import FrameType
from typing import Any

import uvicorn

from seqserve.service.api.grpc.server import GrpcServer
from seqserve.service.server.accept import (
    BalancedListener,
    Slots,
    protocol_handoff,
    serve_stopping,
    take_waiting,
)
from seqserve.service.server.native import NativeListener, native_front
from seqserve.service.web.http_protocol import guarded_protocol
from seqserve.service.web.state import AppState

log = logging.getLogger("seqserve.app")


class DrainingServer(uvicorn.Server):
    """uvicorn.Server that drains before it exits."""

    def __init__(self, config: uvicorn.Config, state: AppState, delay_s: float = 0.0,
                 supervised: bool = False, balance: tuple[Slots, int] | None = None,
                 grpc: GrpcServer | None = None) -> None:
        super().__init__(config)
        self.grpc = grpc
        """The gRPC front, started with the server (None: `grpc` is off)."""
        self.balance = balance
        """The shared connection counters and this process's slot (accept.py), or None:
        uvicorn accepts as usual."""
        self.listeners: list[BalancedListener] = []
        self.state = state
        self.delay_s = delay_s
        self.supervised = supervised
        """Under the supervisor: only its SIGTERM drains (a terminal's Ctrl-C reaches every
        process of the group; the supervisor alone decides the order of the drain)."""
        self.drain_since: float | None = None
        self.native: NativeListener | None = None
        """The native front, when it serves."""

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self.supervised and sig == signal.SIGINT:
            return
        self.state.begin_drain()
        if self.native is not None:  # the front's own refusals stop at once
            self.native.publish(now=True)
        if self.drain_since is not None:  # second signal: stop waiting
            self.should_exit = True
            self.force_exit = True
            return
        self.drain_since = time.monotonic()
        if self.delay_s <= 0:
            self.should_exit = True

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        if self.grpc is not None:  # gRPC serves before HTTP can say ready
            setattr(self.lifespan, "startup", self._then_grpc(self.lifespan.startup))  # noqa: B010
        await self._start_http(sockets)
        if self.grpc is not None and self.grpc.server is not None:
            self.servers = [*self.servers, self.grpc]  # type: ignore[list-item]  # closed with them

    def _then_grpc(self, startup: Callable[[], Awaitable[None]]) -> Callable[[], Awaitable[None]]:
        """The lifespan's startup, then the gRPC front's (a port it cannot bind fails the
        start as uvicorn's own failures do: the lifespan shut down, STARTUP_FAILURE)."""
        grpc = self.grpc
        assert grpc is not None

        async def run() -> None:
            await startup()
            if self.lifespan.should_exit:
                return
            try:
                await grpc.start()
            except RuntimeError as exc:
                logging.getLogger("uvicorn.error").error("%s", exc)
                await self.lifespan.shutdown()
                self.lifespan.should_exit = True

        return run

    async def _start_http(self, sockets: list[socket.socket] | None) -> None:
        native = self._native()
        if not native and (self.balance is None or not sockets):
            await super().startup(sockets)
            return
        await super().startup([])  # the lifespan, and no asyncio server: ours accept
        s = self.state.settings
        if not sockets:  # the native front, started without sockets: bind here
            sockets = [socket.create_server((s.host, s.port), backlog=self.config.backlog)]
        front = self._front(sockets[0]) if native else None
        if front is None and self.balance is not None:
            slots, index = self.balance
            connections = self.server_state.connections
            handoff = protocol_handoff(asyncio.get_running_loop(), self._factory())
            self.listeners = [BalancedListener(sock, handoff, slots, index,
                                               lambda: len(connections))
                              for sock in sockets]
            for listener in self.listeners:
                listener.start()
        # uvicorn close()s them, then awaits their wait_closed()
        self.servers = [*self.listeners, *([front] if front is not None else [])]  # type: ignore[list-item]
        if front is not None:
            log.info("serving on http://%s:%d (native front)", *sockets[0].getsockname()[:2])

    def _front(self, sock: socket.socket) -> NativeListener:
        """The native front, accepting on `sock` (by the balance rule where the API
        processes share it)."""
        s = self.state.settings
        if self.balance is None:
            sock.listen(self.config.backlog)  # (as asyncio's create_server does)
        entry = getattr(self.config.app, "entry", None)  # (the app's lifecycle)
        head = getattr(self.config.app, "answer_head", None)
        now = getattr(entry, "answer_now", None)
        rule = getattr(entry, "front_rule", lambda: None)()
        listener = NativeListener(sock, self.config.loaded_app, head, now, s,
                                  self.lifespan.state,
                                  self.server_state.tasks, s.drain_timeout_s + 5.0,
                                  self.balance, rule)
        self.native = listener
        self.state.arriving.append(listener.front.arriving)
        return listener

    def _native(self) -> bool:
        """Whether this server runs the native front (`--front native` and built); logs
        the choice and why."""
        s = self.state.settings
        if s.front != "native":
            log.info("HTTP front: uvicorn (--front uvicorn)")
            return False
        front, why = native_front()
        log.info("HTTP front: %s (%s)", "native" if front else "uvicorn", why)
        return front is not None

    def _factory(self) -> Any:
        """uvicorn's protocol factory, as its own Server.startup makes it."""
        config = self.config
        protocol: Any = config.http_protocol_class
        return functools.partial(protocol, config=config, server_state=self.server_state,
                                 app_state=self.lifespan.state)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        """uvicorn's shutdown, after taking the connections that wait in the listen queue
        of uvicorn's own asyncio servers (the balanced listeners take theirs at close)."""
        loop = asyncio.get_running_loop()
        for server in self.servers:
            if not isinstance(server, BalancedListener):  # asyncio's (or uvloop's) server
                for listening in getattr(server, "sockets", None) or ():
                    sock = socket.socket(fileno=listening.fileno())
                    try:
                        serve_stopping(loop, protocol_handoff(loop, self._factory()),
                                       take_waiting(sock))
                    finally:
                        sock.detach()
        await super().shutdown(sockets)

    async def on_tick(self, counter: int) -> bool:
        for listener in self.listeners:
            listener.publish()
        if self.drain_since is not None and time.monotonic() - self.drain_since >= self.delay_s:
            self.should_exit = True
        return await super().on_tick(counter)


def build_server(app: object, state: AppState, supervised: bool = False,
                 balance: tuple[Slots, int] | None = None) -> DrainingServer:
    """The uvicorn server for `app` with the settings' host, port and drain timeout (and,
    under the supervisor, balanced accepting: `balance`)."""
    s = state.settings
    config = uvicorn.Config(
        app,  # type: ignore[arg-type]
        host=s.host,
        port=s.port,
        log_level=s.log_level,
        timeout_graceful_shutdown=int(max(1, round(s.drain_timeout_s))),
        timeout_keep_alive=max(1, round(s.keepalive_timeout_s)),
        http=guarded_protocol(s.header_timeout_s, max_headers=s.max_headers,
                              max_header_bytes=s.max_header_bytes,
                              max_url_bytes=s.max_url_bytes,
                              draining=lambda: state.draining, pace_s=s.refusal_pace_s,
                              answer_head=getattr(app, "answer_head", None)),
        lifespan="on",
        access_log=False,
    )
    grpc = GrpcServer(state, str(getattr(app, "version", "")), exclusive=not supervised) \
        if s.grpc else None
    if balance is not None:  # ready once every API process accepts
        state.peers_started = balance[0].started
    return DrainingServer(config, state, s.shutdown_delay_s, supervised, balance, grpc)
