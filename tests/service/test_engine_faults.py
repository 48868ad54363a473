"""Faults between the API processes and the engine process are answered, never waited out.

An engine and a client in one loop over a real ipc socket, with faults injected: a runtime
that raises, a decoder that raises mid-decode, the engine's answer that cannot be built, the
client's reading of an answer that raises, a send that fails, the engine going away, an API
process that died holding work. Each request gets its own answer at once (a deadline far in
the future: a wait would show as the test's timeout).
"""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zmq
from service_fakes import FakeRuntime, fake_factory

import seqserve.service.engine.server as server_module
from seqserve.service.core import errors
from seqserve.service.core.metrics import Metrics
from seqserve.service.engine import protocol as p
from seqserve.service.engine.client import EngineClient, _Pending
from seqserve.service.engine.server import EngineServer
from seqserve.service.runtimes import load_runtime
from seqserve.service.scheduling.search import SearchOptions
from seqserve.service.server.composition import engine_options
from seqserve.service.web.settings import Settings

CLF, MT = ("tiny-clf", 1), ("tiny-mt", 1)
ROW = [[4, 5, 6]]
WAIT_S = 20.0
"""Bound on each await: far beyond an answer, far below the request deadline (60 s)."""


@contextlib.asynccontextmanager
async def engine_and_client(repo: Path, factory: Any = None,
                            **settings: Any) -> AsyncIterator[tuple[EngineServer, EngineClient]]:
    options = engine_options(Settings(repo=repo, warmup=False, **settings))
    address = f"ipc://{tempfile.mkdtemp(prefix='sq-')}/engine.sock"
    engine = EngineServer(options, Metrics(), factory)
    await engine.load()
    stop = asyncio.Event()
    serving = asyncio.create_task(engine.serve(address, stop))
    client = EngineClient(address, retry_after_s=2.0)
    await client.start()
    await client.hello(WAIT_S)
    try:
        yield engine, client
    finally:
        stop.set()
        await serving
        await engine.drain(2.0)
        await client.close()


def deadline() -> float:
    return time.monotonic() + 60


async def outcome(futures: list[asyncio.Future[Any]]) -> list[Any]:
    return await asyncio.wait_for(asyncio.gather(*futures, return_exceptions=True), WAIT_S)


def test_runtime_faults_and_bugs_answer_their_request_alone(
        tiny_repo: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    runtime = FakeRuntime()

    async def scenario() -> None:
        async with engine_and_client(tiny_repo, fake_factory(runtime),
                                     max_wait_ms=0) as (engine, client):
            runtime.fail_next = 1  # the runtime raises for this batch
            (failed,) = await outcome(client.rows(*CLF, ROW, deadline()))
            assert isinstance(failed, errors.InferenceFailed) and failed.status == 500
            (ok,) = await outcome(client.rows(*CLF, ROW, deadline()))
            assert ok.value[0].shape[-1] == 3  # the next request is served

            model = engine.engine.served[CLF]  # a bug before the batcher: not a ServiceError
            monkeypatch.setattr(model, "submit", lambda rows, d: 1 / 0)
            (bug,) = await outcome(client.rows(*CLF, ROW, deadline()))
            assert isinstance(bug, errors.InferenceFailed) and "division" in str(bug), bug
            monkeypatch.undo()

            def broken_rows(*a: Any) -> Any:
                raise RuntimeError("answer cannot be built")
            monkeypatch.setattr(server_module, "_rows", broken_rows)  # the answer's conversion
            (unbuilt,) = await outcome(client.rows(*CLF, ROW, deadline()))
            assert isinstance(unbuilt, errors.InferenceFailed), unbuilt
            monkeypatch.undo()

            def unreadable(*a: Any) -> Any:
                raise ValueError("answer cannot be read")
            monkeypatch.setattr(p, "from_array", unreadable)  # the client's side of it
            (unread,) = await outcome(client.rows(*CLF, ROW, deadline()))
            assert isinstance(unread, errors.InferenceFailed), unread
            monkeypatch.undo()
            assert not client._pending and not engine.inflight
            (ok,) = await outcome(client.rows(*CLF, ROW, deadline()))
            assert not isinstance(ok, BaseException)

    asyncio.run(scenario())


class FailingDecoder:
    """The real runtime, whose decoder step raises from its `after`-th call on."""

    def __init__(self, inner: Any, after: int) -> None:
        self.inner, self.after, self.steps = inner, after, 0
        self.providers, self.name = inner.providers, inner.name

    def run(self, graph: str, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        if graph == "decoder_step":
            self.steps += 1
            if self.steps >= self.after:
                raise RuntimeError("injected decoder fault")
        return self.inner.run(graph, inputs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def test_a_decoder_that_raises_mid_decode_fails_its_request(tiny_repo: Path) -> None:
    made: list[FailingDecoder] = []

    def factory(spec: Any, path: Path, manifest: Any) -> Any:
        runtime = load_runtime(spec, path, manifest)
        if manifest.task != "translator":
            return runtime
        made.append(FailingDecoder(runtime, after=3))
        return made[-1]

    async def scenario() -> None:
        async with engine_and_client(tiny_repo, factory) as (engine, client):
            options = SearchOptions(beam_size=2, max_length=20, min_length=10)
            (failed,) = await outcome(client.translate(*MT, ROW, options, deadline()))
            assert isinstance(failed, errors.InferenceFailed), failed
            assert made[0].steps >= 3  # it failed mid-decode, after some steps succeeded
            assert not client._pending and not engine.inflight

            # a request the engine cannot read is the request's fault: 400
            rid = next(client._ids)
            future = asyncio.get_running_loop().create_future()
            client._pending[rid] = entry = _Pending([future], True, MT)
            lengths, ids = p.pack_rows(ROW)
            client._send(p.SubmitTranslate(rid, *MT, deadline(), lengths, ids, {"bogus": 1}))
            (bad,) = await outcome([future])
            assert isinstance(bad, errors.BadRequest) and bad.status == 400, bad
            assert entry.done and not client._pending

    asyncio.run(scenario())


def test_a_failed_send_leaves_nothing_pending_and_answers_503(tiny_repo: Path) -> None:
    async def scenario() -> None:
        async with engine_and_client(tiny_repo, fake_factory(FakeRuntime())) as (_, client):
            channel = client._channel
            assert channel is not None

            def refuse(frames: list[bytes]) -> None:
                raise zmq.ZMQError(zmq.EAGAIN, "injected send failure")
            real, channel.send = channel.send, refuse  # type: ignore[method-assign]
            # two requests of one loop turn travel in one message: both fail with it
            refused = await outcome([*client.rows(*CLF, ROW, deadline()),
                                     *client.rows(*CLF, ROW, deadline())])
            assert all(isinstance(r, errors.EngineUnavailable) for r in refused), refused
            assert all(r.status == 503 and r.retry_after == 2.0 for r in refused)
            assert not client._pending
            channel.send = real  # type: ignore[method-assign]
            (ok,) = await outcome(client.rows(*CLF, ROW, deadline()))
            assert not isinstance(ok, BaseException)

    asyncio.run(scenario())


def test_the_engine_going_away_answers_every_pending_request_503(tiny_repo: Path) -> None:
    """The engine's socket closes (as when its process dies) while requests compute: each is
    answered EngineUnavailable at once, and so is every new one."""
    runtime = FakeRuntime(delay_s=30.0)  # nothing would come back before the test's timeout

    async def scenario() -> None:
        async with engine_and_client(tiny_repo, fake_factory(runtime),
                                     max_wait_ms=0) as (engine, client):
            pending = [f for _ in range(4) for f in client.rows(*CLF, ROW, deadline())]
            while len(engine.inflight) < 4:
                await asyncio.sleep(0.01)
            assert engine.channel is not None
            engine.channel.close()  # what the engine's death does to its end of the socket
            answers = await outcome(pending)
            assert all(isinstance(a, errors.EngineUnavailable) for a in answers), answers
            assert all(a.retry_after == 2.0 for a in answers)
            assert client.down and not client.lost and not client._pending  # within the bound
            with pytest.raises(errors.EngineUnavailable):
                client.rows(*CLF, ROW, deadline())
            runtime.delay_s = 0.0

    asyncio.run(scenario())


def test_the_work_of_a_dead_api_process_is_dropped(tiny_repo: Path) -> None:
    """Work held for an identity that names a process that is gone is cancelled (its rows
    freed); work of live processes stays."""
    runtime = FakeRuntime(delay_s=0.5)
    dead = subprocess.Popen(["true"])
    dead.wait()  # reaped: its pid names no process
    gone = p.IDENTITY_PREFIX + f"{dead.pid}-00".encode()
    assert p.identity_pid(gone) == dead.pid

    async def scenario() -> None:
        async with engine_and_client(tiny_repo, fake_factory(runtime),
                                     max_wait_ms=0, max_batch_size=1) as (engine, client):
            lengths, ids = p.pack_rows(ROW)
            for rid in range(1, 5):  # queued behind each other (batch size 1)
                engine.handle(gone, p.SubmitRows(rid, *CLF, deadline(), lengths, ids))
            mine = client.rows(*CLF, ROW, deadline())
            held = [engine.inflight[gone, rid] for rid in range(1, 5)]
            assert engine.drop_orphans() == 4
            assert not any(k[0] == gone for k in engine.inflight)
            (ok,) = await outcome(mine)  # the live client's request is still answered
            assert not isinstance(ok, BaseException)
            assert all(f.done() for f in held)
            # computed: at most the dropped request already running, and the live one
            assert len(runtime.calls) <= 2, runtime.calls

    asyncio.run(scenario())
