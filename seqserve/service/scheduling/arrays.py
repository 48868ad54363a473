"""Array helpers of the vectorised beam search: exact row-wise top-k, segment maxima, n-gram
bans, and the columns containers the search keeps its state in. Pure numpy, no Python loop
over rows or requests."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Self

import numpy as np


def top_k_rows(neg: np.ndarray, k: int) -> np.ndarray:
    """Column indices of the k smallest entries of every row of `neg` (Q, M), smallest first,
    ties to the lower column: exactly the first k columns of a stable argsort of each row,
    without sorting whole rows. `neg` holds no NaN (+inf sorts last); M >= k."""
    rows, cols = neg.shape
    if cols == k:
        return np.argsort(neg, axis=1, kind="stable")
    threshold = np.partition(neg, k - 1, axis=1)[:, k - 1 : k]  # (Q, 1) the k-th smallest
    chosen = neg <= threshold  # (Q, M) at least k per row; more where the k-th is tied
    flat = np.flatnonzero(chosen)
    if len(flat) == rows * k:  # exactly k in every row: their columns, ascending
        index = (flat - np.repeat(np.arange(rows) * cols, k)).reshape(rows, k)  # (Q, k)
    else:
        index = np.empty((rows, k), np.int64)
        exact = chosen.sum(1) == k  # (Q,)
        index[exact] = np.nonzero(chosen[exact])[1].reshape(-1, k)
        tied = np.argsort(neg[~exact], axis=1, kind="stable")[:, :k]  # the rule itself
        index[~exact] = np.sort(tied, axis=1)
    at = np.arange(rows)[:, None]  # (Q, 1)
    order = np.argsort(neg[at, index], axis=1, kind="stable")  # ties keep the lower column
    return index[at, order]  # (Q, k)


def segment_max(values: np.ndarray, segment: np.ndarray, n: int) -> np.ndarray:
    """(n,) maximum of `values` (R,) per segment id (R,), ids ascending; -inf where empty."""
    out = np.full(n, -np.inf)
    if len(values):
        fresh = np.empty(len(segment), bool)  # (R,) first of its segment
        fresh[0], fresh[1:] = True, segment[1:] != segment[:-1]
        starts = np.flatnonzero(fresh)  # (segments,)
        out[segment[starts]] = np.maximum.reduceat(values, starts)
    return out


def ngram_bans(tokens: np.ndarray, lengths: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Tokens each row may not generate next without repeating one of its n-grams.

    Inputs: tokens (R, W) (row r's first lengths[r] are its history), n >= 1.
    Outputs: banned (R, P) token ids and ok (R, P) bool: banned[r, i] counts where ok[r, i].
    """
    width = tokens.shape[1]
    if n == 1:  # every token already generated
        return tokens, np.arange(width)[None] < lengths[:, None]  # (R, W)
    positions = width - n + 1  # n-grams i .. i+n-1 that fit in the history width
    if positions <= 0:
        return tokens[:, :0], np.zeros((len(tokens), 0), dtype=bool)
    windows = np.lib.stride_tricks.sliding_window_view(tokens, n - 1, axis=1)  # (R, W-n+2, n-1)
    cols = np.clip(lengths[:, None] - (n - 1) + np.arange(n - 1), 0, width - 1)  # (R, n-1)
    prefix = np.take_along_axis(tokens, cols, 1)  # (R, n-1) the last n-1 tokens
    match = (windows[:, :positions] == prefix[:, None, :]).all(-1)  # (R, P)
    ok = match & (np.arange(positions)[None] <= (lengths - n)[:, None])  # (R, P)
    return tokens[:, n - 1 : n - 1 + positions], ok  # (R, P) the token after each window


def distinct_count(values: np.ndarray, ok: np.ndarray) -> np.ndarray:
    """(R,) number of distinct non-negative values[r, i] with ok[r, i]."""
    if values.shape[1] == 0:
        return np.zeros(len(values), dtype=np.int64)
    s = np.sort(np.where(ok, values, -1), axis=1)  # (R, P) ascending, -1 = none
    fresh = np.concatenate([s[:, :1] >= 0, (s[:, 1:] != s[:, :-1]) & (s[:, 1:] >= 0)], axis=1)
    return fresh.sum(1)


def banned_mask(ids: np.ndarray, banned: np.ndarray, ok: np.ndarray) -> np.ndarray:
    """(R, K) bool: candidate ids (R, K) that are among their row's banned (R, P) where ok."""
    return ((ids[:, :, None] == banned[:, None, :]) & ok[:, None, :]).any(-1)  # (R, K)


def fit(a: np.ndarray, *sizes: int) -> np.ndarray:
    """`a` with its trailing axes cut or zero-padded to `sizes` (axis 0 kept)."""
    if a.shape[1:] == sizes:
        return a
    out = np.zeros((a.shape[0], *sizes), dtype=a.dtype)
    common = (slice(None), *(slice(0, min(x, y)) for x, y in zip(a.shape[1:], sizes,
                                                                  strict=True)))
    out[common] = a[common]
    return out


_NAMES: dict[type[Any], tuple[str, ...]] = {}


def _names(cls: type[Any]) -> tuple[str, ...]:
    """Field names of a Columns dataclass (cached: `fields()` is slow for a step's pace)."""
    names = _NAMES.get(cls)
    if names is None:
        names = _NAMES[cls] = tuple(f.name for f in fields(cls))
    return names


@dataclass
class Columns:
    """Arrays that share their first axis (one entry per request, row or hypothesis)."""

    def take(self, index: np.ndarray) -> Self:
        """The entries at `index` (an index array or a boolean mask), in its order."""
        return type(self)(*(getattr(self, name)[index] for name in _names(type(self))))

    def concat(self, *others: Self) -> Self:
        """These entries followed by those of `others`."""
        return type(self)(*(np.concatenate([getattr(c, name) for c in (self, *others)])
                            for name in _names(type(self))))

    def __len__(self) -> int:
        return len(getattr(self, _names(type(self))[0]))
