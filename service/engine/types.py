"""The engine's configuration, its answer type, timing stats and the interfaces it uses."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from service.engine.search import Hypothesis


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
    groups: int = 1
    """1: one decoder_step call for every live row. G > 1: the requests are split into G
    groups that take turns, so the loop updates one group's beams while the runtime computes
    another's step (uses a second core; results are the same)."""
    pad_id: int = 0
    """Padding id of source batches."""

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
