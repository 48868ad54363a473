"""The calling side of the compiled step of the vectorised beam search (`_beam_kernel`, built
from native/beam/beam_kernel.c by native/beam/build.sh), where it is built.

Two calls a step, on the search's own arrays: `select` (the masked cumulative log-probs and
each request's 2B best candidates: `Beams._masked` + `Beams._select`) and `advance` (finish,
score, merge into the n-best, stop and extend: `Beams._advance`). Between them the sampling
requests patch the selection in Python (`Beams._sample`), as in the numpy step. And one call
for each membership change: `join` (the new requests' numbers made per request in Python,
`BeamState.admitted`) and `keep`, each the new arrays of the state at once, the history
widths fitted as `BeamState._reshape` fits them.

What stays in numpy here: the n-gram bans become an (R, k) mask (only where a request asks
for them), and the coverage term of the score (beta x the sum of the logs of the clipped
coverage, only where a row's request has beta > 0) is computed for every row as numpy
computes it, so that the kernel's scores equal the numpy step's bit for bit (numpy's log and
pairwise sum are not libm's and a loop's). The pool of finished hypotheses is grown here
before `advance`, which only writes into it.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from seqserve.service.scheduling.arrays import banned_mask
from seqserve.service.scheduling.beam_state import BeamState, Requests, Rows
from seqserve.service.scheduling.kernel import loaded
from seqserve.service.scheduling.search import COVERAGE_FLOOR

_kernel: Any = loaded("select", "advance", "join", "keep")  # None: the numpy step only

AVAILABLE = _kernel is not None
"""Whether the compiled module imports."""

STEP = "compiled (native/beam)" if AVAILABLE else \
    "numpy (the compiled step is not built: native/beam/build.sh)"
"""Which step the search takes where nothing asks for one, for the start-up log."""

Bans = list[tuple[np.ndarray, np.ndarray, np.ndarray]]


def select(state: BeamState, logprobs: np.ndarray, ids: np.ndarray, k: int,
           bans: Bans) -> tuple[np.ndarray, ...]:
    """(neg (R, k), row, tok, val, valid (Q, C), starts (Q,)): the masked negated cumulative
    log-probs and the selection, as `Beams._masked` and `Beams._select` make them."""
    ban = None
    if bans:
        ban = np.zeros((len(ids), k), bool)  # (R, k)
        for at, banned, ok in bans:
            ban[at] = banned_mask(ids[at, :k], banned, ok)
    r = state.rows
    result: tuple[np.ndarray, ...] = _kernel.select(
        r.logp, logprobs, ids, r.request, state.reqs.ints, k, state.limits.eos_id, ban)
    return result


def advance(state: BeamState, row: np.ndarray, tok: np.ndarray, val: np.ndarray,
            valid: np.ndarray, attention: np.ndarray) -> np.ndarray:
    """`Beams._advance` on the selection (Q, C): counts the step, merges the finished ones
    into the n-best, sets `state.done` and the new rows; returns the parents (R',)."""
    r, f = state.rows, state.finished
    terms = stuck = None
    if r.coverage.shape[1]:
        terms, stuck = _coverage_terms(state, attention, valid)
    f.reserve(valid.size)  # a request finishes at most C = 2 B_max a step
    p = f.pool
    parents, request, logp, last, tokens, coverage, history, done, used = _kernel.advance(
        row, tok, val, valid, state.reqs.ints, r.request, r.logp, r.tokens, r.coverage,
        r.attention, attention, state._lp, state.limits.eos_id, f.index, f.score, p.score,
        p.logp, p.length, p.ended, p.tokens, p.coverage, p.attention, f.used, terms, stuck)
    f.used = used
    state.done = done
    state.rows = Rows(request, logp, last, tokens, coverage, history)
    return parents  # type: ignore[no-any-return]


def _coverage_terms(state: BeamState, attention: np.ndarray,
                    valid: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
    """(R,) coverage term of every row extended by this step's attention row, and (R,) that
    of every row as it is where some request has no allowed candidate (else None): 0 where
    its request has beta = 0, else numpy's beta * sum(log(clip(coverage))) over its source."""
    q, r = state.reqs, state.rows
    beta = q.beta[r.request]  # (R,)
    at = np.flatnonzero(beta > 0)  # (Rc,)
    extended = np.zeros(len(r))
    stuck = None if valid.any(1).all() else np.zeros(len(r))
    if len(at):
        src = q.src_len[r.request[at]]  # (Rc,)
        coverage = r.coverage[at]  # (Rc, Sc)
        if stuck is not None:
            stuck[at] = beta[at] * _log_sum(coverage, src)
        att = attention[at]  # (Rc, S)
        coverage[:, : att.shape[1]] += att
        extended[at] = beta[at] * _log_sum(coverage, src)
    return extended, stuck


def _log_sum(coverage: np.ndarray, src: np.ndarray) -> np.ndarray:
    """(F,) sum of log(clip(coverage)) over each row's first src columns, as `_score`."""
    logs = np.log(np.clip(coverage, COVERAGE_FLOOR, 1.0))  # (F, Sc)
    logs[np.arange(logs.shape[1])[None] >= src[:, None]] = 0.0
    return logs.sum(1)  # type: ignore[no-any-return]


def join(state: BeamState, ints: np.ndarray, beta: np.ndarray) -> None:
    """`BeamState.join`'s arrays (with `_reshape`) in one call: requests ints (n, 13) and
    beta (n,) (`BeamState.admitted`) join at the end, one BOS row each."""
    r, f = state.rows, state.finished
    _install(state, _kernel.join(
        state.reqs.ints, state.reqs.beta, r.request, r.logp, r.last, r.tokens, r.coverage,
        r.attention, f.index, f.score, state.done, ints, beta, state.limits.bos_id,
        state._source_width))


def keep(state: BeamState, mask: np.ndarray) -> None:
    """`BeamState.keep`'s arrays (with `_reshape` where it runs) in one call (the samplers
    are the caller's)."""
    r, f = state.rows, state.finished
    _install(state, _kernel.keep(
        state.reqs.ints, state.reqs.beta, r.request, r.logp, r.last, r.tokens, r.coverage,
        r.attention, f.index, f.score, state.done, mask, state._source_width))


def _install(state: BeamState, arrays: tuple[np.ndarray, ...]) -> None:
    """The state the kernel's join / keep made; the pool's widths follow the rows'."""
    ints, beta, request, logp, last, tokens, coverage, attention, index, score, done = arrays
    state.reqs, state.done = Requests(ints, beta), done
    state.rows = Rows(request, logp, last, tokens, coverage, attention)
    f = state.finished
    f.index, f.score = index, score
    p, widths = f.pool, (tokens.shape[1], coverage.shape[1], attention.shape[1:])
    if (p.tokens.shape[1], p.coverage.shape[1], p.attention.shape[1:]) != widths:
        f.reshape(f.slots, tokens.shape[1], coverage.shape[1], (attention.shape[1],
                                                                attention.shape[2]))
