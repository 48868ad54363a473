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
