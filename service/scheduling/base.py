"""What the schedulers share: per-row timing, the observer they report to, right-padding."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

import numpy as np

R = TypeVar("R")


@dataclass(frozen=True)
class Timing:
    """Where one row's time went (seconds)."""

    queue_s: float
    """From submission to the start of its compute (its batch, or its admission)."""
    compute_s: float
    """Its batch's compute time (translators: admission to answer)."""
    batch_size: int
    """Rows in its batch (translators: decoder steps it took part in)."""


@dataclass(frozen=True)
class Timed(Generic[R]):
    """One row's result and where its time went: what a scheduler's future resolves to."""

    value: R
    timing: Timing


class Observer(Protocol):
    """Where a scheduler reports its work (Prometheus in the server, nothing in tests)."""

    def on_batch(self, rows: int, padded_tokens: int, real_tokens: int) -> None:
        """A batch (or an admission batch of encoders) was formed."""

    def on_depth(self, waiting: int, live_rows: int | None = None) -> None:
        """Rows waiting for compute changed; decoders also report their live hypotheses."""

    def on_encode(self, seconds: float, batch: int) -> None:
        """An encoder batch ran (translators)."""

    def on_step(self, seconds: float, rows: int) -> None:
        """A decoder step ran (translators)."""

    def on_finish(self, tokens: int, seconds: float) -> None:
        """A translation finished with `tokens` generated tokens (translators)."""


class NullObserver:
    """An observer that records nothing."""

    def on_batch(self, rows: int, padded_tokens: int, real_tokens: int) -> None:
        pass

    def on_depth(self, waiting: int, live_rows: int | None = None) -> None:
        pass

    def on_encode(self, seconds: float, batch: int) -> None:
        pass

    def on_step(self, seconds: float, rows: int) -> None:
        pass

    def on_finish(self, tokens: int, seconds: float) -> None:
        pass


def pad_rows(rows: Sequence[Sequence[int]], pad_id: int) -> tuple[np.ndarray, np.ndarray]:
    """Right-pad token rows into ids (B, T) int64 and lengths (B,) int64, T = longest row."""
    lengths = np.array([len(r) for r in rows], dtype=np.int64)  # (B,)
    ids = np.full((len(rows), int(lengths.max())), pad_id, dtype=np.int64)  # (B, T)
    for i, r in enumerate(rows):
        ids[i, : len(r)] = r
    return ids, lengths
