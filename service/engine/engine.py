"""The translator decoding engine: step-level continuous batching in the server's event loop.

One task owns the loop (vLLM `EngineCore.step` style: schedule, execute, update):

1. admit waiting requests while the live-hypothesis budget allows (each request reserves
   `beam_size` rows); their encoders run as one batch, on a thread of their own, while the
   current decoder step runs, and they join the batch at the next step;
2. run ONE `decoder_step` for every live hypothesis of every request (one runtime call);
3. hand each request its rows (`RequestSearch.step`), gather the surviving state rows, and
   answer every request that finished, at once.

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
from typing import Protocol

import numpy as np

from models.errors import UserError
from service.engine.search import DecodeLimits, Hypothesis, RequestSearch, SearchOptions
from service.errors import BadRequest, InferenceFailed, QueueFull, ShuttingDown

log = logging.getLogger("seqserve.engine")


class Runtime(Protocol):
    """The slice of the runtime interface the engine uses (docs/contracts.md)."""

    def run(self, graph: str, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]: ...


class EngineObserver(Protocol):
    """Where the engine reports what it did (Prometheus in the server, nothing in tests)."""

    def on_encode(self, seconds: float, batch: int) -> None: ...

    def on_step(self, seconds: float, rows: int) -> None: ...

    def on_finish(self, tokens: int, seconds: float) -> None: ...

    def on_depth(self, waiting: int, live_rows: int) -> None: ...


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
    pad_id: int = 0
    """Padding id of source batches."""

    def __post_init__(self) -> None:
        for name in ("max_live_hypotheses", "max_queue", "max_admit"):
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


class DecodingEngine:
    """See module doc. Start with `start()`, submit with `translate()`, stop with `stop()`."""

    def __init__(self, runtime: Runtime, limits: DecodeLimits, config: EngineConfig | None = None,
                 observer: EngineObserver | None = None) -> None:
        self.runtime = runtime
        self.limits = limits
        self.config = config or EngineConfig()
        self.observer = observer
        self.stats = StepStats()
        self._waiting: deque[_Request] = deque()
        self._active: list[_Request] = []
        self._memory: tuple[np.ndarray, np.ndarray] | None = None  # (N, S, D), (N, S)
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

    @property
    def live_rows(self) -> int:
        return sum(r.search.rows for r in self._active)

    @property
    def queued(self) -> int:
        return len(self._waiting)

    # -- submission -----------------------------------------------------------------------

    async def translate(self, sources: Sequence[list[int]],
                        options: SearchOptions) -> list[Decoded]:
        """Decode each source (token ids); per source its n-best hypotheses, best first.

        Raises QueueFull when the queue cannot take all of them, ShuttingDown while draining,
        BadRequest when the beam can never fit the live-hypothesis budget. Cancelling the
        caller cancels every source, which frees their rows at the next step.
        """
        if self._closing:
            raise ShuttingDown("the translator is shutting down", retry_after=1.0)
        try:
            options.check()
        except UserError as exc:
            raise BadRequest(str(exc)) from exc
        if options.beam_size > self.config.max_live_hypotheses:
            raise BadRequest(f"beam_size {options.beam_size} exceeds the live-hypothesis cap "
                             f"{self.config.max_live_hypotheses}")
        if any(not src for src in sources):
            raise BadRequest("every text must have at least one token")
        if len(sources) > self.config.max_queue:
            raise BadRequest(f"{len(sources)} texts exceed the translator queue "
                             f"({self.config.max_queue}); send fewer per request")
        if len(self._waiting) + len(sources) > self.config.max_queue:
            raise QueueFull(f"translator queue full ({self.config.max_queue} waiting)",
                            retry_after=1.0)
        loop = asyncio.get_running_loop()
        requests = [
            _Request(list(src), RequestSearch(options, len(src), self.limits),
                     loop.create_future(), time.perf_counter())
            for src in sources
        ]
        self._waiting.extend(requests)
        self._wake.set()
        try:
            return list(await asyncio.gather(*(r.future for r in requests)))
        except BaseException:
            for r in requests:
                r.future.cancel()  # frees its rows at the next step
            self._wake.set()
            raise

    # -- the loop -------------------------------------------------------------------------

    async def _loop(self) -> None:
        """Admitted requests are encoded on their own thread while the decoder step of the
        active ones runs (both off the event loop); they join at the next step."""
        while True:
            self._drop_cancelled()
            if not self._active and not self._waiting and self._encoding is None:
                if self._closing:
                    return
                self._wake.clear()
                await self._wake.wait()
                continue
            try:
                if self._encoding is None:
                    admitted = self._admit()
                    if admitted:
                        self._encoding = asyncio.ensure_future(self._encode(admitted))
                        self._encoding_requests = admitted
                if self._active:
                    await self._step()
                elif self._encoding is not None:
                    await asyncio.wait([self._encoding])  # nothing to overlap it with
                if self._encoding is not None and self._encoding.done():
                    self._join(self._encoding.result())
                    self._encoding = None
            except Exception as exc:  # a bug here must not hang every waiting client
                log.exception("decoding engine iteration failed")
                if self._encoding is not None and self._encoding.done():
                    self._active += self._encoding_requests
                    self._encoding = None
                for r in self._active:
                    self._fail(r, exc)
                self._active, self._memory = [], None
            self._report_depth()

    def _join(self, encoded: list[_Request]) -> None:
        """Encoded requests enter the decoder batch (at a step boundary)."""
        joined = [r for r in encoded if not r.future.done() and r.memory is not None]
        if joined:
            self._active.extend(joined)
            self._memory = None

    def _admit(self) -> list[_Request]:
        cfg = self.config
        if not cfg.continuous and self._active:
            return []
        reserved = sum(r.search.options.beam_size for r in self._active)
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
        kept = [r for r in self._active if not r.future.done()]
        if len(kept) != len(self._active):
            self._active = kept
            self._memory = None
        while self._waiting and self._waiting[0].future.done():
            self._waiting.popleft()

    async def _call(self, graph: str, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        loop = asyncio.get_running_loop()
        pool = self._encoder_pool if graph == "encoder" else self._executor
        return await loop.run_in_executor(pool, self.runtime.run, graph, inputs)

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
        if self.observer is not None:
            self.observer.on_encode(time.perf_counter() - start, len(requests))
        return requests

    async def _encode_batch(self, requests: list[_Request]) -> None:
        lengths = np.array([len(r.src_ids) for r in requests], dtype=np.int64)  # (n,)
        src = np.full((len(requests), int(lengths.max())), self.config.pad_id, np.int64)
        for i, r in enumerate(requests):
            src[i, : lengths[i]] = r.src_ids  # (n, S) right-padded
        out = await self._call("encoder", {"src_ids": src, "src_lengths": lengths})
        for i, r in enumerate(requests):
            r.memory = out["memory"][i, : lengths[i]].copy()  # (S_i, D)
            r.state = out["state"][i : i + 1].copy()  # (1, state_dim)

    # -- decoder step ---------------------------------------------------------------------

    def _padded_memory(self) -> tuple[np.ndarray, np.ndarray]:
        """(N, S_max, D) memory and (N, S_max) mask of the active requests (cached)."""
        if self._memory is None:
            self._memory = _pad_memory(self._active)
        return self._memory

    async def _step(self) -> None:
        requests = self._active
        memory, mask = self._padded_memory()
        start = time.perf_counter()
        try:
            out = await self._call("decoder_step", _step_inputs(requests, memory, mask))
        except Exception:
            await self._step_one_by_one(requests)
            return
        seconds = time.perf_counter() - start
        rows = sum(r.search.rows for r in requests)
        self.stats.add(rows, seconds)
        if self.observer is not None:
            self.observer.on_step(seconds, rows)
        offset = 0
        for r in requests:
            n = r.search.rows
            self._advance(r, out, offset, n)
            offset += n
        self._retire()

    async def _step_one_by_one(self, requests: list[_Request]) -> None:
        """After a failed batched step: each request alone, so a fault stays with its owner."""
        for r in requests:
            if r.future.done():
                continue
            try:
                out = await self._call("decoder_step", _step_inputs([r], *_pad_memory([r])))
            except Exception as exc:
                self._fail(r, exc)
                continue
            self._advance(r, out, 0, r.search.rows)
        self._memory = None
        self._retire()

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

    def _retire(self) -> None:
        """Answer finished requests now; keep the rest."""
        kept = []
        for r in self._active:
            if r.future.done():
                continue
            if r.search.done:
                now, results = time.perf_counter(), r.search.results()
                r.future.set_result(Decoded(results, r.admitted - r.submitted,
                                            now - r.admitted, r.search.steps))
                tokens = len(results[0].token_ids) if results else 0
                self.stats.generated_tokens += tokens
                if self.observer is not None:
                    self.observer.on_finish(tokens, now - r.admitted)
            else:
                kept.append(r)
        if len(kept) != len(self._active):
            self._active = kept
            self._memory = None

    def _fail(self, r: _Request, exc: Exception) -> None:
        if not r.future.done():
            r.future.set_exception(InferenceFailed(f"decoding failed: {exc}"))

    def _report_depth(self) -> None:
        if self.observer is not None:
            self.observer.on_depth(len(self._waiting), self.live_rows)

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
