"""Sampling: the translator's per-request draw (`Sampler`), and the language models'
vectorised one (`sample`, `uniforms`: every live sequence in a few array operations; `tuned`:
OpenAI's logit bias, presence and frequency penalties and ignore_eos, for the rows that ask).

Translators (beam 1): each sampling request draws from its own
`numpy.random.Generator(seed)`, so its draw cannot be batched with other requests' without
changing what a seed gives. Everything else about a sampling request (masks, finishing,
length cap) goes through the vectorised step with the beam requests; only the draw below
runs once per sampling request per step.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from seqserve.service.scheduling.generation import GenerateOptions
from seqserve.service.scheduling.search import SAMPLING_CANDIDATES, SearchOptions


def sampling_k(options: SearchOptions) -> int:
    """Candidates a sampling request needs from decoder_step (before the vocabulary cap)."""
    return options.top_k if options.top_k is not None else SAMPLING_CANDIDATES


@dataclass
class Sampler:
    """One sampling request's draw (see search.py for the rule)."""

    options: SearchOptions
    rng: np.random.Generator = field(init=False)

    def __post_init__(self) -> None:
        self.rng = np.random.default_rng(self.options.seed)

    def draw(self, total: np.ndarray, logprobs: np.ndarray) -> int | None:
        """Column drawn among the row's candidates, or None when none is allowed.

        Inputs: total (k,) cumulative log-probs, -inf where masked; logprobs (k,) the step's.
        """
        o = self.options
        cand = np.flatnonzero(np.isfinite(total))  # allowed columns, best first
        if cand.size == 0:
            return None
        lp = logprobs[cand]
        with np.errstate(over="ignore"):  # max first: a tiny temperature gives 0 or -inf
            scaled = (lp - lp.max()) / (o.temperature or 1.0)  # (greedy), never inf - inf
        probs = np.exp(scaled)
        probs /= probs.sum()
        if o.top_p is not None and o.top_p < 1.0:
            keep = int(np.searchsorted(np.cumsum(probs), o.top_p) + 1)
            probs = probs[:keep] / probs[:keep].sum()
        return int(cand[self.rng.choice(probs.size, p=probs)])


# -- language models: every live sequence's draw in a few array operations -----------------

_GAMMA = np.uint64(0x9E3779B97F4A7C15)
_M1, _M2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)
_S30, _S27, _S31, _S11 = (np.uint64(s) for s in (30, 27, 31, 11))
NUCLEUS_CANDIDATES = 64
"""Tokens a top-p row ranks first (a partition, not a sort of the vocabulary); a row whose
nucleus is larger is ranked whole."""


def _mix(z: np.ndarray) -> np.ndarray:
    """SplitMix64's output function (a bijection of uint64), elementwise."""
    z = (z ^ (z >> _S30)) * _M1
    z = (z ^ (z >> _S27)) * _M2
    return z ^ (z >> _S31)


def sequence_keys(seed: int, indices: np.ndarray) -> np.ndarray:
    """The random stream of sequence `indices` (int64) of a request seeded with `seed`: (n,)
    uint64 keys, a function of (seed, index) only."""
    base = _mix(np.array([seed % 2**64], dtype=np.uint64))
    return _mix(base + indices.astype(np.uint64))


def uniforms(keys: np.ndarray, drawn: np.ndarray) -> np.ndarray:
    """Each sequence's next uniform in [0, 1) (float64): SplitMix64's stream of its key at
    position `drawn` (tokens it drew before). Counter-based, so a sequence's draws depend on
    its key alone, never on what else is batched with it, and need no generator object."""
    state = keys + (drawn.astype(np.uint64) + np.uint64(1)) * _GAMMA
    return (_mix(state) >> _S11).astype(np.float64) * 2.0**-53


def sample(log_probs: np.ndarray, temperature: np.ndarray, top_k: np.ndarray,
           top_p: np.ndarray, u: np.ndarray) -> np.ndarray:
    """One token per row of log_probs (R, V): the argmax where temperature is 0, else the
    inverse CDF at `u` (R,) of the temperature-scaled distribution cut to its top_k tokens
    (0 = off) and to the smallest set of best tokens whose mass reaches top_p (1 = off).
    Float32, row by row independent (a row's token depends on its own values only): greedy
    rows take no sort, cut rows an argpartition of their k (or NUCLEUS_CANDIDATES) best.
    Returns (R,) int64."""
    r, v = log_probs.shape
    greedy = temperature <= 0
    if greedy.all():
        return log_probs.argmax(-1).astype(np.int64)
    tokens = np.zeros(r, dtype=np.int64)
    if greedy.any():
        tokens[greedy] = log_probs[greedy].argmax(-1)
    hot = np.flatnonzero(~greedy)
    lp = log_probs[hot] if hot.size < r else log_probs
    lp = lp.astype(np.float32, copy=False)
    inv_t = (1.0 / temperature[hot]).astype(np.float32)[:, None]  # (H, 1)
    scaled = (lp - lp.max(-1, keepdims=True)) * inv_t  # (H, V), 0 at each row's best
    probs = np.exp(scaled)
    k = top_k[hot]
    k = np.where((k > 0) & (k < v), k, v)
    p = top_p[hot]
    cut = (k < v) | (p < 1.0)
    full = np.flatnonzero(~cut)
    if full.size:  # the whole distribution, in vocabulary order
        c = np.cumsum(probs[full], -1)
        drawn = (c <= (u[hot[full]] * c[:, -1])[:, None]).sum(-1)
        tokens[hot[full]] = np.minimum(drawn, v - 1)
    if full.size < hot.size:
        rows = np.flatnonzero(cut)
        m = np.where(k[rows] < v, np.minimum(k[rows], v),
                     min(NUCLEUS_CANDIDATES, v))  # candidates each row ranks
        for size in np.unique(m).tolist():  # one partition per candidate count
            group = rows[m == size]
            ranked, ids = _ranked(scaled[group], size)
            mass = probs[group].sum(-1, keepdims=True)  # (G, 1) the whole row's
            more = _draw_ranked(tokens, hot[group], ranked, ids, mass, k[group], p[group],
                                u[hot[group]], size < k[group])
            if more.size:  # a nucleus past the candidates: rank those rows whole
                g = group[more]
                ranked, ids = _ranked(scaled[g], v)
                _draw_ranked(tokens, hot[g], ranked, ids, probs[g].sum(-1, keepdims=True),
                             k[g], p[g], u[hot[g]], np.zeros(g.size, dtype=bool))
    return tokens


def _ranked(scaled: np.ndarray, m: int) -> tuple[np.ndarray, np.ndarray]:
    """The m best (value, id) of each row, best first (ties by id)."""
    v = scaled.shape[1]
    if m >= v:
        ids = np.argsort(-scaled, axis=-1, kind="stable")
    else:
        part = np.argpartition(-scaled, m - 1, axis=-1)[:, :m]
        part.sort(axis=-1)  # ids ascending: ties rank by id whatever the partition did
        order = np.argsort(-np.take_along_axis(scaled, part, -1), axis=-1, kind="stable")
        ids = np.take_along_axis(part, order, -1)
    return np.take_along_axis(scaled, ids, -1), ids


def _draw_ranked(tokens: np.ndarray, at: np.ndarray, ranked: np.ndarray, ids: np.ndarray,
                 mass: np.ndarray, k: np.ndarray, p: np.ndarray, u: np.ndarray,
                 open_: np.ndarray) -> np.ndarray:
    """Draw rows `at` among their ranked candidates kept by top-k / top-p into `tokens`;
    returns the rows (positions in `at`) whose nucleus may extend past the candidates
    (`open_`: their top-k did not end the candidates), which are not drawn."""
    probs = np.exp(ranked)  # (G, m) unnormalised, best first
    upto = np.cumsum(probs, -1) / mass  # mass of the candidates up to each one
    before = upto - probs / mass  # mass ahead of each candidate
    m = ranked.shape[1]
    keep = (np.arange(m)[None, :] < k[:, None]) & (before < p[:, None])
    keep[:, 0] = True  # the best token always stays
    more = np.flatnonzero(open_ & keep[:, -1] & (upto[:, -1] < p))  # the next would stay
    w = np.cumsum(np.where(keep, probs, 0.0), -1)
    pick = np.minimum((w <= (u * w[:, -1])[:, None]).sum(-1), keep.sum(-1) - 1)
    chosen = ids[np.arange(len(at)), pick]
    done = np.ones(len(at), dtype=bool)
    done[more] = False
    tokens[at[done]] = chosen[done]
    return more


def top_arrays(log_probs: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The k most likely tokens of every row of log_probs (R, V), best first: their ids
    (R, k) int64 and log-probs (R, k), the rows' own values (ties by id)."""
    k = min(k, log_probs.shape[1])
    if k >= log_probs.shape[1]:
        part = np.broadcast_to(np.arange(k), log_probs.shape).copy()
    else:
        part = np.argpartition(-log_probs, k - 1, axis=-1)[:, :k]  # (R, k)
        part.sort(axis=-1)  # ids ascending: ties rank by id whatever the partition did
    vals = np.take_along_axis(log_probs, part, -1)
    order = np.argsort(-vals, axis=-1, kind="stable")
    return (np.take_along_axis(part, order, -1).astype(np.int64),
            np.take_along_axis(vals, order, -1))


def top_alternatives(log_probs: np.ndarray, k: int) -> list[tuple[tuple[int, float], ...]]:
    """The k most likely (token, log-prob) of every row, best first."""
    ids, vals = top_arrays(log_probs, k)
    return [tuple(zip(i.tolist(), v.tolist(), strict=True)) for i, v in zip(ids, vals,
                                                                             strict=True)]


def tuned(log_probs: np.ndarray, spans: Sequence[tuple[int, int, GenerateOptions]],
          counts: np.ndarray, eos_id: int) -> np.ndarray:
    """log_probs (N, V) as the draw sees them for the rows of `spans` (start, end, the
    request's options: its rows s:e), OpenAI's way, before temperature and cuts: the logit
    bias added; eos masked (ignore_eos); the penalties subtracted from the tokens each row
    already generated (`counts[i]`: token -> times): `frequency_penalty * times +
    presence_penalty`. A copy; the other rows unchanged. Since log_probs are logits less a
    row's constant, the draw (which normalises) is the one of the tuned logits."""
    out = log_probs.copy()
    v = out.shape[1]
    for s, e, o in spans:
        block = out[s:e]  # a view: changes land in `out`
        if o.logit_bias:
            ids = np.array([t for t, _ in o.logit_bias], dtype=np.int64)
            bias = np.array([b for _, b in o.logit_bias], dtype=out.dtype)
            inside = ids < v
            block[:, ids[inside]] += bias[inside]
        if o.presence_penalty or o.frequency_penalty:
            for i in range(s, e):
                seen: dict[int, int] | None = counts[i]
                if seen:
                    ids = np.fromiter(seen.keys(), dtype=np.int64, count=len(seen))
                    times = np.fromiter(seen.values(), dtype=out.dtype, count=len(seen))
                    out[i, ids] -= times * o.frequency_penalty + o.presence_penalty
        if o.ignore_eos and 0 <= eos_id < v:
            block[:, eos_id] = -np.inf
    return out
