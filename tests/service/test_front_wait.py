"""A front that reads requests off the event loop (the native one) stamps when each was read
(`web.http_protocol.RECEIVED`): the lifecycle counts the request's deadline and the queue wait
it may still have from then, so requests that waited in the front while the event loop was
behind are refused at once rather than admitted late."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace
from typing import Any

import pytest

from seqserve.service.api.lifecycle import Call, RequestCall, asgi_call, shed_early
from seqserve.service.core.errors import QueueFull
from seqserve.service.web.http_protocol import RECEIVED


class _Model:
    def __init__(self, wait: float | None) -> None:
        self.wait = wait

    def expected_wait(self) -> float | None:
        return self.wait


STATE: Any = SimpleNamespace(settings=SimpleNamespace(max_queue_wait_s=0.5, retry_after_s=1))


def test_the_wait_in_the_front_counts_against_the_queue_wait_allowed() -> None:
    now = time.monotonic()
    shed_early(STATE, _Model(0.4), 30.0)  # no stamp: the queue alone (0.4 <= 0.5)
    shed_early(STATE, _Model(0.2), 30.0, now - 0.1)  # 0.1 + 0.2 <= 0.5
    with pytest.raises(QueueFull, match="read and waiting"):
        shed_early(STATE, _Model(0.4), 30.0, now - 0.3)  # 0.3 + 0.4 > 0.5
    with pytest.raises(QueueFull, match="read and waiting"):
        shed_early(STATE, _Model(None), 30.0, now - 0.6)  # waited longer than allowed
    with pytest.raises(QueueFull):  # a deadline shorter than the queue wait allowed
        shed_early(STATE, _Model(0.0), 0.2, now - 0.25)


def test_the_deadline_counts_from_when_the_front_read_the_request() -> None:
    read = time.monotonic() - 2.0
    scope = {"type": "http", "headers": [], "extensions": {RECEIVED: read}}
    call = asgi_call(scope, _never, "m", None)
    assert call.received == read
    state: Any = SimpleNamespace(
        settings=SimpleNamespace(request_timeout_s=5.0),
        metrics=SimpleNamespace(in_flight=None), repository=SimpleNamespace(entries={}))

    async def deadline(c: Call) -> float:
        async with RequestCall(state, c, 5.0) as context:
            return context.deadline

    assert asyncio.run(deadline(call)) == pytest.approx(read + 5.0)
    fresh = asgi_call({"type": "http", "headers": []}, _never, "m", None)
    assert fresh.received is None
    assert asyncio.run(deadline(fresh)) == pytest.approx(time.monotonic() + 5.0, abs=0.5)


async def _never() -> Any:
    raise AssertionError("not read")
