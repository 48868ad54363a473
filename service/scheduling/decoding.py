"""The translator decoding engine: step-level continuous batching in the server's event loop.

One task owns the loop (vLLM `EngineCore.step` style: schedule, execute, update):

1. admit waiting requests while the live-hypothesis budget allows (each request reserves
   `beam_size` rows); their encoders run as one batch, on a thread of their own, while the
   current decoder step runs, and they join the batch at the next step;
2. run ONE `decoder_step` for every live hypothesis of every request (one runtime call);
3. hand each request its rows (`RequestSearch.step`), gather the surviving state rows, and
   answer every request that finished, at once.

With `EngineConfig.groups` G > 1 the requests are split into G groups whose steps take turns
on the runtime thread: while one group's step computes, the loop updates another group's
beams, so the Python bookkeeping hides behind the runtime (G = 1 is the plain loop above).

New requests join at the next step. Each request's encoder memory is kept once, (S_i, D); the
padded concatenation (N, S_max, D) that `decoder_step` reads through `memory_index` is rebuilt
only when the set of requests changes. Runtime calls run in a one-thread executor, off the
loop. A cancelled request (client gone) frees its rows at the next step. A runtime fault is
retried request by request, so it fails only the requests that cause it.

`continuous=False` gives request-level batching (the benchmark's baseline): a batch is admitted
only when the previous one has completely finished.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from service.errors import InferenceFailed, QueueFull, ShuttingDown
from service.runtimes.base import Runtime
from service.scheduling.base import NullObserver, Observer, Timing, pad_rows
from service.scheduling.beam import DecodeLimits, Hypothesis, RequestSearch, SearchOptions

log = logging.getLogger("seqserve.engine")


@dataclass(frozen=True)
class EngineConfig:
    """Capacity and scheduling of one translator's engine."""

    max_live_hypotheses: int = 256
    """Rows reserved at once (sum of beam_size of admitted requests); keeps memory flat."""
    max_queue: int = 512
    """Requests waiting for admission; beyond it submissions get 429."""
    max_admit: int = 64
    """Requests encoded together in one admission batch."""
    continuous: bool = True
    """Step-level batching; False: request-level (a batch runs to completion first)."""
    groups: int = 1
    """1: one decoder_step call for every live row. G > 1: the requests are split into G
    groups that take turns, so the loop updates one group's beams while the runtime computes
    another's step (uses a second core; results are the same)."""
    pad_id: int = 0
    """Padding id of source batches."""
    retry_after_s: float = 1.0
    """Retry-After of QueueFull and ShuttingDown (the server passes its setting)."""

    def __post_init__(self) -> None:
        for name in ("max_live_hypotheses", "max_queue", "max_admit", "groups"):
            if getattr(self, name) < 1:
                raise ValueError(f"EngineConfig.{name} must be >= 1")


@dataclass
class StepStats:
    """Decoder-step timings by row count (the benchmark prints time per row from it)."""

    calls: dict[int, int] = field(default_factory=dict)
    seconds: dict[int, float] = field(default_factory=dict)
    steps: int = 0
    generated_tokens: int = 0

    def add(self, rows: int, seconds: float) -> None:
        self.calls[rows] = self.calls.get(rows, 0) + 1
        self.seconds[rows] = self.seconds.get(rows, 0.0) + seconds
        self.steps += 1


@dataclass(frozen=True)
class Decoded:
    """One source's answer: n-best hypotheses (best first) and where its time went."""

    hypotheses: list[Hypothesis]
    queue_s: float
    """Submission to admission (waiting for live-hypothesis room)."""
    decode_s: float
    """Admission to answer (encoder and every decoder step it took part in)."""
    steps: int
    """Decoder steps it took part in."""

    @property
    def timing(self) -> Timing:
        return Timing(self.queue_s, self.decode_s, self.steps)


@dataclass(eq=False)
class _Request:
    """One source sentence in the engine."""

    src_ids: list[int]
    search: RequestSearch
    future: asyncio.Future[Decoded]
    submitted: float
    admitted: float = 0.0
    memory: np.ndarray | None = None  # (S_i, D) own memory, kept once
    state: np.ndarray | None = None  # (rows, state_dim) of its live hypotheses
    slot: int = 0  # its row in the padded memory


_StepResult = tuple[dict[str, np.ndarray], float] | Exception
"""A decoder step's outputs and runtime seconds, or what it raised."""


@dataclass(eq=False)
class _Group:
    """Requests that share one decoder_step call; groups take turns (see `_round`)."""

    requests: list[_Request] = field(default_factory=list)
    memory: tuple[np.ndarray, np.ndarray] | None = None  # padded (N, S, D), (N, S), cached
    pending: asyncio.Future[tuple[list[_Request], _StepResult]] | None = None

    def rows(self) -> int:
        return sum(r.search.rows for r in self.requests)


def _timed_run(runtime: Runtime, graph: str,
               inputs: dict[str, np.ndarray]) -> tuple[dict[str, np.ndarray], float]:
    start = time.perf_counter()
    out = runtime.run(graph, inputs)
    return out, time.perf_counter() - start


class DecodingEngine:
    """See module doc. Start with `start()`, submit with `translate()`, stop with `stop()`."""

    def __init__(self, runtime: Runtime, limits: DecodeLimits, config: EngineConfig | None = None,
                 observer: Observer | None = None) -> None:
        self.runtime = runtime
        self.limits = limits
        self.config = config or EngineConfig()
        self.observer: Observer = observer or NullObserver()
        self.stats = StepStats()
        self._waiting: deque[_Request] = deque()
        self._groups = [_Group() for _ in range(self.config.groups)]
        self._joining: list[_Request] = []  # encoded, not yet in a group
        self._wake = asyncio.Event()
        self._closing = False
        self._task: asyncio.Task[None] | None = None
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="decode")
        self._encoder_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="encode")
        self._encoding: asyncio.Task[list[_Request]] | None = None  # admitted, being encoded
        self._encoding_requests: list[_Request] = []

    # -- lifecycle ------------------------------------------------------------------------

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._loop())

    async def stop(self) -> None:
        """Refuse new work, finish what was admitted or queued, then end the loop."""
        self._closing = True
        self._wake.set()
        if self._task is not None:
            await self._task
            self._task = None
        self._executor.shutdown(wait=True)
        self._encoder_pool.shutdown(wait=True)

    def abort(self, error: Exception) -> None:
        """Fail every queued and admitted request with `error` (shutdown past its grace)."""
        self._closing = True
        active = [r for g in self._groups for r in g.requests]
        for r in [*self._waiting, *active, *self._joining, *self._encoding_requests]:
            if not r.future.done():
                r.future.set_exception(error)
        self._wake.set()

    @property
    def live_rows(self) -> int:
        return sum(g.rows() for g in self._groups)

    @property
    def queued(self) -> int:
        """Sources waiting for admission (cancelled ones excluded)."""
        return sum(not r.future.done() for r in self._waiting)

    # -- submission -----------------------------------------------------------------------

    def submit(self, sources: Sequence[list[int]],
               options: SearchOptions) -> list[asyncio.Future[Decoded]]:
        """Queue each source (token ids, non-empty) for decoding; one future per source.

        All or none: raises QueueFull when the queue cannot take every source, ShuttingDown
        while draining. Options are trusted (the HTTP schema checked them). Cancelling a
        future frees that source's rows at the next step.
        """
        if self._closing:
            raise ShuttingDown("the translator is shutting down",
                               retry_after=self.config.retry_after_s)
        if self.queued + len(sources) > self.config.max_queue:
            raise QueueFull(f"translator queue full ({self.queued} of {self.config.max_queue} "
                            "waiting)", retry_after=self.config.retry_after_s)
        loop = asyncio.get_running_loop()
        requests = [
            _Request(list(src), RequestSearch(options, len(src), self.limits),
                     loop.create_future(), time.perf_counter())
            for src in sources
        ]
        for r in requests:
            r.future.add_done_callback(self._on_done)
        self._waiting.extend(requests)
        self._wake.set()
        self._report_depth()
        return [r.future for r in requests]

    async def translate(self, sources: Sequence[list[int]],
                        options: SearchOptions) -> list[Decoded]:
        """`submit` and wait for every source; cancelling the caller cancels every source."""
        futures = self.submit(sources, options)
        try:
            return list(await asyncio.gather(*futures))
        except BaseException:
            for f in futures:
                f.cancel()
            raise

    def _on_done(self, future: asyncio.Future[Decoded]) -> None:
        if future.cancelled():  # the loop frees its rows; gauges must not wait for that
            self._wake.set()

    # -- the loop -------------------------------------------------------------------------

    async def _loop(self) -> None:
        """Admitted requests are encoded on their own thread while decoder steps run (both off
        the event loop); they join a group at its next step."""
        while True:
            self._drop_cancelled()
            busy = any(g.requests or g.pending for g in self._groups)
            if not busy and self._joining:
                self._place_joining(self._groups[0])
                busy = True
            if not busy and not self._waiting and self._encoding is None:
                if self._closing:
                    return
                self._report_depth()  # idle: cancelled requests no longer count
                self._wake.clear()
                await self._wake.wait()
                continue
            try:
                if self._encoding is None:
                    admitted = self._admit()
                    if admitted:
                        self._encoding = asyncio.ensure_future(self._encode(admitted))
                        self._encoding_requests = admitted
                if busy:
                    await self._round()
                elif self._encoding is not None:
                    await asyncio.wait([self._encoding])  # nothing to overlap it with
                if self._encoding is not None and self._encoding.done():
                    self._joining += [r for r in self._encoding.result()
                                      if not r.future.done() and r.memory is not None]
                    self._encoding = None
                    if not busy:
                        self._place_joining(min(self._groups, key=_Group.rows))
            except Exception as exc:  # a bug here must not hang every waiting client
                log.exception("decoding engine iteration failed")
                self._fail_everything(exc)
            self._report_depth()

    async def _round(self) -> None:
        """One step of every group: collect a group's finished step, update its beams (while
        the runtime computes the next group's step), place joining requests, relaunch it."""
        for group in self._groups:
            if group.pending is not None:
                pending, group.pending = group.pending, None
                await self._collect(group, *(await pending))
            if not group.requests or group.rows() <= min(g.rows() for g in self._groups):
                self._place_joining(group)
            if group.requests:
                group.pending = self._launch(group)

    def _place_joining(self, group: _Group) -> None:
        if self._joining:
            group.requests += self._joining
            group.memory = None
            self._joining = []

    def _launch(self, group: _Group) -> asyncio.Future[tuple[list[_Request], _StepResult]]:
        """Start the group's decoder step on the runtime thread (queued behind any other)."""
        requests = list(group.requests)
        if group.memory is None:
            group.memory = _pad_memory(requests)
        inputs = _step_inputs(requests, *group.memory)
        loop = asyncio.get_running_loop()

        async def run() -> tuple[list[_Request], _StepResult]:
            try:
                return requests, await loop.run_in_executor(
                    self._executor, _timed_run, self.runtime, "decoder_step", inputs)
            except Exception as exc:
                return requests, exc

        return asyncio.ensure_future(run())

    async def _collect(self, group: _Group, requests: list[_Request],
                       result: _StepResult) -> None:
        """Hand each request its rows of a finished step; answer the finished ones."""
        if isinstance(result, Exception):
            await self._step_one_by_one(requests)
            group.memory = None  # the one-by-one steps moved the slots
        else:
            out, seconds = result
            rows = sum(r.search.rows for r in requests)
            self.stats.add(rows, seconds)
            self.observer.on_step(seconds, rows)
            offset = 0
            for r in requests:
                n = r.search.rows
                self._advance(r, out, offset, n)
                offset += n
        self._retire(group)

    def _admit(self) -> list[_Request]:
        cfg = self.config
        active = [r for g in self._groups for r in g.requests]
        if not cfg.continuous and (active or self._joining):
            return []
        reserved = sum(r.search.options.beam_size for r in [*active, *self._joining])
        admitted: list[_Request] = []
        while self._waiting and len(admitted) < cfg.max_admit:
            head = self._waiting[0]
            if head.future.done():
                self._waiting.popleft()
                continue
            if reserved + head.search.options.beam_size > cfg.max_live_hypotheses:
                break
            reserved += head.search.options.beam_size
            head.admitted = time.perf_counter()
            admitted.append(self._waiting.popleft())
        return admitted

    def _drop_cancelled(self) -> None:
        for group in self._groups:
            if group.pending is None:  # a running step's requests leave when it is collected
                self._retire(group)
        self._joining = [r for r in self._joining if not r.future.done()]
        while self._waiting and self._waiting[0].future.done():
            self._waiting.popleft()

    # -- encoder --------------------------------------------------------------------------

    async def _encode(self, requests: list[_Request]) -> list[_Request]:
        """Encode the admitted requests as one batch; on a fault, one by one."""
        start = time.perf_counter()
        try:
            await self._encode_batch(requests)
        except Exception:
            for r in requests:
                try:
                    await self._encode_batch([r])
                except Exception as exc:  # only this request fails
                    self._fail(r, exc)
                    r.memory = None
        self.observer.on_encode(time.perf_counter() - start, len(requests))
        return requests

    async def _encode_batch(self, requests: list[_Request]) -> None:
        src, lengths = pad_rows([r.src_ids for r in requests], self.config.pad_id)  # (n, S)
        loop = asyncio.get_running_loop()
        out = await loop.run_in_executor(self._encoder_pool, self.runtime.run, "encoder",
                                         {"src_ids": src, "src_lengths": lengths})
        for i, r in enumerate(requests):
            r.memory = out["memory"][i, : lengths[i]].copy()  # (S_i, D)
            r.state = out["state"][i : i + 1].copy()  # (1, state_dim)

    # -- decoder step ---------------------------------------------------------------------

    async def _step_one_by_one(self, requests: list[_Request]) -> None:
        """After a failed batched step: each request alone, so a fault stays with its owner."""
        loop = asyncio.get_running_loop()
        for r in requests:
            if r.future.done():
                continue
            inputs = _step_inputs([r], *_pad_memory([r]))
            try:
                out, _ = await loop.run_in_executor(
                    self._executor, _timed_run, self.runtime, "decoder_step", inputs)
            except Exception as exc:
                self._fail(r, exc)
                continue
            self._advance(r, out, 0, r.search.rows)

    def _advance(self, r: _Request, out: dict[str, np.ndarray], offset: int, n: int) -> None:
        if r.future.done():
            return
        sl = slice(offset, offset + n)
        try:
            parents = r.search.step(out["topk_logprobs"][sl], out["topk_ids"][sl],
                                    out["attention"][sl])
            r.state = out["new_state"][sl][parents]  # (rows_next, state_dim)
        except Exception as exc:
            self._fail(r, exc)

    def _retire(self, group: _Group) -> None:
        """Answer the group's finished requests now; drop cancelled ones; keep the rest."""
        kept = []
        for r in group.requests:
            if r.future.done():
                continue
            if r.search.done:
                now, results = time.perf_counter(), r.search.results()
                r.future.set_result(Decoded(results, r.admitted - r.submitted,
                                            now - r.admitted, r.search.steps))
                best = results[0] if results else None
                tokens = len(best.token_ids) - int(best.ended) if best else 0  # EOS not counted
                self.stats.generated_tokens += tokens
                self.observer.on_finish(tokens, now - r.admitted)
            else:
                kept.append(r)
        if len(kept) != len(group.requests):
            group.requests, group.memory = kept, None

    def _fail_everything(self, exc: Exception) -> None:
        if self._encoding is not None and self._encoding.done():
            self._joining += self._encoding_requests
            self._encoding = None
        for group in self._groups:
            for r in group.requests:
                self._fail(r, exc)
            if group.pending is not None:
                group.pending.cancel()
            group.requests, group.memory, group.pending = [], None, None
        for r in self._joining:
            self._fail(r, exc)
        self._joining = []

    def _fail(self, r: _Request, exc: Exception) -> None:
        if not r.future.done():
            r.future.set_exception(InferenceFailed(f"decoding failed: {exc}"))

    def _report_depth(self) -> None:
        self.observer.on_depth(self.queued, self.live_rows)

    async def __aenter__(self) -> DecodingEngine:
        self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        with contextlib.suppress(Exception):
            await self.stop()


def _pad_memory(requests: list[_Request]) -> tuple[np.ndarray, np.ndarray]:
    """Concatenate per-request memories into (N, S_max, D) zero-padded plus (N, S_max) mask."""
    lengths = [r.memory.shape[0] for r in requests]  # type: ignore[union-attr]
    dim = requests[0].memory.shape[1]  # type: ignore[union-attr]
    memory = np.zeros((len(requests), max(lengths), dim), dtype=np.float32)  # (N, S, D)
    mask = np.zeros((len(requests), max(lengths)), dtype=bool)  # (N, S)
    for i, r in enumerate(requests):
        memory[i, : lengths[i]] = r.memory
        mask[i, : lengths[i]] = True
        r.slot = i
    return memory, mask


def _step_inputs(requests: list[_Request], memory: np.ndarray,
                 mask: np.ndarray) -> dict[str, np.ndarray]:
    """The decoder_step feed for all live rows of `requests` (in order)."""
    prev = np.concatenate([r.search.prev_ids() for r in requests])  # (R,)
    state = np.concatenate([r.state for r in requests])  # type: ignore[misc]  # (R, state_dim)
    index = np.concatenate([np.full(r.search.rows, r.slot, np.int64) for r in requests])  # (R,)
    k = max(r.search.k_needed() for r in requests)
    return {"prev_ids": prev, "state": state.astype(np.float32, copy=False), "memory": memory,
            "src_mask": mask, "memory_index": index, "k": np.array([k], dtype=np.int64)}
