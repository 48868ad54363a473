"""The decode scheduler's vocabulary: its config, a request and its status, the answer, and the
two kinds of work the scheduler hands out, with the runtime calls that execute them.

Execution is the only part that touches the runtime. It reads nothing but its work item (the
inputs were built when the work was scheduled), so it can run on another thread while the
scheduler updates other groups. A fault in a batched call is retried request by request, so
it fails only the requests that cause it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from seqserve.service.runtimes.base import Runtime
from seqserve.service.scheduling.base import Admission, Timing, pad_rows
from seqserve.service.scheduling.group import DecodeGroup
from seqserve.service.scheduling.loop import Status
from seqserve.service.scheduling.search import Hypothesis, SearchOptions


@dataclass(frozen=True, kw_only=True)
class DecodeConfig:
    """Capacity and scheduling of one translator's decode loop (the server's come from its
    settings through `EngineOptions.model_config`; no defaults here that could disagree)."""

    max_live_hypotheses: int
    """Rows reserved at once (sum of beam_size of admitted requests); keeps memory flat."""
    max_queue: int
    """Requests waiting for admission; beyond it submissions get 429."""
    max_admit: int
    """Requests encoded together in one admission batch."""
    groups: int
    """1: one decoder_step call for every live row. G > 1: the requests are split into G
    groups that take turns, so the loop updates one group's beams while the runtime computes
    another's step (uses a second core; results are the same)."""
    retry_after_s: float
    """Retry-After of QueueFull and ShuttingDown (the server passes its setting)."""
    max_queue_wait_s: float | None
    """Admission by expected wait: sources whose expected wait for admission (the sources
    ahead of them at the recently measured admission rate) exceeds this, or their deadline,
    are refused at once (QueueFull); None: the queue bound only."""
    runtime_calls: Literal["loop", "threads"] = "threads"
    """Where the encoder (prefill) and decoder steps run: on a lane thread each, or on the
    event loop's own thread (lanes.py; the server's `--runtime-calls`)."""
    admit_steps: int = 0
    """While other requests decode and sources keep arriving (at least one a schedule on
    average), waiting sources are held for up to this many decoder steps, until `max_admit`
    of them wait, to be encoded together (0: each step admits what waits). An encoder call
    costs less a source in a bigger batch, most of all between decoder steps, which leave
    the encoder's weights out of the cache."""
    continuous: bool = True
    """Step-level batching; False: request-level (a batch runs to completion first; a
    benchmark's comparison, not a server setting)."""
    pad_id: int = 0
    """Padding id of source batches (`build_model` puts the bundle's here)."""

    def __post_init__(self) -> None:
        for name in ("max_live_hypotheses", "max_queue", "max_admit", "groups"):
            if getattr(self, name) < 1:
                raise ValueError(f"DecodeConfig.{name} must be >= 1")


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
        return Timing(self.queue_s, self.decode_s, 0, self.steps)


@dataclass(eq=False)
class Request:
    """One source sentence in the decode scheduler."""

    rid: int
    src_ids: list[int]
    options: SearchOptions
    submitted: float
    status: Status = Status.WAITING
    admitted: float = 0.0
    admission: Admission | None = None
    """Its request's admission, shared by the request's sources (None: a probe)."""


@dataclass(frozen=True, eq=False)
class EncodeWork:
    """Encode admitted requests as one batch."""

    requests: list[Request]
    pad_id: int
    epoch: int  # the scheduler's epoch when scheduled (a reset makes it stale)


@dataclass(frozen=True, eq=False)
class StepWork:
    """One decoder_step over every live row of one group."""

    group: DecodeGroup
    index: int  # the group's index
    inputs: dict[str, np.ndarray]
    request: np.ndarray  # (R,) each row's request position (for one-by-one retries)


Work = EncodeWork | StepWork


@dataclass(frozen=True)
class EncodeResult:
    memory: np.ndarray  # (n, S, D)
    state: np.ndarray  # (n, state_dim)
    lengths: np.ndarray  # (n,)
    failed: dict[int, Exception]  # request index -> what its own encoder call raised
    seconds: float
    keys: np.ndarray | None = None  # (n, S, A): an encoder with projected attention keys


@dataclass(frozen=True)
class StepResult:
    out: dict[str, np.ndarray]  # decoder_step outputs for every row
    seconds: float
    failed: dict[int, Exception]  # request position -> what its own step raised
    batched: bool  # False: the batched call failed and requests ran one by one


def execute(runtime: Runtime, work: Work) -> EncodeResult | StepResult:
    """Run one work item on the runtime (any thread)."""
    start = time.perf_counter()
    if isinstance(work, EncodeWork):
        sources = [r.src_ids for r in work.requests]
        try:
            memory, state, lengths, keys = _encode(runtime, sources, work.pad_id)
            failed: dict[int, Exception] = {}
        except Exception:
            memory, state, lengths, keys, failed = _encode_one_by_one(runtime, sources,
                                                                      work.pad_id)
        return EncodeResult(memory, state, lengths, failed, time.perf_counter() - start, keys)
    try:
        out = runtime.run("decoder_step", work.inputs)
        return StepResult(out, time.perf_counter() - start, {}, True)
    except Exception:
        out, failed = _step_one_by_one(runtime, work)
        return StepResult(out, time.perf_counter() - start, failed, False)


def _encode(runtime: Runtime, sources: list[list[int]], pad_id: int
            ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray | None]:
    """memory (n, S, D), state (n, state_dim), lengths (n,) and the keys (n, S, A) of an
    encoder that returns them (else None)."""
    src, lengths = pad_rows(sources, pad_id)  # (n, S), (n,)
    out = runtime.run("encoder", {"src_ids": src, "src_lengths": lengths})
    return out["memory"], out["state"], lengths, out.get("keys")


def _encode_one_by_one(runtime: Runtime, sources: list[list[int]], pad_id: int,
                       ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray | None,
                                  dict[int, Exception]]:
    """After a failed batch: each source alone; the results padded back into one batch."""
    parts: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray | None]] = {}
    failed: dict[int, Exception] = {}
    for i, src in enumerate(sources):
        try:
            parts[i] = _encode(runtime, [src], pad_id)
        except Exception as exc:  # only this request fails
            failed[i] = exc
    n = len(sources)
    if not parts:
        return np.zeros((n, 0, 0), np.float32), np.zeros((n, 0), np.float32), \
            np.zeros(n, np.int64), None, failed
    some = next(iter(parts.values()))
    width = max(p[0].shape[1] for p in parts.values())
    memory = np.zeros((n, width, some[0].shape[2]), np.float32)  # (n, S, D)
    state = np.zeros((n, some[1].shape[1]), np.float32)  # (n, state_dim)
    keys = None if some[3] is None else np.zeros((n, width, some[3].shape[2]), np.float32)
    lengths = np.zeros(n, np.int64)
    for i, (m, s, length, k) in parts.items():
        memory[i, : m.shape[1]], state[i], lengths[i] = m[0], s[0], length[0]
        if keys is not None and k is not None:
            keys[i, : k.shape[1]] = k[0]  # (S_i, A)
    return memory, state, lengths, keys, failed


def _step_one_by_one(runtime: Runtime,
                     work: StepWork) -> tuple[dict[str, np.ndarray], dict[int, Exception]]:
    """After a failed batched step: each request's rows alone, so a fault stays with its
    owner; a failed request's rows read -inf (it is failed, not advanced)."""
    x, request = work.inputs, work.request
    rows, k = len(request), int(x["k"][0])
    out = {"new_state": np.zeros_like(x["state"]),
           "topk_logprobs": np.full((rows, k), -np.inf, np.float32),
           "topk_ids": np.zeros((rows, k), np.int64),
           "attention": np.zeros((rows, x["memory"].shape[1]), np.float32)}
    bounds = np.searchsorted(request, np.arange(int(request.max()) + 2))  # (Q + 1,)
    failed: dict[int, Exception] = {}
    for q in range(len(bounds) - 1):
        lo, hi = int(bounds[q]), int(bounds[q + 1])
        slot = int(x["memory_index"][lo])
        alone = {"prev_ids": x["prev_ids"][lo:hi], "state": x["state"][lo:hi],
                 "memory": x["memory"][slot : slot + 1], "src_mask": x["src_mask"][slot : slot + 1],
                 "memory_index": np.zeros(hi - lo, np.int64), "k": x["k"]}
        if "keys" in x:
            alone["keys"] = x["keys"][slot : slot + 1]
        try:
            got = runtime.run("decoder_step", alone)
        except Exception as exc:
            failed[q] = exc
            continue
        for name, value in out.items():
            value[lo:hi] = got[name]
    return out, failed
