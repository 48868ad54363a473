"""The API-process side of the engine: one DEALER socket, requests matched to replies by id.

`EngineClient.hello()` asks the engine which models it serves (each with the verified
manifest and limits the engine loaded it with) and its effective options; `RemoteRowModel` and
`RemoteDecodeModel` are those models as workers see them: the same `submit(...)` returning one
future per row or source as the in-process `BatchedModel` / `DecodedModel`, so the workers do
not know where their model runs. When a request's futures are cancelled (deadline, client
gone) the engine is told, and drops the work.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import itertools
import logging
import time
from collections.abc import Sequence
from typing import Any

import zmq

import seqserve.service.core.errors as errors
from seqserve.service.engine import protocol as p
from seqserve.service.engine.transport import Channel
from seqserve.service.scheduling.base import Timed, Timing
from seqserve.service.scheduling.decoding import Decoded
from seqserve.service.scheduling.lm import GenerateOptions, TokenEvent, TokenStream
from seqserve.service.scheduling.search import Hypothesis, SearchOptions

log = logging.getLogger("seqserve.engine.client")


WAIT_TTL_S = 0.5
"""How long an engine's report of a model's queue wait stays usable for early shedding."""


class EngineUnavailable(Exception):
    """The engine did not answer in time."""


@dataclasses.dataclass(eq=False)
class _Pending:
    futures: list[asyncio.Future[Any]]
    decoding: bool
    model: tuple[str, int]
    done: bool = False


class EngineClient:
    """One connection from this process to the engine at `address`."""

    def __init__(self, address: str) -> None:
        self.address = address
        self._ids = itertools.count(1)
        self._pending: dict[int, _Pending] = {}
        self._state: asyncio.Future[p.State] | None = None
        self._waits: dict[tuple[str, int], tuple[float, float]] = {}
        """(model, version) -> (expected queue wait, time.monotonic() when reported)."""
        self._channel: Channel | None = None
        self._streams: dict[int, tuple[TokenStream, tuple[str, int], list[int]]] = {}
        """Generations in flight: their stream, model and sequences not finished."""

    async def start(self) -> None:
        sock: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(self.address)
        self._channel = Channel(sock, self._on_frames)

    async def close(self) -> None:
        if self._channel is not None:
            self._channel.close()
        for pending in self._pending.values():
            _fail(pending, errors.ShuttingDown("this API process is stopping"))
        self._pending.clear()
        for stream, _, _ in self._streams.values():
            stream.put(errors.ShuttingDown("this API process is stopping"))
        self._streams.clear()

    async def hello(self, timeout: float) -> p.State:
        """The engine's models, their states and the engine's effective options (asks until
        it answers or `timeout`)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while loop.time() < deadline:
            self._state = loop.create_future()
            self._send(p.Hello())
            with contextlib.suppress(TimeoutError):
                return await asyncio.wait_for(asyncio.shield(self._state), 1.0)
        raise EngineUnavailable(f"the engine at {self.address} did not answer in {timeout} s")

    def expected_wait(self, model: str, version: int) -> float | None:
        """The engine's last report of the model's queue wait, if recent (< WAIT_TTL_S)."""
        found = self._waits.get((model, version))
        if found is None or time.monotonic() - found[1] > WAIT_TTL_S:
            return None
        return found[0]

    def submit(self, model: str, version: int, rows: Sequence[list[int]], deadline: float,
               options: SearchOptions | None = None) -> list[asyncio.Future[Any]]:
        """Send one request's rows; one future per row (Timed, or Decoded with options)."""
        loop = asyncio.get_running_loop()
        rid = next(self._ids)
        futures: list[asyncio.Future[Any]] = [loop.create_future() for _ in rows]
        pending = _Pending(futures, options is not None, (model, version))
        self._pending[rid] = pending
        for f in futures:
            f.add_done_callback(functools.partial(self._on_done, rid))
        lengths, ids = p.pack_rows(list(rows))
        opts = None if options is None else dataclasses.asdict(options)
        self._send(p.Submit(rid, model, version, deadline, lengths, ids, opts))
        return futures

    def generate(self, model: str, version: int, prompts: Sequence[list[int]],
                 options: GenerateOptions, deadline: float) -> TokenStream:
        """Send one generation; its token events arrive on the returned stream."""
        rid = next(self._ids)

        def cancel() -> None:
            if self._streams.pop(rid, None) is not None:
                self._send(p.Cancel(rid))

        def stop(index: int) -> None:
            if rid in self._streams:
                self._send(p.StopSeq(rid, index))

        stream = TokenStream(len(prompts) * options.n, cancel, stop)
        self._streams[rid] = (stream, (model, version), [len(prompts) * options.n])
        lengths, ids = p.pack_rows(list(prompts))
        self._send(p.Generate(rid, model, version, deadline, lengths, ids,
                              dataclasses.asdict(options)))
        return stream

    def _deliver_tokens(self, msg: p.Tokens | p.Failure) -> None:
        stream, model, open_ = self._streams[msg.id]
        if msg.wait is not None:
            self._waits[model] = (msg.wait, time.monotonic())
        if isinstance(msg, p.Failure):
            del self._streams[msg.id]
            stream.put(_error(msg))
            return
        events = [TokenEvent(i, None if t < 0 else t, lp, tuple((a, b) for a, b in top), f)
                  for i, t, lp, top, f in msg.events]
        open_[0] -= sum(1 for e in events if e.finish is not None)
        if open_[0] <= 0:
            del self._streams[msg.id]
        stream.put(events)

    def _on_done(self, rid: int, future: asyncio.Future[Any]) -> None:
        pending = self._pending.get(rid)
        if pending is not None and future.cancelled() and not pending.done:
            pending.done = True
            del self._pending[rid]
            for f in pending.futures:
                f.cancel()
            self._send(p.Cancel(rid))

    def _send(self, msg: p.ToEngine) -> None:
        if self._channel is None:
            raise EngineUnavailable("the engine client is not started")
        self._channel.send([p.encoder.encode(msg)])

    def _on_frames(self, frames: list[bytes]) -> None:
        self._deliver(p.api_decoder.decode(frames[-1]))

    def _deliver(self, msg: p.ToApi) -> None:
        if isinstance(msg, p.State):
            if self._state is not None and not self._state.done():
                self._state.set_result(msg)
            return
        if msg.id in self._streams and isinstance(msg, p.Tokens | p.Failure):
            self._deliver_tokens(msg)
            return
        pending = self._pending.pop(msg.id, None)
        if pending is None or isinstance(msg, p.Tokens):
            return  # cancelled meanwhile
        if msg.wait is not None:
            self._waits[pending.model] = (msg.wait, time.monotonic())
        pending.done = True
        if isinstance(msg, p.Failure):
            _fail(pending, _error(msg))
        elif isinstance(msg, p.Rows):
            for f, arrays, (q, c, b, s) in zip(pending.futures, msg.results, msg.timings,
                                            strict=True):
                if not f.done():
                    f.set_result(Timed(tuple(p.from_array(a) for a in arrays), Timing(q, c, b, s)))
        else:
            for f, d in zip(pending.futures, msg.results, strict=True):
                if not f.done():
                    f.set_result(_decoded(d))


def _fail(pending: _Pending, exc: Exception) -> None:
    for f in pending.futures:
        if not f.done():
            f.set_exception(exc)


def _error(msg: p.Failure) -> errors.ServiceError:
    cls = getattr(errors, msg.kind, None)
    if not (isinstance(cls, type) and issubclass(cls, errors.ServiceError)):
        cls = errors.InferenceFailed
    return cls(msg.message, retry_after=msg.retry_after)


def _decoded(d: p.Decode) -> Decoded:
    hyps = []
    for h in d.hypotheses:
        attention = () if h.attention is None else tuple(p.from_array(h.attention))
        hyps.append(Hypothesis(tuple(h.token_ids), h.logprob, h.score, h.ended,
                               attention=attention))
    return Decoded(hyps, d.queue_s, d.decode_s, d.steps)


class _RemoteModel:
    """A model in the engine as this process sees it: its state and description."""

    def __init__(self, client: EngineClient, state: p.ModelState) -> None:
        self.client, self.state = client, state

    def describe(self) -> dict[str, Any]:
        return dict(self.state.describe)

    def expected_wait(self) -> float | None:
        """The engine's recent report of this model's queue wait (None: none recent)."""
        return self.client.expected_wait(self.state.name, self.state.version)

    async def start(self) -> None:
        """Nothing to start here: the engine warmed the model up."""

    async def stop(self, timeout: float) -> bool:
        """Nothing to drain here: the engine drains after every API process stopped."""
        return True


class RemoteRowModel(_RemoteModel):
    """A classifier or tagger in the engine (implements `scheduling.models.RowModel`)."""

    def submit(self, rows: Sequence[list[int]],
               deadline: float) -> list[asyncio.Future[Timed[Any]]]:
        return self.client.submit(self.state.name, self.state.version, rows, deadline)


class RemoteDecodeModel(_RemoteModel):
    """A translator in the engine (implements `scheduling.models.DecodeModel`)."""

    def submit(self, sources: Sequence[list[int]], options: SearchOptions,
               deadline: float) -> list[asyncio.Future[Decoded]]:
        return self.client.submit(self.state.name, self.state.version, sources, deadline,
                                  options)


class RemoteLMModel(_RemoteModel):
    """A language model in the engine (what `workers.lm.LMWorker` needs of its model)."""

    def generate(self, prompts: Sequence[list[int]], options: GenerateOptions,
                 deadline: float) -> TokenStream:
        return self.client.generate(self.state.name, self.state.version, prompts, options,
                                    deadline)

    def score(self, rows: Sequence[list[int]],
              deadline: float) -> list[asyncio.Future[Timed[Any]]]:
        return self.client.submit(self.state.name, self.state.version, rows, deadline)
