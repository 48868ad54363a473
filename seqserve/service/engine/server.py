"""The engine process's adapter: the engine interface behind one ZeroMQ ROUTER socket.

The models are a `LocalEngine` (engine/local.py: every bundle of the repository, or in the
hybrid layout those that keep sessions; a failed one is reported, the others serve);
`serve(address)` answers `Hello` with the models' states (each with its verified manifest and
limits: the API processes load nothing of these themselves) and the engine's effective
options, carries out the model control's `LoadModel` and `UnloadModel` (engine/control.py),
and hands each typed message (engine/protocol.py) to the interface call it names, through
one table (`handlers`), so rows from every API process share the same batches. A
request's reply goes out when all its rows are done; a `Cancel` cancels its futures, which
the schedulers drop before they cost compute. `drain(timeout)` refuses new work and finishes
what was admitted.

Under the supervisor the engine loads the model table the supervisor keeps
(`ENGINE_TABLE_ENV`: the versions that serve now, after every load and unload of the model
control), so an engine restarted after a crash serves what its predecessor served; without
that file, what the repository's policies serve (`engine_bundles`).

Every request gets an answer: an exception anywhere in its handling (not only a
`ServiceError`) fails that request alone (`BadRequest` when the engine cannot read it,
`InferenceFailed`, a 500, for our own faults). When an API process dies its work is dropped:
a monitor on the ROUTER reports each disconnection, and then the work of every identity whose
process (named in the identity, see `engine.protocol.identity_pid`) is gone is cancelled.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

import zmq
from zmq.utils.monitor import parse_monitor_message

from seqserve.service.core.errors import BadRequest, ServiceError
from seqserve.service.core.metrics import Metrics
from seqserve.service.core.process import observed
from seqserve.service.engine import protocol as p
from seqserve.service.engine.loading import RuntimeFactory, engine_bundles, keeps_sessions
from seqserve.service.engine.local import LocalEngine
from seqserve.service.engine.options import EngineOptions
from seqserve.service.engine.transport import Channel, close_monitored
from seqserve.service.scheduling.base import Timed
from seqserve.service.scheduling.decoding import Decoded
from seqserve.service.scheduling.generation import GenerateOptions, TokenEvent
from seqserve.service.scheduling.lm import LMModel
from seqserve.service.scheduling.search import SearchOptions

log = logging.getLogger("seqserve.engine")

ENGINE_TABLE_ENV = "SEQSERVE_ENGINE_TABLE"
"""The supervisor's model table (JSON: {"bundles": [[name, version, path], ...]}), which an
engine process loads at start (see the module doc)."""

Key = tuple[bytes, int]
"""(API socket identity, request id)."""


class EngineServer:
    """See the module doc."""

    def __init__(self, options: EngineOptions, metrics: Metrics,
                 runtime_factory: RuntimeFactory | None = None) -> None:
        self.options = options
        self.engine = LocalEngine(options, metrics, runtime_factory)
        self.inflight: dict[Key, asyncio.Future[Any]] = {}
        self.generations: dict[Key, tuple[LMModel, int]] = {}
        """Language-model generations in flight: their model and scheduler request id."""
        self._outbox: dict[bytes, list[p.ToApi]] = {}
        """The replies of this loop turn per API process, sent together (`_flush`)."""
        self._flush_scheduled = False
        self.channel: Channel | None = None
        self.monitor: Channel | None = None
        self.handlers: dict[type, Callable[[bytes, Any], None]] = {
            p.Hello: self._hello, p.SubmitRows: self._rows, p.SubmitScore: self._score,
            p.SubmitTranslate: self._translate, p.SubmitSeries: self._series,
            p.SubmitChunk: self._chunk, p.Generate: self._generate, p.StopSeq: self._stop_seq,
            p.Cancel: lambda identity, msg: self._cancel((identity, msg.id)),
            p.LoadModel: self._load_model, p.UnloadModel: self._unload_model,
            p.Ping: lambda identity, msg: self._send(identity, p.Pong(msg.seq))}
        """Each message type's handler: the one dispatch."""
        self._control: set[asyncio.Future[Any]] = set()
        """The model control's loads and unloads under way."""

    @property
    def closing(self) -> bool:
        return self.engine.closing

    async def load(self) -> None:
        """Load, warm up and start every bundle version it serves, one after another."""
        table = table_bundles(self.options)
        await self.engine.load(engine_bundles(self.options) if table is None else table)

    # -- serving ----------------------------------------------------------------------

    async def serve(self, address: str, stop: asyncio.Event) -> None:
        """Answer requests on `address` until `stop` is set."""
        sock: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.ROUTER)
        sock.setsockopt(zmq.LINGER, 0)
        monitor = sock.get_monitor_socket(zmq.EVENT_DISCONNECTED)
        sock.bind(address)
        self.channel = Channel(sock, self._on_frames)
        self.monitor = Channel(monitor, self._on_event)
        await stop.wait()
        self.engine.closing = True

    async def drain(self, timeout: float) -> bool:
        """Refuse new work, let admitted work finish within `timeout`; True when it did."""
        deadline = time.monotonic() + timeout
        drained = await self.engine.stop(timeout)
        while (self.inflight or self.generations) and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        self._flush()
        close_monitored(self.channel, self.monitor)
        return drained and not self.inflight and not self.generations

    def _on_frames(self, frames: list[bytes]) -> None:
        """One message of an API process: its identity, then one frame with the list of
        messages its loop turn sent (`protocol.engine_decoder`)."""
        identity, payload = frames
        for msg in p.engine_decoder.decode(payload):
            try:
                self.handle(identity, msg)
            except Exception:  # one message's fault must not drop the others
                log.exception("a message could not be handled")

    def _on_event(self, frames: list[bytes]) -> None:
        """A peer disconnected: drop the work of API processes that are gone (now, and again
        shortly: the socket closes while the process exits, a moment before it is gone)."""
        if parse_monitor_message(frames)["event"] == zmq.EVENT_DISCONNECTED:
            for delay in (0.0, 0.05, 0.25, 1.0):
                asyncio.get_running_loop().call_later(delay, self.drop_orphans)

    def drop_orphans(self) -> int:
        """Cancel the work of every identity whose API process is gone; how many requests."""
        gone = {identity for identity, _ in [*self.inflight, *self.generations]
                if not _alive(p.identity_pid(identity))}
        keys = [k for k in [*self.inflight, *self.generations] if k[0] in gone]
        for key in keys:
            self._cancel(key)
        if keys:
            log.warning("dropped %d requests of %d API processes that are gone", len(keys),
                        len(gone))
        return len(keys)

    def _cancel(self, key: Key) -> None:
        pending = self.inflight.pop(key, None)
        if pending is not None:
            pending.cancel()
        generation = self.generations.pop(key, None)
        if generation is not None:
            generation[0].cancel(generation[1])

    def handle(self, identity: bytes, msg: p.ToEngine) -> None:
        self.handlers[type(msg)](identity, msg)

    # -- the handlers -------------------------------------------------------------------

    def _hello(self, identity: bytes, msg: p.Hello) -> None:
        self._send(identity, p.State(self.engine.models(), self.options.to_dict(), observed()))

    def _load_model(self, identity: bytes, msg: p.LoadModel) -> None:
        """Load a version while serving (off the loop: `LocalEngine.load_version`)."""
        async def load() -> None:
            state = await self.engine.load_version(msg.name, msg.version, Path(msg.path))
            self._send(identity, p.Loaded(msg.id, state))
        self._later(load())

    def _unload_model(self, identity: bytes, msg: p.UnloadModel) -> None:
        async def unload() -> None:
            drained = await self.engine.unload(msg.name, msg.version,
                                               self.options.drain_timeout_s)
            self._send(identity, p.Unloaded(msg.id, drained))
        self._later(unload())

    def _later(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(work)
        self._control.add(task)
        task.add_done_callback(self._control.discard)

    def _rows(self, identity: bytes, msg: p.SubmitRows) -> None:
        self._submit(identity, msg, False, lambda: self.engine.rows(
            msg.model, msg.version, _readable(lambda: p.unpack_rows(msg.lengths, msg.ids)),
            msg.deadline))

    def _score(self, identity: bytes, msg: p.SubmitScore) -> None:
        self._submit(identity, msg, False, lambda: self.engine.score(
            msg.model, msg.version, _readable(lambda: p.unpack_rows(msg.lengths, msg.ids)),
            msg.deadline, msg.top, (msg.start_state, msg.start_token) if msg.start_state
            else None, msg.return_state))

    def _translate(self, identity: bytes, msg: p.SubmitTranslate) -> None:
        def call() -> list[asyncio.Future[Any]]:
            options, rows = _readable(lambda: (SearchOptions(**msg.options),
                                               p.unpack_rows(msg.lengths, msg.ids)))
            return list(self.engine.translate(msg.model, msg.version, rows, options,
                                              msg.deadline))
        self._submit(identity, msg, True, call)

    def _series(self, identity: bytes, msg: p.SubmitSeries) -> None:
        self._submit(identity, msg, False, lambda: self.engine.series(
            msg.model, msg.version, _series(msg), msg.deadline))

    def _chunk(self, identity: bytes, msg: p.SubmitChunk) -> None:
        def call() -> list[asyncio.Future[Any]]:
            series = _series(msg)
            if len(series) != 1:
                raise BadRequest(f"a session chunk is one series, not {len(series)}")
            return [self.engine.chunk(msg.model, msg.version, series[0], msg.session,
                                      msg.start, msg.end, msg.deadline, msg.owner)]
        self._submit(identity, msg, False, call)

    def _stop_seq(self, identity: bytes, msg: p.StopSeq) -> None:
        found = self.generations.get((identity, msg.id))
        if found is not None:
            found[0].stop_sequence(found[1], msg.index)

    def _submit(self, identity: bytes, msg: p.Call, decoding: bool,
                call: Callable[[], list[asyncio.Future[Any]]]) -> None:
        """Make the call's futures; its one reply goes out when all of them are done."""
        try:
            futures = call()
        except Exception as exc:  # refused, unreadable, or our bug: answered, never dropped
            self._send(identity, _failure(msg.id, exc, self._wait(msg)))
            return
        # one row (most requests): its own future, not a gather of one
        gathered = futures[0] if len(futures) == 1 else asyncio.gather(*futures)
        key = (identity, msg.id)
        self.inflight[key] = gathered
        single = len(futures) == 1
        gathered.add_done_callback(lambda g: self._done(key, g, decoding, msg, single))

    def _generate(self, identity: bytes, msg: p.Generate) -> None:
        """A language model's generation: every step's events go out as one Tokens frame."""
        key = (identity, msg.id)
        try:
            options, rows = _readable(lambda: (GenerateOptions(**msg.options),
                                               p.unpack_rows(msg.lengths, msg.ids)))
            open_ = [len(rows) * options.n]

            def sink(events: list[TokenEvent] | BaseException) -> None:
                if key not in self.generations:
                    return  # cancelled
                wait = self._wait(msg)
                if isinstance(events, BaseException):
                    self.generations.pop(key, None)
                    self._send(identity, _failure(msg.id, events, wait))
                    return
                try:
                    tokens = p.Tokens(msg.id, [
                        (e.index, -1 if e.token is None else e.token, e.logprob,
                         e.top, e.finish)  # type: ignore[misc]
                        for e in events], wait, [
                        (j, e.cached, e.queued, *(e.state or (None, 0, 0)))  # type: ignore[misc]
                        for j, e in enumerate(events)
                        if e.cached or e.queued or e.state is not None])
                except Exception as exc:  # our bug: this generation fails, the others go on
                    self._cancel(key)
                    self._send(identity, _failure(msg.id, exc, wait))
                    return
                open_[0] -= sum(1 for e in events if e.finish is not None)
                self._send(identity, tokens)
                if open_[0] <= 0:
                    self.generations.pop(key, None)

            # the sink runs on a later loop turn (the scheduler's updates), after this entry
            self.generations[key] = self.engine.stream(msg.model, msg.version, rows, options,
                                                       msg.deadline, sink)
        except Exception as exc:  # refused, unreadable, or our bug: answered, never dropped
            self.generations.pop(key, None)
            self._send(identity, _failure(msg.id, exc, self._wait(msg)))

    def _wait(self, msg: p.Call) -> float | None:
        """The model's expected queue wait for an answer (None when unknown or it fails)."""
        with contextlib.suppress(Exception):
            return self.engine.expected_wait(msg.model, msg.version)
        return None

    def _send(self, identity: bytes, msg: p.ToApi) -> None:
        """Queue `msg` for the API process `identity`: every reply of this loop turn goes out
        at its end, one message per API process (`_flush`). A batch's rows finish in one
        turn, so its requests' replies travel together (measured: a ZeroMQ send per reply was
        a fifth of the engine loop's time under load); the order of one process's replies is
        kept (a generation's failure follows its tokens)."""
        box = self._outbox.get(identity)
        if box is None:
            box = self._outbox[identity] = []
            if not self._flush_scheduled:
                self._flush_scheduled = True
                asyncio.get_running_loop().call_soon(self._flush)
        box.append(msg)

    def _flush(self) -> None:
        self._flush_scheduled = False
        outbox, self._outbox = self._outbox, {}
        if self.channel is None or self.channel.socket.closed:
            return
        for identity, items in outbox.items():
            self.channel.send([identity, p.encoder.encode(items)])

    def _done(self, key: Key, gathered: asyncio.Future[Any], decoding: bool, msg: p.Call,
              single: bool) -> None:
        if self.inflight.pop(key, None) is None or gathered.cancelled():
            if not gathered.cancelled():
                gathered.exception()  # retrieved: a cancelled gather holds CancelledError
            return  # cancelled by its API process: nobody waits for an answer
        identity, rid = key
        wait = self._wait(msg)
        exc = gathered.exception()
        answer: p.ToApi
        if exc is not None:
            answer = _failure(rid, exc, wait)
        else:
            try:
                done = [gathered.result()] if single else gathered.result()
                if decoding:
                    answer = p.Decodes(rid, [_decode(d) for d in done], wait)
                else:
                    answer = _rows(rid, done, wait)
            except Exception as bug:  # this request's answer, not the loop's callbacks
                answer = _failure(rid, bug, wait)
        self._send(identity, answer)


def table_bundles(options: EngineOptions) -> list[tuple[str, int, Path]] | None:
    """The engine's share of the supervisor's model table (`ENGINE_TABLE_ENV`): every version
    (`bundles = "all"`) or those that keep sessions; None without a readable table."""
    path = os.environ.get(ENGINE_TABLE_ENV)
    if not path:
        return None
    try:
        rows = json.loads(Path(path).read_text())["bundles"]
        bundles = [(str(n), int(v), Path(b)) for n, v, b in rows]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        log.warning("the model table %s cannot be read (%s): loading what the repository "
                    "serves", path, exc)
        return None
    return [b for b in bundles if options.bundles == "all" or keeps_sessions(b[2])]


def _series(msg: p.SubmitSeries) -> list[Any]:
    return _readable(lambda: p.unpack_states(
        p.unpack_series(msg.lengths, msg.features, msg.width), msg.states))


T = TypeVar("T")


def _readable(read: Callable[[], T]) -> T:
    """`read()`, the parsing of a request's own fields: what fails there is the request's
    fault (a 400), not the engine's."""
    try:
        return read()
    except (TypeError, ValueError, KeyError) as exc:
        raise BadRequest(f"the engine cannot read this request: {type(exc).__name__}: {exc}") \
            from exc


def _alive(pid: int | None) -> bool:
    """Whether the process `pid` runs (a zombie does not); None (no pid known): assumed so."""
    if pid is None:
        return True
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except FileNotFoundError:
        return False
    except OSError:
        return True


def _failure(rid: int, exc: BaseException, wait: float | None) -> p.Failure:
    if isinstance(exc, ServiceError):
        return p.Failure(rid, type(exc).__name__, exc.message, exc.retry_after, wait)
    log.error("request %d failed: %s: %s", rid, type(exc).__name__, exc, exc_info=exc)
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
