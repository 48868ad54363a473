"""Work lanes (seqserve.service.scheduling.lanes): items run on their lane's own thread, in
order, off the event loop; every result and every exception comes back to the loop."""

from __future__ import annotations

import asyncio
import threading
import time

from seqserve.service.scheduling.lanes import Lanes


def test_each_lane_runs_its_items_in_order_on_its_own_thread() -> None:
    ran: list[tuple[str, str]] = []

    def run(item: str) -> str:
        if item == "bad":
            raise ValueError("bad item")
        time.sleep(0.002 if item.startswith("a") else 0.0)
        ran.append((threading.current_thread().name, item))
        return item.upper()

    async def main() -> tuple[list[tuple[str, object]], int]:
        lanes: Lanes[str, str] = Lanes(run, ["first", "second"])
        lanes.start()
        loop_thread = threading.current_thread().name
        for item in ("a1", "a2", "a3"):
            lanes.put(0, item)
        for item in ("b1", "bad", "b2"):
            lanes.put(1, item)
        got: list[tuple[str, object]] = []
        while lanes.in_flight:
            got += await lanes.completed()
        assert all(name != loop_thread for name, _ in ran)
        lanes.stop()
        return got, lanes.in_flight

    got, in_flight = asyncio.run(main())
    assert in_flight == 0 and len(got) == 6
    results = dict(got)
    assert results["a2"] == "A2" and results["b2"] == "B2"
    assert isinstance(results["bad"], ValueError)  # the loop decides what a failure means
    assert [item for name, item in ran if name == "first"] == ["a1", "a2", "a3"]
    assert [item for name, item in ran if name == "second"] == ["b1", "b2"]
    assert [w for w, _ in got if w.startswith("a")] == ["a1", "a2", "a3"]  # returned in order


def test_stop_waits_for_the_items_a_lane_holds() -> None:
    finished: list[int] = []

    def run(item: int) -> int:
        time.sleep(0.01)
        finished.append(item)
        return item

    async def main() -> None:
        lanes: Lanes[int, int] = Lanes(run, ["only"])
        lanes.start()
        for i in range(3):
            lanes.put(0, i)
        lanes.stop()  # blocks until the thread has run all three

    asyncio.run(main())
    assert finished == [0, 1, 2]


def test_on_the_loops_thread_short_calls_run_at_once_and_come_back_in_a_later_callback(
        ) -> None:
    """`on_loop`: once the lane's calls are measured short, `put` runs the item on the event
    loop's own thread before it returns; its result (or exception) comes back as a thread's
    would, in a callback of its own, in order. A call not measured yet, or after calls
    measured long, runs on the lane's thread: a slow call never holds the loop."""
    ran: list[tuple[str, int]] = []

    def run(item: int) -> int:
        if item == 3:
            raise ValueError("bad item")
        if item >= 100:
            time.sleep(0.03)  # over INLINE_MAX_S
        ran.append((threading.current_thread().name, item))
        return item * 2

    async def main() -> None:
        lanes: Lanes[int, int] = Lanes(run, ["first", "second"], on_loop=True)
        lanes.start()
        here = threading.current_thread().name
        lanes.put(0, 0)  # not measured yet: on its thread
        assert await lanes.completed() == [(0, 0)] and ran[-1][0] == "first"
        lanes.put(0, 1)
        lanes.put(0, 3)
        assert ran[-1] == (here, 1)  # run already, on the loop's thread
        assert lanes.in_flight == 2 and not lanes._results  # not back yet
        got = await lanes.completed()
        assert got[0] == (1, 2) and got[1][0] == 3 and isinstance(got[1][1], ValueError)
        assert lanes.in_flight == 0
        lanes.put(0, 100)  # short so far: on the loop, measured long
        lanes.put(0, 101)  # now on its thread, and while it is there...
        lanes.put(0, 2)  # ... the next waits behind it there, in order
        got = []
        while lanes.in_flight:
            got += await lanes.completed()
        assert got == [(100, 200), (101, 202), (2, 4)]
        assert [name for name, _ in ran[-3:]] == [here, "first", "first"]
        lanes.put(1, 5)  # the other lane: measured on its own
        assert (await lanes.completed()) == [(5, 10)] and ran[-1] == ("second", 5)
        lanes.stop()

    asyncio.run(main())
