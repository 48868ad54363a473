"""The finished hypotheses of every request of a decode group.

Hypotheses that may still be answered live in a pool (`Entries`, appended to, compacted when
mostly dead); each request holds N slots (its n-best, best first) of pool indices and scores.
A step's newly finished hypotheses are merged into every request's n-best at once: one
stable sort of (requests, N + new) scores. Requests joining and leaving move only the slots.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from seqserve.service.scheduling.arrays import Columns, fit
from seqserve.service.scheduling.search import Hypothesis

MIN_POOL = 64
"""Smallest pool capacity."""


@dataclass
class Entries(Columns):
    """Finished hypotheses, one per entry."""

    score: np.ndarray  # (F,) float64
    logp: np.ndarray  # (F,) float64
    length: np.ndarray  # (F,) int64 tokens, EOS included
    ended: np.ndarray  # (F,) bool
    tokens: np.ndarray  # (F, W) int32, the first `length` valid
    coverage: np.ndarray  # (F, Sc) float64 (Sc = 0 when no request of the group needs it)
    attention: np.ndarray  # (F, Wa, Sa) float32 (Wa = Sa = 0 unless one asked for it)

    @staticmethod
    def empty(n: int, width: int, cov_width: int, attn_shape: tuple[int, int]) -> Entries:
        return Entries(np.full(n, -np.inf), np.zeros(n), np.zeros(n, np.int64),
                       np.zeros(n, bool), np.zeros((n, width), np.int32),
                       np.zeros((n, cov_width)), np.zeros((n, *attn_shape), np.float32))


class FinishedStore:
    """See module doc. Slots: index (Q, N) into the pool (-1: empty), score (Q, N) (-inf:
    empty); each request's n-best sorted best first, ties to the one finished first."""

    def __init__(self) -> None:
        self.index = np.zeros((0, 0), np.int64)  # (Q, N)
        self.score = np.zeros((0, 0))  # (Q, N)
        self.pool = Entries.empty(MIN_POOL, 0, 0, (0, 0))  # (P, ...)
        self.used = 0  # pool entries written

    @property
    def slots(self) -> int:
        return self.index.shape[1]

    def extend(self, n: int) -> None:
        """Room for n more requests (no hypotheses yet)."""
        self.index = np.concatenate([self.index, np.full((n, self.slots), -1)])
        self.score = np.concatenate([self.score, np.full((n, self.slots), -np.inf)])

    def take(self, mask: np.ndarray) -> None:
        """Keep the requests where `mask` (Q,) is set (their hypotheses stay in the pool)."""
        self.index, self.score = self.index[mask], self.score[mask]

    def reshape(self, slots: int, width: int, cov_width: int,
                attn_shape: tuple[int, int]) -> None:
        """Slots per request (grows only) and the widths of a hypothesis' history."""
        if slots > self.slots:
            pad = slots - self.slots
            self.index = np.pad(self.index, ((0, 0), (0, pad)), constant_values=-1)
            self.score = np.pad(self.score, ((0, 0), (0, pad)), constant_values=-np.inf)
        p = self.pool
        p.tokens, p.coverage = fit(p.tokens, width), fit(p.coverage, cov_width)
        p.attention = fit(p.attention, *attn_shape)

    def worst(self, n_best: np.ndarray) -> np.ndarray:
        """(Q,) score of each request's n_best-th hypothesis, -inf while it has fewer."""
        return self.score[np.arange(len(n_best)), n_best - 1]

    def merge(self, request: np.ndarray, new: Entries, n_best: np.ndarray) -> None:
        """Add new hypotheses of requests `request` (F,) ascending, each request's in the order
        they finished, keeping each request's n_best (Q,) best."""
        n, count = self.slots, len(request)
        if not count:
            return
        at = self._append(new)  # (F,) pool indices
        starts = np.empty(count, bool)  # (F,) first new one of its request
        starts[0], starts[1:] = True, request[1:] != request[:-1]
        first = np.flatnonzero(starts)  # (U,)
        ids = request[first]  # (U,)
        group = np.cumsum(starts) - 1  # (F,) its request among the U
        col = n + np.arange(count) - first[group]  # (F,) column after the N slots
        score = np.full((len(ids), int(col.max()) + 1), -np.inf)  # (U, N + C)
        index = np.full(score.shape, -1)  # (U, N + C)
        score[:, :n], index[:, :n] = self.score[ids], self.index[ids]
        score[group, col], index[group, col] = new.score, at
        order = np.argsort(-score, axis=1, kind="stable")[:, :n]  # (U, N): old first on ties
        at_row = np.arange(len(ids))[:, None]  # (U, 1)
        kept = np.arange(n)[None] < n_best[ids][:, None]  # (U, N)
        self.score[ids] = np.where(kept, score[at_row, order], -np.inf)
        self.index[ids] = np.where(kept, index[at_row, order], -1)

    def reserve(self, extra: int) -> None:
        """Room for `extra` more pool entries at `used` (compacting or growing the pool): the
        compiled step (beam_native.py) only writes into it."""
        if self.used + extra > len(self.pool):
            self._compact(extra)

    def _append(self, new: Entries) -> np.ndarray:
        self.reserve(len(new))
        at = np.arange(self.used, self.used + len(new))
        for name, value in vars(new).items():
            getattr(self.pool, name)[at[0] : at[-1] + 1] = value
        self.used += len(new)
        return at

    def _compact(self, extra: int) -> None:
        """Keep only the pool entries some slot points at, with room for `extra` more."""
        live = np.unique(self.index[self.index >= 0])  # (L,)
        capacity = max(MIN_POOL, 2 * (len(live) + extra))
        fresh = Entries.empty(capacity, self.pool.tokens.shape[1], self.pool.coverage.shape[1],
                              self.pool.attention.shape[1:])  # (P', ...)
        kept = self.pool.take(live)
        for name, value in vars(kept).items():
            getattr(fresh, name)[: len(live)] = value
        remap = np.full(len(self.pool), -1)
        remap[live] = np.arange(len(live))
        self.index = np.where(self.index >= 0, remap[self.index], -1)
        self.pool, self.used = fresh, len(live)

    def hypotheses(self, positions: np.ndarray, src_len: np.ndarray, coverage: np.ndarray,
                   attention: np.ndarray) -> list[list[Hypothesis]]:
        """The finished hypotheses of the requests at `positions`, best first, as answers;
        with coverage / attention rows where those (n,) flags are set."""
        return self.gather(positions, src_len, coverage, attention).hypotheses()

    def gather(self, positions: np.ndarray, src_len: np.ndarray, coverage: np.ndarray,
               attention: np.ndarray) -> Found:
        """The n-best of the requests at `positions` copied out of the pool (arrays only):
        `Found.hypotheses()` builds the answers later, whatever the store does meanwhile."""
        index = self.index[positions]  # (n, N) slots fill from the first
        return Found((index >= 0).sum(1), self.pool.take(np.maximum(index, 0)), src_len,
                     coverage, attention)


@dataclass(frozen=True, eq=False)
class Found:
    """Some requests' n-best, gathered: (n, N, ...) entries, the first `counts` of each row
    valid; the per-request source length and coverage / attention flags (n,)."""

    counts: np.ndarray
    entries: Entries
    src_len: np.ndarray
    coverage: np.ndarray
    attention: np.ndarray

    def hypotheses(self) -> list[list[Hypothesis]]:
        """The answers, one list per request, best first."""
        found = self.entries
        counts = self.counts.tolist()
        scores, logps = found.score.tolist(), found.logp.tolist()
        lengths, ended, tokens = found.length.tolist(), found.ended.tolist(), found.tokens.tolist()
        src_len, coverage, attention = self.src_len.tolist(), self.coverage, self.attention
        out = []
        for i, count in enumerate(counts):
            hyps = []
            for j in range(count):
                n, s = lengths[i][j], src_len[i]
                hyps.append(Hypothesis(
                    tuple(tokens[i][j][:n]), logps[i][j], scores[i][j], ended[i][j],
                    coverage=found.coverage[i, j, :s].copy() if coverage[i] else None,
                    attention=tuple(found.attention[i, j, :n, :s].copy()) if attention[i]
                    else ()))
            out.append(hyps)
        return out
