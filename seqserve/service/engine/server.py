"""The engine process: every model of one device behind one ZeroMQ ROUTER socket.

`EngineServer.load()` loads and verifies every bundle of the repository once (a failed one is
reported, the others serve); `serve(address)` answers `Hello` with the models' states (each
with its verified manifest and limits: the API processes load nothing themselves) and the
engine's effective options, and turns each
`Submit` into one `submit` on the model's batcher or decode scheduler, so rows from every API
process share the same batches. A request's reply goes out when all its rows are done; a
`Cancel` cancels its futures, which the schedulers drop before they cost compute.
`drain(timeout)` refuses new work and finishes what was admitted.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from pathlib import Path
from typing import Any

import zmq

from seqserve.export.manifest import list_bundles
from seqserve.service.core.errors import ModelNotReady, ServiceError, ShuttingDown
from seqserve.service.core.metrics import Metrics
from seqserve.service.core.process import observed
from seqserve.service.engine import protocol as p
from seqserve.service.engine.loading import RuntimeFactory, build_served
from seqserve.service.engine.options import EngineOptions
from seqserve.service.engine.transport import Channel
from seqserve.service.scheduling.base import Timed
from seqserve.service.scheduling.decoding import Decoded
from seqserve.service.scheduling.lm import GenerateOptions, LMModel, TokenEvent
from seqserve.service.scheduling.models import DecodedModel, ServedModel
from seqserve.service.scheduling.search import SearchOptions

log = logging.getLogger("seqserve.engine")

Key = tuple[bytes, int]
"""(API socket identity, request id)."""


class EngineServer:
    """See the module doc."""

    def __init__(self, options: EngineOptions, metrics: Metrics,
                 runtime_factory: RuntimeFactory | None = None) -> None:
        self.options = options
        self.metrics = metrics
        self.runtime_factory = runtime_factory
        self.models: dict[tuple[str, int], ServedModel] = {}
        self.states: list[p.ModelState] = []
        self.inflight: dict[Key, asyncio.Future[Any]] = {}
        self.generations: dict[Key, tuple[LMModel, int]] = {}
        """Language-model generations in flight: their model and scheduler request id."""
        self.closing = False
        self.channel: Channel | None = None

    # -- loading ----------------------------------------------------------------------

    async def load(self) -> None:
        """Load, warm up and start every bundle version, one after another."""
        found = list_bundles(Path(self.options.repo))
        for name, version, _ in found:  # every series exists from the start, at 0
            self.metrics.model_ready.labels(name, str(version)).set(0)
            self.metrics.load_failures.labels(name, str(version))
        for name, version, path in found:
            await self._load_one(name, version, path)

    async def _load_one(self, name: str, version: int, path: Path) -> None:
        try:
            manifest, model = await asyncio.to_thread(
                build_served, name, path, self.options, self.metrics.observer(name),
                self.runtime_factory)
            await model.start()
        except Exception as exc:  # this version only
            reason = f"{type(exc).__name__}: {exc}"
            log.error("model %s version %d not served: %s", name, version, reason)
            self.metrics.load_failures.labels(name, str(version)).inc()
            self.states.append(p.ModelState(name, version, str(path), "failed", reason,
                                            None, {}))
            return
        self.models[name, version] = model
        self.metrics.model_ready.labels(name, str(version)).set(1)
        self.states.append(p.ModelState(
            name, version, str(path), "ready", None, manifest.task, model.describe(),
            manifest=manifest.to_dict(), max_tokens=model.config.max_tokens,
            scheduling=dataclasses.asdict(model.config)))
        log.info("model %s version %d ready (%s)", name, version, manifest.task)

    # -- serving ----------------------------------------------------------------------

    async def serve(self, address: str, stop: asyncio.Event) -> None:
        """Answer requests on `address` until `stop` is set."""
        sock: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.ROUTER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.bind(address)
        self.channel = Channel(sock, self._on_frames)
        await stop.wait()
        self.closing = True

    async def drain(self, timeout: float) -> bool:
        """Refuse new work, let admitted work finish within `timeout`; True when it did."""
        self.closing = True
        deadline = time.monotonic() + timeout
        results = await asyncio.gather(*(m.stop(timeout) for m in self.models.values()))
        while (self.inflight or self.generations) and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        if self.channel is not None:
            self.channel.close()
        return all(results) and not self.inflight and not self.generations

    def _on_frames(self, frames: list[bytes]) -> None:
        identity, payload = frames
        self.handle(identity, payload)

    def handle(self, identity: bytes, payload: bytes) -> None:
        msg = p.engine_decoder.decode(payload)
        if isinstance(msg, p.Submit):
            self._submit(identity, msg)
        elif isinstance(msg, p.Generate):
            self._generate(identity, msg)
        elif isinstance(msg, p.StopSeq):
            found = self.generations.get((identity, msg.id))
            if found is not None:
                found[0].loop.stop_sequence(found[1], msg.index)
        elif isinstance(msg, p.Cancel):
            pending = self.inflight.pop((identity, msg.id), None)
            if pending is not None:
                pending.cancel()
            generation = self.generations.pop((identity, msg.id), None)
            if generation is not None:
                generation[0].loop.cancel(generation[1])
        else:
            self._send(identity, p.State(self.states, self.options.to_dict(), observed()))

    def _submit(self, identity: bytes, msg: p.Submit) -> None:
        model = self.models.get((msg.model, msg.version))
        try:
            futures = self._futures(msg, model)
        except ServiceError as exc:
            self._send(identity, _failure(msg.id, exc, model.expected_wait() if model else None))
            return
        assert model is not None  # _futures refuses a missing one
        gathered = asyncio.gather(*futures)
        key = (identity, msg.id)
        self.inflight[key] = gathered
        gathered.add_done_callback(lambda g: self._done(key, g, msg.options is not None, model))

    def _generate(self, identity: bytes, msg: p.Generate) -> None:
        """A language model's generation: every step's events go out as one Tokens frame."""
        model = self.models.get((msg.model, msg.version))
        key = (identity, msg.id)
        try:
            if self.closing:
                raise ShuttingDown("the engine is shutting down",
                                   retry_after=self.options.retry_after_s)
            if not isinstance(model, LMModel):
                raise ModelNotReady(f"model {msg.model!r} version {msg.version} is not a "
                                    "loaded language model")
            options = GenerateOptions(**msg.options)
            rows = p.unpack_rows(msg.lengths, msg.ids)
            open_ = [len(rows) * options.n]
            lm = model

            def sink(events: list[TokenEvent] | BaseException) -> None:
                if key not in self.generations:
                    return  # cancelled
                if isinstance(events, BaseException):
                    self.generations.pop(key, None)
                    self._send(identity, _failure(msg.id, events, lm.expected_wait()))
                    return
                open_[0] -= sum(1 for e in events if e.finish is not None)
                self._send(identity, p.Tokens(msg.id, [
                    (e.index, -1 if e.token is None else e.token, e.logprob,
                     [tuple(t) for t in e.top], e.finish) for e in events],  # type: ignore[misc]
                    lm.expected_wait()))
                if open_[0] <= 0:
                    self.generations.pop(key, None)

            self.generations[key] = (model, -1)
            rid = model.loop.submit(rows, options, msg.deadline, sink)
            self.generations[key] = (model, rid)
        except ServiceError as exc:
            self.generations.pop(key, None)
            self._send(identity, _failure(msg.id, exc,
                                          model.expected_wait() if model else None))

    def _futures(self, msg: p.Submit, model: ServedModel | None) -> list[asyncio.Future[Any]]:
        if self.closing:
            raise ShuttingDown("the engine is shutting down",
                               retry_after=self.options.retry_after_s)
        if model is None:
            raise ModelNotReady(f"model {msg.model!r} version {msg.version} is not loaded")
        rows = p.unpack_rows(msg.lengths, msg.ids)
        if isinstance(model, LMModel):  # a Submit to a language model scores texts
            return list(model.score(rows, msg.deadline))
        if isinstance(model, DecodedModel):
            options = SearchOptions(**(msg.options or {}))
            return list(model.submit(rows, options, msg.deadline))
        return list(model.submit(rows, msg.deadline))

    def _done(self, key: Key, gathered: asyncio.Future[Any], decoding: bool,
              model: ServedModel) -> None:
        if self.inflight.pop(key, None) is None or gathered.cancelled():
            return  # cancelled by its API process: nobody waits for an answer
        identity, rid = key
        wait = model.expected_wait()
        exc = gathered.exception()
        if exc is not None:
            self._send(identity, _failure(rid, exc, wait))
        elif decoding:
            self._send(identity, p.Decodes(rid, [_decode(d) for d in gathered.result()], wait))
        else:
            self._send(identity, _rows(rid, gathered.result(), wait))

    def _send(self, identity: bytes, msg: p.ToApi) -> None:
        if self.channel is not None and not self.channel.socket.closed:
            self.channel.send([identity, p.encoder.encode(msg)])


def _failure(rid: int, exc: BaseException, wait: float | None) -> p.Failure:
    if isinstance(exc, ServiceError):
        return p.Failure(rid, type(exc).__name__, exc.message, exc.retry_after, wait)
    log.error("request %d failed: %s: %s", rid, type(exc).__name__, exc)
    return p.Failure(rid, "InferenceFailed", f"inference failed: {exc}", None, wait)


def _rows(rid: int, done: list[Timed[Any]], wait: float | None) -> p.Rows:
    results = [[p.to_array(a) for a in t.value] for t in done]
    timings = [(t.timing.queue_s, t.timing.compute_s, t.timing.batch_rows,
                t.timing.decoder_steps) for t in done]
    return p.Rows(rid, results, timings, wait)


def _decode(d: Decoded) -> p.Decode:
    hyps = []
    for h in d.hypotheses:
        matrix = h.attention_matrix()
        hyps.append(p.Hyp(list(h.token_ids), float(h.logprob), float(h.score), h.ended,
                          None if matrix is None else p.to_array(matrix)))
    return p.Decode(hyps, d.queue_s, d.decode_s, d.steps)
