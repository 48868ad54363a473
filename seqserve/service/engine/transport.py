"""A ZeroMQ socket driven by the running asyncio loop, without pyzmq's asyncio wrapper.

Measured with py-spy in both processes under load: pyzmq's asyncio sockets spent more time
creating futures and re-arming events than in the sends and receives themselves. `Channel`
watches the socket's file descriptor with `loop.add_reader`, drains every queued message per
wake-up (the descriptor is edge-triggered: a wake-up may stand for many messages), and sends
without blocking (the high-water marks are off: the server's own queues bound the memory).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

import zmq

log = logging.getLogger("seqserve.engine.transport")


class Channel:
    """`socket` read by `on_message(frames)` callbacks on the running loop; `send(frames)`."""

    def __init__(self, socket: zmq.Socket[bytes],
                 on_message: Callable[[list[bytes]], None]) -> None:
        socket.setsockopt(zmq.SNDHWM, 0)
        socket.setsockopt(zmq.RCVHWM, 0)
        self.socket = socket
        self.on_message = on_message
        self.loop = asyncio.get_running_loop()
        self._fd = int(socket.getsockopt(zmq.FD))
        self._check_scheduled = False
        self.loop.add_reader(self._fd, self._drain)
        self._schedule_check()  # messages queued before the reader was added

    def send(self, frames: list[bytes]) -> None:
        self.socket.send_multipart(frames, zmq.NOBLOCK, copy=False)
        self._schedule_check()  # a send can consume the descriptor's read edge

    def close(self) -> None:
        if not self.socket.closed:
            self.loop.remove_reader(self._fd)
            self.socket.close(linger=0)


    def _schedule_check(self) -> None:
        if not self._check_scheduled:
            self._check_scheduled = True
            self.loop.call_soon(self._drain)

    def _drain(self) -> None:
        self._check_scheduled = False
        socket = self.socket
        while not socket.closed and socket.getsockopt(zmq.EVENTS) & zmq.POLLIN:  # type: ignore[operator,arg-type]
            try:
                frames = socket.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            try:
                self.on_message(frames)
            except Exception:  # one bad message must not stop the others
                log.exception("a message could not be handled")


def close_monitored(channel: Channel | None, monitor: Channel | None) -> None:
    """Close a socket and its monitor: the monitor stopped first. A socket closed with its
    monitor still on is never reaped: every such pair leaks descriptors and sockets in the
    ZeroMQ context, and after a few dozen (tests make many engines and clients in one process)
    the context stops connecting new sockets at all, silently (measured: 31 of 60 fresh pairs
    never exchanged a message; 0 of 60 with `disable_monitor()` first)."""
    if channel is not None and not channel.socket.closed and monitor is not None:
        with contextlib.suppress(zmq.ZMQError):
            channel.socket.disable_monitor()
    if monitor is not None:
        monitor.close()
    if channel is not None:
        channel.close()
