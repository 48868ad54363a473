"""The API-process side of the engine: one DEALER socket, requests matched to replies by id.

`EngineClient` is the engine interface (engine/interface.py) over ZeroMQ: `hello()` asks the
engine which models it serves (each with the verified manifest and limits the engine loaded
it with) and its effective options; each typed call (rows, series, chunk, translate, score,
generate) is one typed message (engine/protocol.py) and returns what the in-process
`LocalEngine` returns, so workers (through their `ModelHandle`) do not know where their model
runs. When a request's futures are cancelled (deadline, client
gone) the engine is told, and drops the work.

Faults are answered, never waited out: a socket monitor on the DEALER reports the engine's
disconnection (on ipc: the engine process is gone) at once, and then every request pending
here and every new one fails with `EngineUnavailable` (503 + Retry-After) while the engine is
`down`; a send that fails leaves nothing pending; an answer that cannot be read fails its
request alone. The DEALER's identity names this process's pid, so that the engine can drop
the work of a process that died.

A hung engine (its process stopped, its loop blocked) keeps its socket connected, so the
monitor says nothing: with `hang_timeout_s` the client sends a `Ping` every
`hang_timeout_s x HEARTBEAT_FRACTION` while connected, and once nothing at all came from the
engine for `hang_timeout_s` it is `down` as if it were gone (pending requests and new ones
503 + Retry-After, listeners told, `hung` says why); it is up again once the engine answers
`hello` (the supervisor's own client, the same code, has the hung engine killed and restarted:
supervisor.py).

The supervisor restarts a dead engine at the same address, and ZeroMQ connects the DEALER
to the new one by itself: once connected, the client asks it `hello` again (its models, as
it loaded them from the supervisor's model table) and is up again. Its `listeners` hear of
each change (the composition root marks the engine's models not ready meanwhile). `lost`,
what the server's readiness reads, says the engine is gone for good only once it has been
down longer than `RESTART_BOUND_S`. Sessions do not survive the restart: a chunk of one
the old engine held answers 404, and the message names the restart (`restarted_at`).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import itertools
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

import zmq
from zmq.utils.monitor import parse_monitor_message

import seqserve.service.core.errors as errors
from seqserve.service.engine import protocol as p
from seqserve.service.engine.transport import Channel, close_monitored
from seqserve.service.scheduling.base import Timed, Timing
from seqserve.service.scheduling.decoding import Decoded
from seqserve.service.scheduling.generation import GenerateOptions, TokenEvent, TokenStream
from seqserve.service.scheduling.search import Hypothesis, SearchOptions

log = logging.getLogger("seqserve.engine.client")


RESTART_BOUND_S = 30.0
"""An engine down (not connected, or not answering `hello`) for longer than this is `lost`:
the server's readiness turns false. Within it the server stays ready while the supervisor
restarts the engine (its models answer 503 + Retry-After meanwhile)."""

HEARTBEAT_FRACTION = 0.25
"""The heartbeat's interval as a share of `hang_timeout_s`: a hang is called after about four
unanswered pings, never after one late answer."""

WAIT_TTL_S = 0.5
"""How long an engine's report of a model's queue wait stays usable for early shedding."""


EngineUnavailable = errors.EngineUnavailable
"""The engine is gone or did not answer: 503 + Retry-After."""


@dataclasses.dataclass(eq=False)
class _Pending:
    futures: list[asyncio.Future[Any]]
    decoding: bool
    model: tuple[str, int]
    done: bool = False


class EngineClient:
    """One connection from this process to the engine at `address`: the engine interface
    (engine/interface.py) over ZeroMQ."""

    in_process = False

    def __init__(self, address: str, retry_after_s: float = 1.0,
                 restart_bound_s: float = RESTART_BOUND_S,
                 hang_timeout_s: float | None = None) -> None:
        self.address = address
        self.hang_timeout_s = hang_timeout_s
        """Silence of a connected engine after which it is hung (None: no heartbeat)."""
        self.hung: str | None = None
        """Why the engine is down as hung (no answer for `hang_timeout_s`), else None."""
        self._connected = False
        self._heard = 0.0
        """time.monotonic() of the engine's last frame (or of the connection)."""
        self._beat: asyncio.Task[None] | None = None
        self._pings = itertools.count(1)
        self.state: p.State | None = None
        """The engine's models and options, from its answer to `hello`."""
        self.retry_after_s = retry_after_s
        self.restart_bound_s = restart_bound_s
        self.down: str | None = None
        """Why the engine is unavailable now (its socket disconnected), else None."""
        self.down_since: float | None = None
        """time.monotonic() when it went down."""
        self.restarted_at: float | None = None
        """time.time() when a restarted engine last answered (None: never restarted)."""
        self.restarts = 0
        self.listeners: list[Callable[[], None]] = []
        """Called after the engine went down and after it is up again."""
        self.hang_listeners: list[Callable[[], None]] = []
        """Called once when the engine is found hung (after `listeners`)."""
        self.lost: str | None = None
        """Why the engine is gone for good: down for longer than `restart_bound_s` (None: up,
        or restarting within the bound)."""
        self._back: asyncio.Task[None] | None = None
        self._bound: asyncio.TimerHandle | None = None
        self._monitor: Channel | None = None
        self._ids = itertools.count(1)
        self._pending: dict[int, _Pending] = {}
        self._state: asyncio.Future[p.State] | None = None
        self._waits: dict[tuple[str, int], tuple[float, float]] = {}
        """(model, version) -> (expected queue wait, time.monotonic() when reported)."""
        self._channel: Channel | None = None
        self._streams: dict[int, tuple[TokenStream, tuple[str, int], list[int]]] = {}
        """Generations in flight: their stream, model and sequences not finished."""
        self._outbox: list[p.ToEngine] = []
        """Messages of this loop turn, sent together at its end (`_flush`)."""
        self._flush_scheduled = False
        self._control: dict[int, asyncio.Future[Any]] = {}
        """The model control's loads and unloads awaiting the engine's answer."""

    async def start(self) -> None:
        sock: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.IDENTITY, p.new_identity())
        monitor = sock.get_monitor_socket(zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED)
        sock.connect(self.address)
        self._channel = Channel(sock, self._on_frames)
        self._monitor = Channel(monitor, self._on_event)
        if self.hang_timeout_s is not None:
            self._beat = asyncio.get_running_loop().create_task(self._heartbeat())

    async def _heartbeat(self) -> None:
        """Ping the connected engine; call it hung once it was silent for `hang_timeout_s`
        (module doc)."""
        assert self.hang_timeout_s is not None
        while True:
            await asyncio.sleep(self.hang_timeout_s * HEARTBEAT_FRACTION)
            if not self._connected:
                continue
            silent = time.monotonic() - self._heard
            if silent > self.hang_timeout_s and self.down is None:
                self._hang(silent)
            self._send_quietly(p.Ping(next(self._pings)))

    def _hang(self, silent: float) -> None:
        self.hung = f"the engine process did not answer for {silent:.1f} s (hung: " \
                    f"--engine-hang-timeout-s {self.hang_timeout_s:g})"
        self._went_down(self.hung)
        log.error("%s: answering %d pending requests with 503", self.hung,
                  len(self._pending) + len(self._streams))
        self._fail_all(self._unavailable())
        self._tell()
        for listener in self.hang_listeners:
            listener()
        if self._back is None or self._back.done():  # up again once it answers
            self._back = asyncio.get_running_loop().create_task(self._reconnected())

    def _went_down(self, why: str) -> None:
        if self.down is None:
            self.down, self.down_since = why, time.monotonic()
            self._bound = asyncio.get_running_loop().call_later(self.restart_bound_s,
                                                                self._too_long)

    async def close(self) -> None:
        if self._beat is not None:
            self._beat.cancel()
        if self._back is not None:
            self._back.cancel()
        if self._bound is not None:
            self._bound.cancel()
        close_monitored(self._channel, self._monitor)
        self._fail_all(errors.ShuttingDown("this API process is stopping"))

    def _fail_all(self, exc: errors.ServiceError) -> None:
        """Every request pending here answered with `exc`."""
        pending, self._pending = self._pending, {}
        for entry in pending.values():
            entry.done = True
            _fail(entry, exc)
        streams, self._streams = self._streams, {}
        for stream, _, _ in streams.values():
            stream.put(exc)
        for future in self._control.values():
            if not future.done():
                future.set_exception(exc)

    def _on_event(self, frames: list[bytes]) -> None:
        event = parse_monitor_message(frames)["event"]
        if event == zmq.EVENT_CONNECTED:
            self._connected, self._heard = True, time.monotonic()
        if event == zmq.EVENT_DISCONNECTED:
            self._connected = False
            self._went_down("the engine process is gone")
            log.error("%s: answering %d pending requests with 503", self.down,
                      len(self._pending) + len(self._streams))
            self._fail_all(self._unavailable())
            self._tell()
        elif event == zmq.EVENT_CONNECTED and self.down is not None \
                and (self._back is None or self._back.done()):
            self._back = asyncio.get_running_loop().create_task(self._reconnected())

    def _too_long(self) -> None:
        self._bound = None
        if self.down is not None:
            self.lost = f"{self.down} (for longer than the {self.restart_bound_s:g} s an " \
                        "engine restart may take)"
            log.error("%s: the server is not ready", self.lost)

    async def _reconnected(self) -> None:
        """A (restarted) engine is connected: up again once it answered `hello`."""
        try:
            await self.hello(self.restart_bound_s)
        except EngineUnavailable as exc:
            log.error("the engine connected again but %s", exc)
            return
        self.down = self.down_since = self.lost = self.hung = None
        if self._bound is not None:
            self._bound.cancel()
            self._bound = None
        self.restarted_at = time.time()
        self.restarts += 1
        log.warning("the engine is back (restart %d): serving its %d model versions again",
                    self.restarts, len(self.models()))
        self._tell()

    def _tell(self) -> None:
        for listener in self.listeners:
            try:
                listener()
            except Exception:  # a listener's bug must not stop the others
                log.exception("an engine listener failed")

    def _unavailable(self) -> errors.ServiceError:
        return EngineUnavailable(f"engine unavailable: {self.down or 'not connected'}",
                                 retry_after=self.retry_after_s)

    async def hello(self, timeout: float) -> p.State:
        """The engine's models, their states and the engine's effective options (asks until
        it answers or `timeout`)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while loop.time() < deadline:
            self._state = loop.create_future()
            self._send(p.Hello())
            with contextlib.suppress(TimeoutError):
                self.state = await asyncio.wait_for(asyncio.shield(self._state), 1.0)
                return self.state
        raise EngineUnavailable(f"the engine at {self.address} did not answer in {timeout} s")

    def models(self) -> list[p.ModelState]:
        """The engine's model versions (as its answer to `hello` listed them)."""
        return [] if self.state is None else list(self.state.models)

    async def stop(self, timeout: float) -> bool:
        """Nothing to drain here: the engine drains after every API process stopped."""
        return True

    async def load_model(self, name: str, version: int, path: str, timeout: float
                         ) -> p.ModelState:
        """Have the engine load a version (the model control): its state once loaded."""
        return await self._control_call(lambda rid: p.LoadModel(rid, name, version, path),
                                        timeout)  # type: ignore[no-any-return]

    async def unload_model(self, name: str, version: int, timeout: float) -> bool:
        """Have the engine unload a version once it finished its work: whether it drained."""
        return await self._control_call(lambda rid: p.UnloadModel(rid, name, version),
                                        timeout)  # type: ignore[no-any-return]

    async def _control_call(self, message: Callable[[int], p.ToEngine], timeout: float) -> Any:
        if self.down is not None:
            raise self._unavailable()
        rid = next(self._ids)
        future = self._control[rid] = asyncio.get_running_loop().create_future()
        try:
            self._send(message(rid))
            return await asyncio.wait_for(future, timeout)
        finally:
            self._control.pop(rid, None)

    async def settle(self, model: str, version: int, timeout: float) -> bool:
        """Wait until no request of this process to the version is pending (a version the
        model control unloads: the engine drains it only after); True when none is left."""
        key = (model, version)
        deadline = time.monotonic() + timeout
        while any(p.model == key for p in self._pending.values()) \
                or any(m == key for _, m, _ in self._streams.values()):
            if time.monotonic() > deadline:
                return False
            await asyncio.sleep(0.02)
        return True

    def scheduled(self, model: str, version: int) -> None:
        """None: the models run in the engine process."""
        return None

    def expected_wait(self, model: str, version: int) -> float | None:
        """The engine's last report of the model's queue wait, if recent (< WAIT_TTL_S)."""
        found = self._waits.get((model, version))
        if found is None or time.monotonic() - found[1] > WAIT_TTL_S:
            return None
        return found[0]

    def rows(self, model: str, version: int, rows: Sequence[list[int]],
             deadline: float) -> list[asyncio.Future[Any]]:
        """Token rows for a classifier or tagger; one future per row (Timed)."""
        lengths, ids = p.pack_rows(rows if isinstance(rows, list) else list(rows))
        return self._call(lambda rid: p.SubmitRows(rid, model, version, deadline, lengths, ids),
                          len(rows), False, (model, version))

    def score(self, model: str, version: int, rows: Sequence[list[int]],
              deadline: float, top: int = 0, start: tuple[bytes, int] | None = None,
              return_state: bool = False) -> list[asyncio.Future[Any]]:
        """Texts (bos first) a language model scores (with `top`, the best tokens at every
        position too; `start`, `return_state`: `LMLoop.score`); one future per text."""
        lengths, ids = p.pack_rows(rows if isinstance(rows, list) else list(rows))
        state, token = start if start is not None else (b"", -1)
        return self._call(lambda rid: p.SubmitScore(rid, model, version, deadline, lengths,
                                                    ids, top, state, token, return_state),
                          len(rows), False, (model, version))

    def translate(self, model: str, version: int, sources: Sequence[list[int]],
                  options: SearchOptions, deadline: float) -> list[asyncio.Future[Any]]:
        """Sources to translate; one future per source (Decoded)."""
        lengths, ids = p.pack_rows(sources if isinstance(sources, list) else list(sources))
        opts = dataclasses.asdict(options)
        return self._call(lambda rid: p.SubmitTranslate(rid, model, version, deadline, lengths,
                                                        ids, opts),
                          len(sources), True, (model, version))

    def series(self, model: str, version: int, series: Sequence[Any],
               deadline: float) -> list[asyncio.Future[Any]]:
        """Float series (each (T_i, D) float32, or a `SessionRow`: from its state); one
        future per series (Timed)."""
        steps, states = p.pack_states(list(series))
        lengths, features, width = p.pack_series(steps)
        return self._call(lambda rid: p.SubmitSeries(rid, model, version, deadline, lengths,
                                                     features, width, states),
                          len(series), False, (model, version))

    def chunk(self, model: str, version: int, series: Any, session: str, start: bool,
              end: bool, deadline: float, owner: str = "") -> asyncio.Future[Any]:
        """One series that is a chunk of `session`, whose state the engine keeps."""
        lengths, features, width = p.pack_series([series])
        (future,) = self._call(lambda rid: p.SubmitChunk(rid, model, version, deadline,
                                                         lengths, features, width,
                                                         session=session, start=start,
                                                         end=end, owner=owner),
                               1, False, (model, version))
        return future

    def _call(self, message: Callable[[int], p.ToEngine], n: int, decoding: bool,
              model: tuple[str, int]) -> list[asyncio.Future[Any]]:
        """Send one request (`message(request id)`); its n futures, answered by one reply."""
        if self.down is not None:
            raise self._unavailable()
        loop = asyncio.get_running_loop()
        rid = next(self._ids)
        self._send(message(rid))
        futures: list[asyncio.Future[Any]] = [loop.create_future() for _ in range(n)]
        self._pending[rid] = _Pending(futures, decoding, model)
        on_done = functools.partial(self._on_done, rid)
        for f in futures:
            f.add_done_callback(on_done)
        return futures

    def generate(self, model: str, version: int, prompts: Sequence[list[int]],
                 options: GenerateOptions, deadline: float) -> TokenStream:
        """Send one generation; its token events arrive on the returned stream."""
        if self.down is not None:
            raise self._unavailable()
        rid = next(self._ids)

        def cancel() -> None:
            if self._streams.pop(rid, None) is not None:
                self._send_quietly(p.Cancel(rid))

        def stop(index: int) -> None:
            if rid in self._streams:
                self._send_quietly(p.StopSeq(rid, index))

        stream = TokenStream(len(prompts) * options.n, cancel, stop)
        lengths, ids = p.pack_rows(list(prompts))
        self._send(p.Generate(rid, model, version, deadline, lengths, ids,
                              dataclasses.asdict(options)))
        self._streams[rid] = (stream, (model, version), [len(prompts) * options.n])
        return stream

    def _deliver_tokens(self, msg: p.Tokens | p.Failure) -> None:
        stream, model, open_ = self._streams[msg.id]
        if msg.wait is not None:
            self._waits[model] = (msg.wait, time.monotonic())
        if isinstance(msg, p.Failure):
            del self._streams[msg.id]
            stream.put(_error(msg))
            return
        events = [TokenEvent(i, None if t < 0 else t, lp,
                             tuple(map(tuple, top)) if top else (), f)  # type: ignore[arg-type]
                  for i, t, lp, top, f in msg.events]
        for j, cached, queued, state, key, drawn in msg.extras:
            events[j].cached = cached
            events[j].queued = queued
            if state is not None:
                events[j].state = (state, key, drawn)
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
            self._send_quietly(p.Cancel(rid))

    def _restart_noted(self, exc: errors.ServiceError) -> errors.ServiceError:
        """A session the engine does not hold, after the engine restarted: the message says
        that sessions held by the old engine were lost with it."""
        if not isinstance(exc, errors.SessionNotFound) or self.restarted_at is None:
            return exc
        at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.restarted_at))
        return errors.SessionNotFound(
            f"{exc}; the engine process restarted at {at} ({time.time() - self.restarted_at:.0f}"
            " s ago) and the sessions it held were lost with it: start the session again "
            "(start: true) with its history", retry_after=exc.retry_after)

    def _send(self, msg: p.ToEngine) -> None:
        """Queue `msg`: what this loop turn sends goes out at its end as one frame
        (`_flush`; measured: a ZeroMQ send per request was 8% of the API
        process under load). Raises EngineUnavailable when there is no engine to send to."""
        if self._channel is None:
            raise EngineUnavailable("engine unavailable: the engine client is not started",
                                    retry_after=self.retry_after_s)
        self._outbox.append(msg)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        """Send the queued messages; if the send fails, their requests fail with
        EngineUnavailable (503 + Retry-After) and nothing of them is left pending."""
        self._flush_scheduled = False
        messages, self._outbox = self._outbox, []
        if not messages or self._channel is None or self._channel.socket.closed:
            return
        try:
            self._channel.send([p.encoder.encode(messages)])
        except zmq.ZMQError as exc:
            log.error("%d messages to the engine could not be sent: %s", len(messages), exc)
            failure = EngineUnavailable(f"engine unavailable: the request could not be sent "
                                        f"({exc})", retry_after=self.retry_after_s)
            for msg in messages:
                if not isinstance(msg, p.Call):
                    continue
                entry = self._pending.pop(msg.id, None)
                if entry is not None:
                    entry.done = True
                    _fail(entry, failure)
                found = self._streams.pop(msg.id, None)
                if found is not None:
                    found[0].put(failure)

    def _send_quietly(self, msg: p.ToEngine) -> None:
        """A cancellation: best effort (a gone engine holds nothing to cancel)."""
        with contextlib.suppress(EngineUnavailable):
            self._send(msg)

    def _on_frames(self, frames: list[bytes]) -> None:
        """One message of the engine: the list of replies one engine loop turn had for this
        process (`protocol.api_decoder`)."""
        self._heard = time.monotonic()
        for msg in p.api_decoder.decode(frames[-1]):
            self._on_message(msg)

    def _on_message(self, msg: p.ToApi) -> None:
        try:
            self._deliver(msg)
        except Exception as exc:  # a bug here fails its own request, never leaves it waiting
            log.exception("the engine's answer to request %s could not be read",
                          getattr(msg, "id", None))
            rid = getattr(msg, "id", None)
            failure = errors.InferenceFailed(f"the engine's answer could not be read: "
                                             f"{type(exc).__name__}: {exc}")
            entry = self._pending.pop(rid, None) if rid is not None else None
            if entry is not None:
                entry.done = True
                _fail(entry, failure)
            found = self._streams.pop(rid, None) if rid is not None else None
            if found is not None:
                found[0].put(failure)

    def _deliver(self, msg: p.ToApi) -> None:
        if isinstance(msg, p.Pong):
            return  # heard (`_on_frames`): that is all a Pong says
        if isinstance(msg, p.State):
            if self._state is not None and not self._state.done():
                self._state.set_result(msg)
            return
        if isinstance(msg, p.Loaded | p.Unloaded):
            found = self._control.get(msg.id)
            if found is not None and not found.done():
                found.set_result(msg.state if isinstance(msg, p.Loaded) else msg.drained)
            return
        if msg.id in self._streams and isinstance(msg, p.Tokens | p.Failure):
            self._deliver_tokens(msg)
            return
        pending = self._pending.get(msg.id)
        if pending is None or isinstance(msg, p.Tokens):
            return  # cancelled meanwhile
        if msg.wait is not None:
            self._waits[pending.model] = (msg.wait, time.monotonic())
        if isinstance(msg, p.Failure):
            del self._pending[msg.id]
            pending.done = True
            _fail(pending, self._restart_noted(_error(msg)))
            return
        values: list[Any]  # read whole before the request leaves `_pending` (see _on_frames)
        if isinstance(msg, p.Rows):
            values = [Timed(tuple(p.from_array(a) for a in arrays), Timing(q, c, b, s))
                      for arrays, (q, c, b, s) in zip(msg.results, msg.timings, strict=True)]
        else:
            values = [_decoded(d) for d in msg.results]
        if len(values) != len(pending.futures):
            raise ValueError(f"{len(values)} results for {len(pending.futures)} rows")
        del self._pending[msg.id]
        pending.done = True
        for f, value in zip(pending.futures, values, strict=True):
            if not f.done():
                f.set_result(value)


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
