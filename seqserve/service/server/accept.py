"""Balanced accepting: the API processes share one listening socket and its connections.

Every API process inherits the supervisor's one listening socket. Left to uvicorn, each
process's loop accepts every connection waiting when it wakes, so whichever wakes first takes
a burst: 64 keep-alive connections opened at once split 13/51, 24/40, 29/35 over two processes
(`ss -tnp` under `wrk -c64`), and the connections of the fuller process waited longer for
every answer for as long as they lived (the p99 of the whole server).

Here each process publishes how many connections it holds in a shared file of counters, one
slot per API process (`Slots`, created by the supervisor), and takes the next connection only
while it holds at most `SLACK` (1) more than the least loaded live process (`may_accept`);
otherwise it stops watching the socket for `RECHECK_S` and looks again, leaving the
connection to a process with fewer. A connection waits no longer than `MAX_DEFER_S` for
that: a process that is wedged (or slow to wake) with a low count cannot hold connections
back, the others then take them. A slot reads `GONE` while its process does not accept
(stopped, dead: the supervisor resets a dead process's slot before it starts the
replacement), `STARTING` from the server's start until its process first accepts: the
server's readiness waits for every process (`Slots.started`).

The native front (server/native.py) accepts by the same rule on the same counters in its own
threads (native/front/src/lib.rs: `Slots`, `accept_loop`), so a connection is never left
waiting for a busy event loop; `BalancedListener` here is the uvicorn front's: its accepted
sockets go to uvicorn's protocol through `loop.connect_accepted_socket`, so every connection
is served exactly as uvicorn serves the ones it accepts itself.

Stopping to listen loses nothing: the connections already waiting in the listen queue
(accepted by the kernel, their requests perhaps sent) would be reset when the last copy of
the socket closes, so `close()` takes every one waiting first (`take_waiting`, whatever the
balance) and hands it to the protocol stopping (`serve_stopping`: its request, when already
sent, is read and answered with `Connection: close`; else it is closed at once). The
supervisor closed its own copy at the signal, and each API process takes what waits as it
closes, so only a connection that arrives after the last process closed is refused (it sent
nothing yet). The one-listener server (uvicorn's own asyncio server) does the same at its
close (server/shutdown.py).
"""

from __future__ import annotations

import asyncio
import logging
import mmap
import os
import socket
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

log = logging.getLogger("seqserve.accept")

SLOTS_ENV = "SEQSERVE_CONNECTION_SLOTS"
"""Path of the shared counters file (set by the supervisor when it runs several API
processes)."""
SLOT_ENV = "SEQSERVE_API_SLOT"
"""This API process's slot in that file."""
GONE = 1 << 62
"""A slot's value while its process accepts nothing."""
STARTING = GONE + 1
"""A slot's value from the server's start until its process first accepts (a process that
accepts nothing, as GONE; a replacement's slot reads GONE): until every process accepts, the
server is not ready, or the first process ready would take every keep-alive connection a
client opens at once (64 of 64, for as long as they lived: half the server's CPU idle, and
its queue twice as long, 429s in a closed loop of long texts)."""
RECHECK_S = 0.002
"""How long a process that is not the least loaded leaves a waiting connection to the others
before it looks again."""
MAX_DEFER_S = 0.02
"""The longest a connection is left waiting for a less loaded process (then this one takes
it)."""
BACKOFF_S = 0.1
"""Pause before accepting again after accept() failed (out of file descriptors)."""


class Slots:
    """The shared counters: one signed 64-bit integer per API process, in a file every
    process maps (aligned 8-byte stores and loads: a reader sees an old or a new count,
    never a torn one)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)
        """The file (the native front maps it too, and accepts by the same rule)."""
        with open(path, "r+b") as f:
            self._map = mmap.mmap(f.fileno(), 0)
        self._counts = memoryview(self._map).cast("q")

    @staticmethod
    def create(path: str | os.PathLike[str], n: int) -> Path:
        """A file of `n` slots, every one STARTING."""
        Path(path).write_bytes(STARTING.to_bytes(8, "little", signed=True) * n)
        return Path(path)

    def started(self) -> bool:
        """Whether every API process has accepted since the server started (no slot reads
        STARTING): the server's readiness waits for it."""
        return STARTING not in self._counts.tolist()

    def rule(self, index: int) -> tuple[str, int, int, int, float, float]:
        """What the native front needs to accept by `may_accept` on these counters as slot
        `index`: the file, the slot, GONE, SLACK, RECHECK_S, MAX_DEFER_S."""
        return self.path, index, GONE, SLACK, RECHECK_S, MAX_DEFER_S

    def __len__(self) -> int:
        return len(self._counts)

    def __getitem__(self, i: int) -> int:
        return int(self._counts[i])

    def __setitem__(self, i: int, value: int) -> None:
        self._counts[i] = value

    def values(self) -> list[int]:
        return self._counts.tolist()


SLACK = 1
"""Connections a process may hold above the least loaded live one and still accept: with 0,
clients that open a connection per request (counts moving by one all the time) can make the
processes sit out 2 ms after nearly every connection (a fixed-text client: 2,843-2,888
req/s against 3,036 without balancing, 3,091-3,190 with 1; docs/performance.md, section 16);
a burst of keep-alive connections still splits within 2."""


def may_accept(me: int, counts: list[int]) -> bool:
    """Whether slot `me` may take the next connection: it holds at most SLACK more than
    every other live process (equal processes all accept)."""
    limit = counts[me] - SLACK
    return all(c >= limit for i, c in enumerate(counts) if i != me and c < GONE)


Handoff = Callable[[socket.socket, bool], Awaitable[None]]
"""Serves an accepted connection: uvicorn's protocol (`protocol_handoff`) or the native
front (`server/native.py`); True: the server stops (a request already sent is answered, then
the connection closes)."""


def protocol_handoff(loop: asyncio.AbstractEventLoop,
                     factory: Callable[[], asyncio.Protocol]) -> Handoff:
    """The hand-off of accepted connections to an asyncio protocol (uvicorn's)."""
    async def hand(conn: socket.socket, stopping: bool) -> None:
        conn.setblocking(False)
        if conn.family in (socket.AF_INET, socket.AF_INET6):
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        _, protocol = await loop.connect_accepted_socket(factory, conn)
        stop = getattr(protocol, "shutdown", None) if stopping else None
        if stop is not None:
            stop()

    return hand


class BalancedListener:
    """Accepts on `sock` while this process is the least loaded (see the module doc) and
    hands each connection over (`handoff`). `connections()` is how many connections this
    process holds; it stands in for the asyncio server uvicorn would have made (`close()`)."""

    def __init__(self, sock: socket.socket, handoff: Handoff,
                 slots: Slots, index: int, connections: Callable[[], int]) -> None:
        self.sock = sock
        self.handoff = handoff
        self.slots = slots
        self.index = index
        self.connections = connections
        self.loop = asyncio.get_running_loop()
        self._starting = 0  # accepted, not yet handed to a protocol
        self._waiting_since: float | None = None
        """When this listener first left the connections now waiting to the others (None:
        it has not, since it last accepted or found none waiting)."""
        self._timer: asyncio.TimerHandle | None = None
        self._watching = False
        self._closed = False
        self.accepted = 0
        self.deferrals = 0

    def start(self) -> None:
        self.sock.setblocking(False)
        self.publish()
        self._watch()

    def publish(self) -> int:
        """Write this process's count to its slot (also on uvicorn's ticks: closed
        connections leave without telling the listener); returns it."""
        count = self.connections() + self._starting
        if not self._closed:
            self.slots[self.index] = count
        return count

    def _watch(self) -> None:
        self._timer = None
        if not self._closed and not self._watching:
            self.loop.add_reader(self.sock.fileno(), self._ready)
            self._watching = True

    def _pause(self, seconds: float) -> None:
        if self._watching:
            self.loop.remove_reader(self.sock.fileno())
            self._watching = False
        self._timer = self.loop.call_later(seconds, self._watch)

    def _ready(self) -> None:
        """The socket has a connection waiting: take it (and the next ones) while this
        process is the least loaded, else leave them to the others for a moment."""
        while not self._closed:
            self.publish()
            if not may_accept(self.index, self.slots.values()) and self._defer():
                return
            try:
                conn, _ = self.sock.accept()
            except (BlockingIOError, InterruptedError):
                self._waiting_since = None  # another process took it
                return
            except OSError as exc:  # EMFILE and the like: the connections wait, we retry
                log.warning("accept failed (%s): retrying in %.1f s", exc, BACKOFF_S)
                self._pause(BACKOFF_S)
                return
            self._waiting_since = None
            self.accepted += 1
            self._starting += 1
            self.loop.create_task(self._connect(conn))

    def _defer(self) -> bool:
        """True: leave the waiting connection to the others for RECHECK_S; False: it has
        waited MAX_DEFER_S already, by the clock from the first look that left it (a busy
        loop looks less often than every RECHECK_S), take it."""
        now = time.monotonic()
        if self._waiting_since is None:
            self._waiting_since = now
        if now - self._waiting_since >= MAX_DEFER_S:
            return False
        self.deferrals += 1
        self._pause(RECHECK_S)
        return True

    async def _connect(self, conn: socket.socket) -> None:
        try:
            await self.handoff(conn, False)
        except Exception as exc:  # the client left at once, or a socket option failed
            log.debug("accepted connection dropped: %s", exc)
            conn.close()
        finally:
            self._starting -= 1
            self.publish()

    def close(self) -> None:
        """Stop accepting (uvicorn's shutdown), after taking every connection waiting in the
        listen queue (module doc); the slot reads GONE from now on."""
        if self._closed:
            return
        serve_stopping(self.loop, self.handoff, take_waiting(self.sock))
        self._closed = True
        if self._timer is not None:
            self._timer.cancel()
        if self._watching:
            self.loop.remove_reader(self.sock.fileno())
            self._watching = False
        self.slots[self.index] = GONE
        self.sock.close()

    async def wait_closed(self) -> None:
        return None


def take_waiting(sock: socket.socket) -> list[socket.socket]:
    """Every connection waiting in `sock`'s listen queue now (non-blocking accepts)."""
    taken: list[socket.socket] = []
    blocking = sock.getblocking()
    sock.setblocking(False)
    try:
        while True:
            try:
                conn, _ = sock.accept()
            except (BlockingIOError, InterruptedError):
                break
            except OSError as exc:  # out of descriptors: what waits is reset at the close
                log.warning("connections waiting at close not taken: %s", exc)
                break
            taken.append(conn)
    finally:
        sock.setblocking(blocking)
    return taken


def serve_stopping(loop: asyncio.AbstractEventLoop, handoff: Handoff,
                   conns: list[socket.socket]) -> None:
    """Hand connections taken at close over, each told at once that the server stops (a
    request already sent is answered, then the connection closes)."""
    async def one(conn: socket.socket) -> None:
        try:
            await handoff(conn, True)
        except Exception as exc:  # the client left at once
            log.debug("connection taken at close dropped: %s", exc)
            conn.close()

    for conn in conns:
        loop.create_task(one(conn))
    if conns:
        log.info("stopping to listen: %d connections waiting taken and answered",
                 len(conns))


def slots_from_env() -> tuple[Slots, int] | None:
    """This API process's counters and slot, when the supervisor set them."""
    path, index = os.environ.get(SLOTS_ENV), os.environ.get(SLOT_ENV)
    if not path or index is None:
        return None
    return Slots(path), int(index)
