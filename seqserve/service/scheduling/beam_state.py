"""The state of the vectorised beam search of one decode group, and its membership.

One entry per request (`Requests`, Q of them, in the group's order), one row per live
hypothesis (`Rows`, R of them, grouped by request in the same order), each request's finished
n-best (`FinishedStore`), and the samplers of the sampling requests. Requests join at the end
(one BOS row each) and leave by a mask; the history widths (tokens, coverage, attention)
follow the members. The step itself is in beam_search.py.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from seqserve.service.scheduling.arrays import Columns, fit
from seqserve.service.scheduling.finished import FinishedStore, Found
from seqserve.service.scheduling.sampling import Sampler, sampling_k
from seqserve.service.scheduling.search import (
    DecodeLimits,
    Hypothesis,
    SearchOptions,
    length_penalty,
    max_steps,
)

_COLUMNS = ("key", "beam", "n_best", "min_length", "ngram", "k_base", "max_steps", "src_len",
            "steps", "alpha", "sampling", "coverage", "attention")
"""The columns of `Requests.ints`."""
_STEPS = _COLUMNS.index("steps")


@dataclass
class Requests(Columns):
    """Per request (Q,): its options as numbers and its progress, in one int64 matrix, so
    that requests join and leave by moving two arrays."""

    ints: np.ndarray  # (Q, 13) int64, columns `_COLUMNS`
    beta: np.ndarray  # (Q,) float64 coverage penalty

    @property
    def key(self) -> np.ndarray:
        """The caller's id of each request."""
        return self.ints[:, 0]

    @property
    def beam(self) -> np.ndarray:
        return self.ints[:, 1]

    @property
    def n_best(self) -> np.ndarray:
        return self.ints[:, 2]

    @property
    def min_length(self) -> np.ndarray:
        return self.ints[:, 3]

    @property
    def ngram(self) -> np.ndarray:
        """no_repeat_ngram_size, 0: off."""
        return self.ints[:, 4]

    @property
    def k_base(self) -> np.ndarray:
        """Top-k it needs before n-gram bans."""
        return self.ints[:, 5]

    @property
    def max_steps(self) -> np.ndarray:
        return self.ints[:, 6]

    @property
    def src_len(self) -> np.ndarray:
        return self.ints[:, 7]

    @property
    def steps(self) -> np.ndarray:
        """Tokens generated so far by each live hypothesis."""
        return self.ints[:, _STEPS]

    @property
    def alpha(self) -> np.ndarray:
        """Row of the length-penalty table."""
        return self.ints[:, 9]

    @property
    def sampling(self) -> np.ndarray:
        return self.ints[:, 10] != 0

    @property
    def coverage(self) -> np.ndarray:
        """beta > 0: its hypotheses keep their coverage."""
        return self.ints[:, 11] != 0

    @property
    def attention(self) -> np.ndarray:
        """return_attention: its hypotheses keep their attention rows."""
        return self.ints[:, 12] != 0

    def count_step(self) -> None:
        self.ints[:, _STEPS] += 1


@dataclass
class Rows(Columns):
    """Per live hypothesis (R,), grouped by request."""

    request: np.ndarray  # its request's position (int64), ascending
    logp: np.ndarray  # float64 cumulative log-prob
    last: np.ndarray  # int64 last token (BOS at the start): the next prev_ids
    tokens: np.ndarray  # (R, W) int16/int32 generated tokens, the first `steps` valid
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
        self.reqs = Requests(np.zeros((0, len(_COLUMNS)), np.int64), np.zeros(0))
        # the histories move every step: the narrowest type that holds every id
        self._token_type = np.int16 if limits.vocab_size <= np.iinfo(np.int16).max else np.int32
        self.rows = Rows(i64, np.zeros(0), i64, np.zeros((0, 0), self._token_type),
                         np.zeros((0, 0)),
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
        new = Requests(*self.admitted(keys, options, src_lens))
        r = self.rows
        rows = Rows(np.arange(len(self), len(self) + n), np.zeros(n),
                    np.full(n, self.limits.bos_id, np.int64),
                    np.zeros((n, r.tokens.shape[1]), self._token_type),
                    np.zeros((n, r.coverage.shape[1])),
                    np.zeros((n, *r.attention.shape[1:]), np.float32))
        self.reqs, self.rows = self.reqs.concat(new), self.rows.concat(rows)
        self.finished.extend(n)
        self.done = np.concatenate([self.done, np.zeros(n, bool)])
        self._membership_changed(joined=True)

    def admitted(self, keys: Sequence[int], options: Sequence[SearchOptions],
                 src_lens: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
        """The requests that `join` adds, as their `Requests` columns (and the compiled
        join takes them, beam_native.py): ints (n, 13) and beta (n,), made per request (their
        samplers too)."""
        ints, beta = [], []
        for key, o, src in zip(keys, options, src_lens, strict=True):
            beam, n_best, min_len, ngram, k_base, alpha, cov, sampling, attn = _option_numbers(o)
            row = self._alphas.get(alpha)
            ints.append((key, beam, n_best, min_len, ngram, k_base,
                         max_steps(o, src, self.limits), src, 0,
                         self._alpha_row(alpha) if row is None else row, sampling, cov > 0, attn))
            beta.append(cov)
            if o.sampling:
                self.samplers[int(key)] = Sampler(o)
        return (np.array(ints, np.int64).reshape(len(ints), len(_COLUMNS)),
                np.array(beta, np.float64))

    def keep(self, mask: np.ndarray) -> None:
        """Keep the requests where `mask` (Q,) is set, in order; drop the others' state."""
        self._drop_samplers(mask)
        at = mask[self.rows.request]  # (R,)
        rows = self.rows if at.all() else self.rows.take(at)  # done requests have no rows
        rows.request = (np.cumsum(mask) - 1)[rows.request]
        self.rows, self.reqs, self.done = rows, self.reqs.take(mask), self.done[mask]
        self.finished.take(mask)
        self._membership_changed(joined=False)

    def _drop_samplers(self, mask: np.ndarray) -> None:
        """Forget the samplers of the requests leaving (`mask` (Q,) unset)."""
        if self.samplers:
            for key in self.reqs.key[~mask & self.reqs.sampling].tolist():
                self.samplers.pop(key, None)

    def set_source_width(self, width: int) -> None:
        """The source width S of the attention the decoder step returns (padded memory)."""
        if width != self._source_width:
            self._source_width = width
            self._reshape()

    def _reshape(self) -> None:
        """Fit the history widths to the members. They only grow (the tokens to the longest
        length cap, coverage and attention to the source width) while some request needs
        them, so that requests coming and going rarely move the histories."""
        q, r = self.reqs, self.rows
        width = max(r.tokens.shape[1], int(q.max_steps.max(initial=0)))
        src = max(r.coverage.shape[1], r.attention.shape[2], self._source_width)
        cov = src if q.coverage.any() else 0
        attn = (width, src) if q.attention.any() else (0, 0)
        if (width, cov, attn) != (r.tokens.shape[1], r.coverage.shape[1], r.attention.shape[1:]):
            r.tokens, r.coverage = fit(r.tokens, width), fit(r.coverage, cov)
            r.attention = fit(r.attention, *attn)
        self.finished.reshape(int(q.n_best.max(initial=0)), width, cov, attn)

    def _alpha_row(self, alpha: float) -> int:
        """A new row of the length-penalty table, for `alpha`."""
        self._alphas[alpha] = len(self._alphas)
        table = [length_penalty(n, alpha) for n in range(self._lp.shape[1])]
        self._lp = np.vstack([self._lp, table])  # (A, L + 1)
        return self._alphas[alpha]

    # -- what the scheduler asks ----------------------------------------------------------

    @property
    def n_rows(self) -> int:
        return len(self.rows)

    def prev_ids(self) -> np.ndarray:
        """(R,) int64: each live hypothesis' last token."""
        return self.rows.last

    def results(self, positions: np.ndarray) -> list[list[Hypothesis]]:
        """The n-best of the requests at `positions`, best first."""
        return self.gathered(positions).hypotheses()

    def gathered(self, positions: np.ndarray) -> Found:
        """`results` copied out as arrays (the answers built later: `Found.hypotheses`)."""
        r = self.reqs
        return self.finished.gather(positions, r.src_len[positions], r.coverage[positions],
                                    r.attention[positions])

    def _membership_changed(self, joined: bool) -> None:
        r = self.rows
        if joined or r.coverage.shape[1] or r.attention.shape[1]:  # grow, or maybe drop
            self._reshape()
