"""The finished hypotheses of every request of a decode group: each request's n-best, kept
sorted, as arrays (Q requests x N slots), merged with a step's newly finished ones in one
vectorised pass."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from service.scheduling.arrays import Columns, fit
from service.scheduling.beam import Hypothesis


@dataclass
class Entries(Columns):
    """Finished hypotheses, one per entry (the step's new ones, or a store's slots)."""

    score: np.ndarray  # (F,) float64, -inf: empty slot
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
    """Each request's n-best finished hypotheses, best first, ties to the earlier finished:
    slots (Q, N) of `Entries` fields; N is the largest n_best of the group."""

    def __init__(self) -> None:
        self.slots = 0
        self.best = _unflatten(Entries.empty(0, 0, 0, (0, 0)), 0, 0)  # fields (Q, N, ...)

    def extend(self, n: int) -> None:
        """Room for n more requests (no hypotheses yet)."""
        b = self.best
        more = Entries.empty(n * self.slots, b.tokens.shape[-1], b.coverage.shape[-1],
                             b.attention.shape[-2:])  # (n * N, ...)
        self.best = self.best.concat(_unflatten(more, n, self.slots))

    def reshape(self, slots: int, width: int, cov_width: int,
                attn_shape: tuple[int, int]) -> None:
        """Cut or pad the slot count and the per-hypothesis widths (nothing kept is lost)."""
        if slots != self.slots:
            self.best = _resize_slots(self.best, slots)
            self.slots = slots
        b = self.best
        b.tokens = fit(b.tokens, slots, width)
        b.coverage = fit(b.coverage, slots, cov_width)
        b.attention = fit(b.attention, slots, *attn_shape)

    def take(self, index: np.ndarray) -> None:
        self.best = self.best.take(index)

    def worst(self, n_best: np.ndarray) -> np.ndarray:
        """(Q,) score of each request's n_best-th hypothesis, -inf while it has fewer."""
        return self.best.score[np.arange(len(n_best)), n_best - 1]

    def merge(self, request: np.ndarray, new: Entries, n_best: np.ndarray) -> None:
        """Add new hypotheses of requests `request` (F,) ascending, each request's in the order
        they finished, keeping each request's n_best (Q,) best."""
        if not len(request):
            return
        ids, first, counts = np.unique(request, return_index=True, return_counts=True)  # (U,)
        group = np.repeat(np.arange(len(ids)), counts)  # (F,)
        pos = np.arange(len(request)) - first[group]  # (F,) rank among the request's new ones
        n = self.slots
        score = np.full((len(ids), n + counts.max()), -np.inf)  # (U, N + C)
        score[:, :n] = self.best.score[ids]
        score[group, n + pos] = new.score
        order = np.argsort(-score, axis=1, kind="stable")[:, :n]  # (U, N) stable: old first
        from_old = order < n  # (U, N)
        old_slot = np.minimum(order, n - 1)  # (U, N)
        new_index = np.clip(first[:, None] + order - n, 0, len(request) - 1)  # (U, N)
        merged = {}
        for name in ("score", "logp", "length", "ended", "tokens", "coverage", "attention"):
            old = getattr(self.best, name)[ids[:, None], old_slot]  # (U, N, ...)
            fresh = getattr(new, name)[new_index]  # (U, N, ...)
            pick = from_old.reshape(*from_old.shape, *([1] * (old.ndim - 2)))
            merged[name] = np.where(pick, old, fresh)
        kept = np.arange(n)[None] < n_best[ids][:, None]  # (U, N)
        merged["score"] = np.where(kept, merged["score"], -np.inf)
        for name, value in merged.items():
            getattr(self.best, name)[ids] = value

    def hypotheses(self, positions: np.ndarray, src_len: np.ndarray, coverage: np.ndarray,
                   attention: np.ndarray) -> list[list[Hypothesis]]:
        """The finished hypotheses of the requests at `positions`, best first, as answers;
        with coverage / attention rows where those (n,) flags are set."""
        b = self.best
        score = b.score[positions]  # (n, N)
        counts = np.isfinite(score).sum(1).tolist()  # slots fill from the first
        scores, logps = score.tolist(), b.logp[positions].tolist()
        lengths, ended = b.length[positions].tolist(), b.ended[positions].tolist()
        tokens = b.tokens[positions].tolist()  # (n, N, W)
        out = []
        for i, q in enumerate(positions.tolist()):
            hyps = []
            for j in range(counts[i]):
                n, s = lengths[i][j], int(src_len[i])
                hyps.append(Hypothesis(
                    tuple(tokens[i][j][:n]), logps[i][j], scores[i][j], ended[i][j],
                    coverage=b.coverage[q, j, :s].copy() if coverage[i] else None,
                    attention=tuple(b.attention[q, j, :n, :s].copy()) if attention[i] else ()))
            out.append(hyps)
        return out


def _unflatten(e: Entries, rows: int, slots: int) -> Entries:
    """(rows * slots, ...) entries as (rows, slots, ...)."""
    return Entries(**{name: v.reshape(rows, slots, *v.shape[1:])
                      for name, v in vars(e).items()})


def _resize_slots(b: Entries, slots: int) -> Entries:
    q = len(b.score)
    fresh = _unflatten(Entries.empty(q * slots, b.tokens.shape[-1], b.coverage.shape[-1],
                                     b.attention.shape[-2:]), q, slots)  # (Q, slots, ...)
    keep = min(slots, b.score.shape[1])
    for name, v in vars(fresh).items():
        v[:, :keep] = getattr(b, name)[:, :keep]
    return fresh
