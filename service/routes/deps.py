"""Dependencies shared by routes: the app state and the per-request `Call`."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator

from fastapi import Request

from service.app import AppState
from service.workers.base import Call


def app_state(request: Request) -> AppState:
    state: AppState = request.app.state.seqserve
    return state


async def _watch_disconnect(request: Request, call: Call) -> None:
    """Set `call.disconnected` when the server reports the client gone."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            call.disconnected.set()
            return


@contextlib.asynccontextmanager
async def call_scope(request: Request) -> AsyncIterator[Call]:
    """A Call with the request deadline; watches for disconnects while the handler runs."""
    state = app_state(request)
    call = Call(deadline=time.monotonic() + state.settings.request_timeout_s)
    request.state.call = call
    name = request.path_params.get("name", "")
    gauge = state.metrics.in_flight.labels(name) if name in state.repository.entries else None
    if gauge is not None:
        gauge.inc()
    watcher = asyncio.create_task(_watch_disconnect(request, call))
    try:
        yield call
    finally:
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await watcher
        if gauge is not None:
            gauge.dec()


async def new_call(request: Request) -> AsyncIterator[Call]:
    """`call_scope` as a FastAPI dependency (`call: Call = Depends(new_call)`)."""
    async with call_scope(request) as call:
        yield call
