"""Balanced accepting (seqserve.service.server.accept): the rule, the shared counters, and a
listener on a real socket that leaves connections to a less loaded process but never holds
them back from clients when that process does not take them."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from seqserve.service.server.accept import (
    GONE,
    MAX_DEFER_S,
    STARTING,
    BalancedListener,
    Slots,
    may_accept,
    protocol_handoff,
)
from seqserve.service.server.native import native_front


def test_the_least_loaded_live_process_accepts() -> None:
    assert may_accept(0, [3, 3])  # equal processes all accept
    assert may_accept(0, [2, 3, 4])
    assert may_accept(0, [4, 3])  # one above the least loaded (SLACK): still
    assert not may_accept(0, [5, 3])
    assert may_accept(0, [9, GONE])  # the other accepts nothing (stopped, dead)
    assert may_accept(0, [9, STARTING])  # (not yet)
    assert may_accept(1, [GONE, 9, GONE])
    assert not may_accept(2, [GONE, 1, 3])


def test_slots_are_shared_between_mappings(tmp_path: Path) -> None:
    path = Slots.create(tmp_path / "connections", 3)
    a, b = Slots(path), Slots(path)
    assert len(a) == 3 and a.values() == [STARTING] * 3 and not a.started()
    a[1] = 7
    assert b[1] == 7 and b.values() == [STARTING, 7, STARTING]
    a[0], a[2] = 0, GONE  # one accepts, one stopped: every one has started
    assert b.started()


class _Held(asyncio.Protocol):
    made: list[float] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.made.append(time.monotonic())
        self.transport = transport


async def _accepts(folder: Path, others: int, mine: int, busy_s: float = 0.0,
                   ) -> tuple[float, BalancedListener, list[int]]:
    """Seconds until a listener holding `mine` connections, next to a process whose slot
    reads `others` and never accepts, takes a new connection; the listener; the counts.
    `busy_s`: every turn of the loop also runs a callback that holds it that long (a loop
    saturated by other work, as under overload)."""
    loop = asyncio.get_running_loop()
    busy = [True]

    def hold() -> None:
        time.sleep(busy_s)
        if busy[0]:
            loop.call_soon(hold)

    if busy_s:
        loop.call_soon(hold)
    slots = Slots(Slots.create(folder / f"c-{others}-{mine}-{busy_s}", 2))
    slots[1] = others
    server = socket.create_server(("127.0.0.1", 0))
    _Held.made = []
    handoff = protocol_handoff(asyncio.get_running_loop(), _Held)
    listener = BalancedListener(server, handoff, slots, 0, lambda: mine + len(_Held.made))
    listener.start()
    client = socket.socket()
    client.setblocking(False)
    begin = time.monotonic()
    try:
        client.connect_ex(server.getsockname())
        while not _Held.made and time.monotonic() - begin < 5:
            await asyncio.sleep(0.001)
        await asyncio.sleep(0.01)  # the hand-over publishes the count
        counts = slots.values()
    finally:
        busy[0] = False
        listener.close()
        client.close()
    assert _Held.made, "never accepted"
    return _Held.made[0] - begin, listener, counts


def test_a_listener_leaves_a_connection_to_a_less_loaded_process_only_for_a_moment(
        tmp_path: Path) -> None:
    waited, listener, counts = asyncio.run(_accepts(tmp_path, others=0, mine=5))
    # it left the connection to the other for MAX_DEFER_S (in RECHECK_S looks), then took it
    assert listener.accepted == 1 and listener.deferrals >= 2
    assert waited >= MAX_DEFER_S * 0.9, waited
    assert counts[0] == 6  # its count includes the new connection
    assert listener.slots[0] == GONE  # closed: accepts nothing any more
    waited, listener, _ = asyncio.run(_accepts(tmp_path, others=5, mine=5))
    # as loaded as the other: it takes it at once (then holds one more: the next one waits)
    assert listener.accepted == 1 and listener.deferrals <= 1


def test_a_saturated_loop_still_takes_a_connection_the_others_leave(tmp_path: Path) -> None:
    """Each turn of the loop held 15 ms (more than 3 RECHECK_S looks apart): the wait for the
    less loaded process is MAX_DEFER_S by the clock, so the connection is taken after a few
    turns. (Counting looks instead, and starting the count again when they came far apart,
    left it waiting for as long as the other process did not take it: here for ever.)"""
    waited, listener, _ = asyncio.run(_accepts(tmp_path, others=0, mine=5, busy_s=0.015))
    assert listener.accepted == 1 and listener.deferrals >= 1
    assert MAX_DEFER_S * 0.9 <= waited < 1.0, waited


def _until(check: Callable[[], bool], seconds: float = 5.0) -> float:
    """Seconds until `check()` holds (fails the test after `seconds`)."""
    begin = time.monotonic()
    while not check():
        assert time.monotonic() - begin < seconds, "never happened"
        time.sleep(0.0005)
    return time.monotonic() - begin


def test_the_native_front_accepts_by_the_same_rule_in_its_own_threads(tmp_path: Path) -> None:
    """Where several API processes share the socket, the native front accepts in its own
    threads (never waiting for a busy event loop) by the same rule and counters: it takes
    connections while the others are as loaded, leaves one to a less loaded process for
    MAX_DEFER_S only, publishes its count as connections come and go, and reads GONE once
    it stops accepting."""
    front_class, why = native_front()
    if front_class is None:
        pytest.skip(why)
    slots = Slots(Slots.create(tmp_path / "connections", 2))
    server = socket.create_server(("127.0.0.1", 0))
    server.setblocking(False)
    address = server.getsockname()
    front = front_class(server.fileno(), slots=slots.rule(0))
    clients: list[socket.socket] = []
    try:
        for _ in range(2):  # the other process accepts nothing yet (STARTING): taken at once
            clients.append(socket.create_connection(address))
        _until(lambda: front.connections() == 2 and slots[0] == 2)
        assert front.stats()["deferrals"] == 0
        slots[1] = 0  # a live process holding none: the next connection is left to it
        clients.append(socket.create_connection(address))
        waited = _until(lambda: front.connections() == 3)
        assert MAX_DEFER_S * 0.9 <= waited < 1.0, waited
        assert front.stats()["deferrals"] >= 2 and slots[0] == 3
        slots[1] = 3  # as loaded: taken without a deferral
        deferred = front.stats()["deferrals"]
        clients.append(socket.create_connection(address))
        _until(lambda: front.connections() == 4)
        assert front.stats()["deferrals"] == deferred and slots[0] == 4
        clients.pop().close()  # a connection that ends leaves the count
        _until(lambda: slots[0] == 3)
        front.pause()
        assert slots[0] == GONE
        clients[0].close()
        _until(lambda: front.connections() == 2)
        assert slots[0] == GONE  # stopped: it stays GONE
    finally:
        for c in clients:
            c.close()
        front.close(0.2)
        server.close()
