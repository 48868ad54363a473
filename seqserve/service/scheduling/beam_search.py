"""The beam search of every request of a decode group, one vectorised pass per step.

State: one entry per request (`Requests`, Q of them, in the group's order), one row per live
hypothesis (`Rows`, R of them, grouped by request in the same order) and each request's
finished n-best (`FinishedStore`). A step takes the decoder's top-k of every row and, for all
requests at once:

1. candidates: cumulative log-prob of every (row, k) pair; EOS before `min_length` and
   n-gram repeats masked to -inf;
2. selection: each request's candidates padded to (Q, B_max x k) and its 2B best taken along
   the last axis (`top_k_rows`: exact, ties to the lower row and column);
3. EOS among the first B finish, the first B non-EOS continue; a request with no allowed
   candidate finishes its hypotheses as they are; the length cap finishes the rest;
4. finished ones are scored (length and coverage penalties) and merged into the n-best
   (finished.py);
5. the exact stopping rule marks requests `done` (from each request's best live candidate);
6. the candidates that stay live become the new rows: only their histories are copied, and
   a request that stopped keeps none.

The rules are documented in search.py. The only per-request Python in a step is the draw of a
sampling request (sampling.py); admission (`join`) and answers (`results`) are per request by
nature.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from seqserve.service.scheduling import beam_native
from seqserve.service.scheduling.arrays import (
    banned_mask,
    distinct_count,
    ngram_bans,
    segment_max,
    top_k_rows,
)
from seqserve.service.scheduling.beam_state import BeamState, Rows
from seqserve.service.scheduling.finished import Entries
from seqserve.service.scheduling.search import COVERAGE_FLOOR, DecodeLimits, SearchOptions


@dataclass
class _Plan:
    """What the next step needs, fixed before it runs: k and the n-gram bans."""

    k: int
    k_own: np.ndarray  # (Q,) each request's own k
    bans: list[tuple[np.ndarray, np.ndarray, np.ndarray]]  # (rows, banned, ok) per n


@dataclass
class _Selection:
    """Each request's 2B_max best candidates, best first: (Q, C) arrays."""

    row: np.ndarray  # parent row
    tok: np.ndarray
    val: np.ndarray  # cumulative log-prob
    valid: np.ndarray  # bool: a real, allowed candidate within the request's 2B
    starts: np.ndarray  # (Q,) first row of each request


class Beams(BeamState):
    """See module doc. `join` requests, then per step `prepare` (k), `step`, read `done`,
    `results` of the done ones and `keep` the others.

    `kernel`: step with the compiled update (beam_native.py, native/beam), the same results
    in two calls, and join / keep with the compiled membership change (one call each, the
    widths' reshape included); None: where it is built; False: the numpy code below and
    BeamState's (the reference)."""

    def __init__(self, limits: DecodeLimits, kernel: bool | None = None) -> None:
        super().__init__(limits)
        self._plan: _Plan | None = None
        if kernel and not beam_native.AVAILABLE:
            raise RuntimeError("the beam kernel is not built (native/beam/build.sh)")
        self.kernel = beam_native.AVAILABLE if kernel is None else kernel

    def join(self, keys: Sequence[int], options: Sequence[SearchOptions],
             src_lens: Sequence[int]) -> None:
        if not self.kernel:
            return super().join(keys, options, src_lens)
        beam_native.join(self, *self.admitted(keys, options, src_lens))
        self._plan = None

    def keep(self, mask: np.ndarray) -> None:
        if not self.kernel:
            return super().keep(mask)
        self._drop_samplers(mask)
        beam_native.keep(self, mask)
        self._plan = None

    def _membership_changed(self, joined: bool) -> None:
        self._plan = None
        super()._membership_changed(joined)

    # -- what the scheduler asks before a step -----------------------------------------

    def prepare(self) -> int:
        """Fix the next step's n-gram bans; the top-k it needs (every request's own k is
        exact for it, and a larger k changes nothing for a beam request: see search.py)."""
        q = self.reqs
        bans: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        k_own = q.k_base
        if q.ngram.any():
            most, bans = self._bans()  # (Q,) most tokens a row of each request has banned
            k_own = q.k_base + np.where(q.sampling, 0, most)
        k_own = np.minimum(k_own, self.limits.vocab_size)  # (Q,) (k_base >= 1)
        self._plan = _Plan(int(k_own.max()), k_own, bans)
        return self._plan.k

    def _bans(self) -> tuple[np.ndarray, list[tuple[np.ndarray, np.ndarray, np.ndarray]]]:
        q, r = self.reqs, self.rows
        lengths = q.steps[r.request]  # (R,)
        blocked = np.zeros(len(r))
        bans = []
        for n in np.unique(q.ngram[q.ngram > 0]).tolist():
            at = np.flatnonzero(q.ngram[r.request] == n)  # (Rn,)
            banned, ok = ngram_bans(r.tokens[at], lengths[at], n)  # (Rn, P)
            blocked[at] = distinct_count(banned, ok)
            bans.append((at, banned, ok))
        return np.maximum(segment_max(blocked, r.request, len(q)), 0).astype(np.int64), bans

    # -- one step -------------------------------------------------------------------------

    def step(self, logprobs: np.ndarray, ids: np.ndarray, attention: np.ndarray) -> np.ndarray:
        """Advance every request by one token. Inputs (R, k') with k' >= `prepare()`'s k,
        attention (R, S). Returns the parent row of every new live row, (R',) int64."""
        plan = self._plan or self._prepared()
        self._plan = None
        if self.kernel:
            return self._step_compiled(logprobs, ids, attention, plan)
        lp = logprobs[:, : plan.k]  # (R, k) float32
        ids = ids[:, : plan.k]  # (R, k)
        # cumulative log-probs, negated (smallest first): -(logp + lp) exactly, in float64;
        # NaN needs no care (it sorts after +inf and is never valid)
        neg = np.subtract(-self.rows.logp[:, None], lp, dtype=np.float64)  # (R, k)
        sel = self._select(self._masked(neg, ids, plan), ids)
        if self.samplers:
            self._sample(sel, neg, ids, lp, plan)
        return self._advance(sel, attention)

    def _step_compiled(self, logprobs: np.ndarray, ids: np.ndarray, attention: np.ndarray,
                       plan: _Plan) -> np.ndarray:
        """`step` in two compiled calls (beam_native.py), the sampling draws between them."""
        neg, *arrays = beam_native.select(self, logprobs, ids, plan.k, plan.bans)
        sel = _Selection(*arrays)
        if self.samplers:
            self._sample(sel, neg, ids[:, : plan.k], logprobs[:, : plan.k], plan)
        return beam_native.advance(self, sel.row, sel.tok, sel.val, sel.valid, attention)

    def _prepared(self) -> _Plan:
        self.prepare()
        assert self._plan is not None
        return self._plan

    def _masked(self, neg: np.ndarray, ids: np.ndarray, plan: _Plan) -> np.ndarray:
        """Forbidden candidates (EOS before min_length, n-gram repeats) set to +inf."""
        q, r = self.reqs, self.rows
        early = (q.steps < q.min_length)[r.request]  # (R,)
        if early.any():
            neg[early[:, None] & (ids == self.limits.eos_id)] = np.inf
        for at, banned, ok in plan.bans:
            sub = neg[at]  # (Rn, k)
            sub[banned_mask(ids[at], banned, ok)] = np.inf
            neg[at] = sub
        return neg

    def _select(self, neg: np.ndarray, ids: np.ndarray) -> _Selection:
        """Per request, its 2B best candidates: one top-k along (Q, B_max x k)."""
        q, r = self.reqs, self.rows
        n_req, n_rows, k = len(q), len(r), neg.shape[1]
        counts = np.bincount(r.request, minlength=n_req)  # (Q,)
        starts = np.cumsum(counts) - counts  # (Q,)
        width = int(counts.max())
        c = 2 * int(q.beam.max())
        if n_rows == n_req * width:  # every request has `width` rows: no padding
            cand = neg.reshape(n_req, width * k)  # (Q, B * k)
        else:
            cand = np.full((n_req * width, k), np.inf)  # (Q * B, k)
            cand[r.request * width + np.arange(n_rows) - starts[r.request]] = neg
            cand = cand.reshape(n_req, width * k)  # (Q, B * k)
        if cand.shape[1] < c:  # fewer candidates than 2B: pad with never-valid ones
            cand = np.pad(cand, ((0, 0), (0, c - cand.shape[1])), constant_values=np.inf)
        order = top_k_rows(cand, c)  # (Q, C) best first
        val = -cand[np.arange(n_req)[:, None], order]  # (Q, C) cumulative log-probs
        valid = np.isfinite(val) & (np.arange(c)[None] < 2 * q.beam[:, None])  # (Q, C)
        row = np.minimum(starts[:, None] + order // k, n_rows - 1)  # (Q, C)
        col = order % k  # (Q, C)
        return _Selection(row, ids[row, col], val, valid, starts)

    def _sample(self, sel: _Selection, neg: np.ndarray, ids: np.ndarray, lp: np.ndarray,
                plan: _Plan) -> None:
        """Sampling requests (beam 1): their drawn token replaces the selection."""
        for q in np.flatnonzero(self.reqs.sampling).tolist():
            row, k = int(sel.starts[q]), int(plan.k_own[q])
            total = -neg[row, :k]  # (k,) cumulative log-probs, -inf where masked
            j = self.samplers[int(self.reqs.key[q])].draw(total, lp[row, :k].astype(np.float64))
            sel.valid[q] = False
            if j is not None:
                sel.row[q, 0], sel.tok[q, 0], sel.val[q, 0] = row, ids[row, j], total[j]
                sel.valid[q, 0] = True

    def _advance(self, sel: _Selection, attention: np.ndarray) -> np.ndarray:
        """Finish, stop and extend, from the selection (Q, C). Only the rows that stay live
        are copied (the finished ones are few); a request that stops keeps no rows."""
        q, beam = self.reqs, self.reqs.beam[:, None]  # (Q, 1)
        eos = sel.valid & (sel.tok == self.limits.eos_id)  # (Q, C)
        cont = sel.valid ^ eos  # (Q, C) valid and not EOS
        cont &= np.cumsum(cont, 1) <= beam  # the first B non-EOS continue
        ended = eos & (np.arange(eos.shape[1]) < beam)  # EOS among the first B finish
        stuck = np.logical_not(sel.valid.any(1))  # (Q,) nothing allowed: end as they are
        q.count_step()
        going = cont & (q.steps < q.max_steps)[:, None]  # (Q, C) the others reach the cap
        capped = cont ^ going
        if (ended | capped).any() or stuck.any():
            self._finish(sel, (stuck, ended, capped), attention)
        going &= self._hopeful(sel.val)  # the others can no longer reach the n-best
        self.done = self._stopped(going, sel.val)  # (Q,)
        at, col = np.nonzero(going & np.logical_not(self.done)[:, None])  # (R',) by request
        parents = sel.row[at, col]  # (R',)
        self.rows = self._extend(parents, sel.tok[at, col], sel.val[at, col], attention)
        return parents

    def _extend(self, parents: np.ndarray, tok: np.ndarray, logp: np.ndarray,
                attention: np.ndarray) -> Rows:
        """New hypotheses: each parent row extended by its token (and attention row)."""
        r = self.rows
        request = r.request[parents]  # (E,)
        steps = self.reqs.steps[request] - 1  # (E,) tokens before this one
        at = np.arange(len(parents))
        tokens = r.tokens[parents]  # (E, W)
        tokens[at, steps] = tok
        coverage, history = r.coverage[parents], r.attention[parents]  # (E, Sc), (E, Wa, Sa)
        if coverage.shape[1] or history.shape[1]:
            att = attention[parents]  # (E, S), S <= Sc, Sa
            if coverage.shape[1]:
                coverage[:, : att.shape[1]] += att
            if history.shape[1]:
                history[at, steps, : att.shape[1]] = att
        return Rows(request, logp, tok.astype(np.int64, copy=False), tokens, coverage, history)

    def _finish(self, sel: _Selection, masks: tuple[np.ndarray, np.ndarray, np.ndarray],
                attention: np.ndarray) -> None:
        """Score finished hypotheses and merge them into their requests' n-best, in this
        order within a request: the rows of a request with nothing allowed (as they are),
        EOS ones, those cut at the length cap; each in rank order."""
        stuck, ended, capped = masks  # (Q,), (Q, C), (Q, C)
        q, worst = self.reqs, self.finished.worst(self.reqs.n_best)  # (Q,)
        parts = []
        if stuck.any():
            rows = self.rows.take(stuck[self.rows.request])
            parts.append((rows, q.steps[rows.request] - 1, False))
        for mask, is_eos in ((ended, True), (capped, False)):
            at, col = np.nonzero(mask)  # (F,) by request, best first
            # logp / lp(L) bounds the score (the coverage term is <= 0): most cannot enter
            hope = sel.val[at, col] / self._lp[q.alpha[at], q.steps[at]] > worst[at]
            at, col = at[hope], col[hope]
            if len(at):
                rows = self._extend(sel.row[at, col], sel.tok[at, col], sel.val[at, col],
                                    attention)
                parts.append((rows, q.steps[at], is_eos))
        if not parts:
            return
        rows = parts[0][0].concat(*(p[0] for p in parts[1:]))  # (F,)
        length = np.concatenate([p[1] for p in parts])  # (F,)
        ended_flags = np.repeat([p[2] for p in parts], [len(p[0]) for p in parts])  # (F,)
        score = self._score(rows, length)  # (F,)
        # one that does not beat a full n-best's last cannot enter it (earlier wins ties)
        order = np.flatnonzero(score > worst[rows.request])
        if len(parts) > 1:  # by request; the parts' order stays within a request
            order = order[np.argsort(rows.request[order], kind="stable")]
        entries = Entries(score, rows.logp, length, ended_flags, rows.tokens, rows.coverage,
                          rows.attention).take(order)
        self.finished.merge(rows.request[order], entries, self.reqs.n_best)

    def _score(self, rows: Rows, length: np.ndarray) -> np.ndarray:
        """GNMT score of finished hypotheses (F,): logp / lp(L) + beta * coverage term."""
        q = self.reqs
        score = rows.logp / self._lp[q.alpha[rows.request], length]  # (F,)
        if rows.coverage.shape[1]:
            logs = np.log(np.clip(rows.coverage, COVERAGE_FLOOR, 1.0))  # (F, Sc)
            src = q.src_len[rows.request]  # (F,)
            logs[np.arange(logs.shape[1])[None] >= src[:, None]] = 0.0
            beta = q.beta[rows.request]  # (F,)
            score = score + np.where(beta > 0, beta * logs.sum(1), 0.0)
        return score

    def bounds(self) -> np.ndarray:
        """(R,) upper bound on the final score of any descendant of each live row."""
        q, r = self.reqs, self.rows
        return np.minimum(r.logp, 0.0) / self._lp[q.alpha, q.max_steps][r.request]

    def _hopeful(self, val: np.ndarray) -> np.ndarray:
        """(Q, C) which candidates of log-probs `val` may still enter their request's n-best:
        those whose bound (`bounds`) beats its n-th finished hypothesis, and every candidate of
        a sampling request. The others are dropped (search.py: "Hopeless hypotheses"), which
        changes no answer: a candidate that may still enter ranks above every one that may
        not, so the same ones are chosen, finish and continue, and the request stops at the
        same step."""
        q = self.reqs
        bound = np.minimum(val, 0.0) / self._lp[q.alpha, q.max_steps][:, None]  # (Q, C)
        worst = self.finished.worst(q.n_best)[:, None]  # (Q, 1)
        return np.logical_not(bound <= worst) | q.sampling[:, None]  # type: ignore[no-any-return]

    def _stopped(self, going: np.ndarray, val: np.ndarray) -> np.ndarray:
        """Exact stopping, given the live candidates going (Q, C) and their log-probs val:
        none left, or (beam) n_best finished and the best live one's bound (a bound grows
        with the log-prob) does not beat the n-th."""
        q = self.reqs
        best = val[np.arange(len(q)), going.argmax(1)]  # (Q,) first = best live candidate
        bound = np.minimum(best, 0.0) / self._lp[q.alpha, q.max_steps]  # (Q,)
        stop = np.logical_not(q.sampling) & (bound <= self.finished.worst(q.n_best))
        return np.logical_not(going.any(1)) | stop
