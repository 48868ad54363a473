"""The engine's ZeroMQ sockets are closed for good: an API client and an engine socket,
each with its monitor, made and closed again and again in one process (as the tests and a
restarting API process do) leak no descriptors, and every fresh pair still talks. Before
`close_monitored`, a socket closed with its monitor on was never reaped, and after a few
dozen pairs the context connected no new socket at all (a client's Hello never answered)."""

from __future__ import annotations

import asyncio
import os
import tempfile

import zmq

from seqserve.service.engine import protocol as p
from seqserve.service.engine.client import EngineClient
from seqserve.service.engine.transport import Channel, close_monitored

ROUNDS = 40


def _descriptors() -> int:
    return len(os.listdir("/proc/self/fd"))


async def _round() -> None:
    address = f"ipc://{tempfile.mkdtemp(prefix='sq-')}/engine.sock"
    sock: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.ROUTER)
    sock.setsockopt(zmq.LINGER, 0)
    monitor = sock.get_monitor_socket(zmq.EVENT_DISCONNECTED)
    sock.bind(address)
    answer = p.encoder.encode([p.State([], {}, {})])
    engine = Channel(sock, lambda frames: engine.send([frames[0], answer]))
    engine_monitor = Channel(monitor, lambda frames: None)
    client = EngineClient(address)
    await client.start()
    try:
        state = await client.hello(5.0)
        assert state.models == []
    finally:
        await client.close()
        close_monitored(engine, engine_monitor)


def test_engine_sockets_are_reaped_and_fresh_pairs_talk() -> None:
    async def scenario() -> None:
        await _round()
        before = _descriptors()
        for _ in range(ROUNDS):
            await _round()
        await asyncio.sleep(0.2)  # the context's reaper closes descriptors asynchronously
        leaked = _descriptors() - before
        assert leaked < ROUNDS, f"{leaked} descriptors left after {ROUNDS} socket pairs"

    asyncio.run(asyncio.wait_for(scenario(), timeout=120))
