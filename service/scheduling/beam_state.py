"""The state of the vectorised beam search of one decode group, and its membership.

One entry per request (`Requests`, Q of them, in the group's order), one row per live
hypothesis (`Rows`, R of them, grouped by request in the same order), each request's finished
n-best (`FinishedStore`), and the samplers of the sampling requests. Requests join at the end
(one BOS row each) and leave by a mask; the history widths (tokens, coverage, attention)
follow the members. The step itself is in beams.py.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from service.scheduling.arrays import Columns, fit
from service.scheduling.beam import (
    DecodeLimits,
    Hypothesis,
    SearchOptions,
    length_penalty,
    max_steps,
)
from service.scheduling.finished import FinishedStore
from service.scheduling.sampling import Sampler, sampling_k


@dataclass
class Requests(Columns):
    """Per request (Q,): its options as numbers and its progress."""

    key: np.ndarray  # caller's id (int64)
    beam: np.ndarray
    n_best: np.ndarray
    min_length: np.ndarray
    ngram: np.ndarray  # no_repeat_ngram_size, 0: off
    k_base: np.ndarray  # top-k it needs before n-gram bans
    max_steps: np.ndarray
    src_len: np.ndarray
    steps: np.ndarray  # tokens generated so far by each live hypothesis
    alpha: np.ndarray  # row of the length-penalty table
    beta: np.ndarray  # float64 coverage penalty
    sampling: np.ndarray  # bool
    coverage: np.ndarray  # bool: beta > 0 (keep coverage)
    attention: np.ndarray  # bool: return_attention


@dataclass
class Rows(Columns):
    """Per live hypothesis (R,), grouped by request."""

    request: np.ndarray  # its request's position (int64), ascending
    logp: np.ndarray  # float64 cumulative log-prob
    last: np.ndarray  # int64 last token (BOS at the start): the next prev_ids
    tokens: np.ndarray  # (R, W) int32 generated tokens, the first `steps` valid
    coverage: np.ndarray  # (R, Sc) float64 attention mass per source token
    attention: np.ndarray  # (R, Wa, Sa) float32 attention rows (return_attention)


@lru_cache(maxsize=4096)
def _option_numbers(o: SearchOptions) -> tuple[float, ...]:
    k_base = sampling_k(o) if o.sampling else 2 * o.beam_size + 1
    return (o.beam_size, o.n_best, o.min_length, o.no_repeat_ngram_size, k_base,
            o.length_penalty, o.coverage_penalty, o.sampling, o.return_attention)


class BeamState:
    """The search state of a group's requests (see module doc); `Beams` steps it."""

    def __init__(self, limits: DecodeLimits) -> None:
        self.limits = limits
        i64 = np.zeros(0, np.int64)
        self.reqs = Requests(i64, i64, i64, i64, i64, i64, i64, i64, i64, i64, np.zeros(0),
                             *(np.zeros(0, bool) for _ in range(3)))
        self.rows = Rows(i64, np.zeros(0), i64, np.zeros((0, 0), np.int32), np.zeros((0, 0)),
                         np.zeros((0, 0, 0), np.float32))
        self.finished = FinishedStore()
        self.samplers: dict[int, Sampler] = {}
        self.done = np.zeros(0, bool)
        self._alphas: dict[float, int] = {}
        self._lp = np.zeros((0, max(limits.max_decode_length, 1) + 1))  # (A, L + 1)
        self._source_width = 0

    def __len__(self) -> int:
        return len(self.reqs)

    # -- membership -----------------------------------------------------------------------

    def join(self, keys: Sequence[int], options: Sequence[SearchOptions],
             src_lens: Sequence[int]) -> None:
        """Add requests (one BOS row each) at the end."""
        n = len(keys)
        beam, n_best, min_len, ngram, k_base, alpha, beta, sampling, attn = (
            np.array(c) for c in zip(*(_option_numbers(o) for o in options), strict=True))
        caps = [max_steps(o, s, self.limits) for o, s in zip(options, src_lens, strict=True)]
        i64 = np.int64
        new = Requests(
            key=np.asarray(keys, i64), beam=beam.astype(i64), n_best=n_best.astype(i64),
            min_length=min_len.astype(i64), ngram=ngram.astype(i64), k_base=k_base.astype(i64),
            max_steps=np.asarray(caps, i64), src_len=np.asarray(src_lens, i64),
            steps=np.zeros(n, i64), alpha=self._alpha_rows(alpha), beta=beta.astype(np.float64),
            sampling=sampling.astype(bool), coverage=beta > 0, attention=attn.astype(bool))
        for key, o in zip(keys, options, strict=True):
            if o.sampling:
                self.samplers[int(key)] = Sampler(o)
        r = self.rows
        rows = Rows(np.arange(len(self), len(self) + n), np.zeros(n),
                    np.full(n, self.limits.bos_id, np.int64),
                    np.zeros((n, r.tokens.shape[1]), np.int32),
                    np.zeros((n, r.coverage.shape[1])),
                    np.zeros((n, *r.attention.shape[1:]), np.float32))
        self.reqs, self.rows = self.reqs.concat(new), self.rows.concat(rows)
        self.finished.extend(n)
        self.done = np.concatenate([self.done, np.zeros(n, bool)])
        self._membership_changed()

    def keep(self, mask: np.ndarray) -> None:
        """Keep the requests where `mask` (Q,) is set, in order; drop the others' state."""
        for key in self.reqs.key[~mask & self.reqs.sampling].tolist():
            self.samplers.pop(key, None)
        at = mask[self.rows.request]  # (R,)
        rows = self.rows if at.all() else self.rows.take(at)  # done requests have no rows
        rows.request = (np.cumsum(mask) - 1)[rows.request]
        self.rows, self.reqs, self.done = rows, self.reqs.take(mask), self.done[mask]
        self.finished.take(mask)
        self._membership_changed()

    def set_source_width(self, width: int) -> None:
        """The source width S of the attention the decoder step returns (padded memory)."""
        if width != self._source_width:
            self._source_width = width
            self._reshape()

    def _reshape(self) -> None:
        """Fit the history widths to the members: tokens to the longest length cap, coverage
        and attention to the source width only while some request needs them."""
        q, r = self.reqs, self.rows
        width = int(q.max_steps.max()) if len(q) else 0
        cov = self._source_width if q.coverage.any() else 0
        attn = (width, self._source_width) if q.attention.any() else (0, 0)
        r.tokens, r.coverage = fit(r.tokens, width), fit(r.coverage, cov)
        r.attention = fit(r.attention, *attn)
        self.finished.reshape(int(q.n_best.max()) if len(q) else 0, width, cov, attn)

    def _alpha_rows(self, alphas: np.ndarray) -> np.ndarray:
        """Rows of the length-penalty table (computed with Python floats, as the rules say)."""
        for a in alphas.tolist():
            if a not in self._alphas:
                self._alphas[a] = len(self._alphas)
                table = [length_penalty(n, a) for n in range(self._lp.shape[1])]
                self._lp = np.vstack([self._lp, table])  # (A, L + 1)
        return np.array([self._alphas[a] for a in alphas.tolist()], np.int64)

    # -- what the engine asks -------------------------------------------------------------

    @property
    def n_rows(self) -> int:
        return len(self.rows)

    def prev_ids(self) -> np.ndarray:
        """(R,) int64: each live hypothesis' last token."""
        return self.rows.last

    def results(self, positions: np.ndarray) -> list[list[Hypothesis]]:
        """The n-best of the requests at `positions`, best first."""
        r = self.reqs
        return self.finished.hypotheses(positions, r.src_len[positions],
                                        r.coverage[positions], r.attention[positions])

    def _membership_changed(self) -> None:
        self._reshape()
