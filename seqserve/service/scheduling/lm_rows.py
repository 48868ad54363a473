"""The language models' live sequences as parallel arrays (`Rows`), one entry per row of the
LM scheduler's state (`scheduling.lm_scheduler`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from seqserve.service.scheduling.generation import GenerateOptions


@dataclass
class Rows:
    """Live sequences as parallel arrays, one entry per row of the scheduler's `state`. A
    request's sequences are contiguous (they join together and only ever leave)."""

    rid: np.ndarray  # (N,) int64
    index: np.ndarray  # (N,) int64: the sequence's index in its request
    left: np.ndarray  # (N,) int64: tokens it may still generate
    temperature: np.ndarray  # (N,) float32
    top_k: np.ndarray  # (N,) int64
    top_p: np.ndarray  # (N,) float32
    top_logprobs: np.ndarray  # (N,) int64
    key: np.ndarray  # (N,) uint64: its random stream (sampling.uniforms)
    drawn: np.ndarray  # (N,) int64: tokens it drew so far
    tuned: np.ndarray  # (N,) bool: its draw is tuned (GenerateOptions.tuned)
    counts: np.ndarray  # (N,) object: with penalties, token -> times generated; else None

    @classmethod
    def empty(cls) -> Rows:
        return cls(*(np.zeros(0, dtype=f.type) for f in ROW_FIELDS))

    @classmethod
    def of(cls, rid: int, options: GenerateOptions, keys: np.ndarray) -> Rows:
        """A request's `len(keys)` sequences (indices 0..n-1), none drawn yet."""
        n = len(keys)
        o = options
        counts = np.empty(n, dtype=object)
        if o.presence_penalty or o.frequency_penalty:
            for i in range(n):
                counts[i] = {}
        return cls(np.full(n, rid, dtype=np.int64), np.arange(n, dtype=np.int64),
                   np.full(n, o.max_new_tokens, dtype=np.int64),
                   np.full(n, o.temperature, dtype=np.float32),
                   np.full(n, o.top_k, dtype=np.int64), np.full(n, o.top_p, dtype=np.float32),
                   np.full(n, o.top_logprobs, dtype=np.int64), keys,
                   np.zeros(n, dtype=np.int64), np.full(n, o.tuned, dtype=bool), counts)

    def __len__(self) -> int:
        return len(self.rid)

    def take(self, which: np.ndarray) -> Rows:
        return Rows(*(getattr(self, f.name)[which] for f in ROW_FIELDS))

    @staticmethod
    def concat(parts: Sequence[Rows]) -> Rows:
        if len(parts) == 1:
            return parts[0]
        return Rows(*(np.concatenate([getattr(p, f.name) for p in parts])
                      for f in ROW_FIELDS))

    def count(self, tokens: np.ndarray) -> None:
        """Each row with penalties counts the token it just drew (tokens (N,))."""
        for i in np.flatnonzero(self.tuned).tolist():
            seen = self.counts[i]
            if seen is not None:
                token = int(tokens[i])
                seen[token] = seen.get(token, 0) + 1


@dataclass(frozen=True)
class RowField:
    name: str
    type: type


ROW_FIELDS = tuple(RowField(n, t) for n, t in (
    ("rid", np.int64), ("index", np.int64), ("left", np.int64), ("temperature", np.float32),
    ("top_k", np.int64), ("top_p", np.float32), ("top_logprobs", np.int64),
    ("key", np.uint64), ("drawn", np.int64), ("tuned", bool), ("counts", object)))
