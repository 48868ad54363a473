"""Per-request search state for the translator decoding engine: pure logic over numpy.

One `RequestSearch` holds one request's live hypotheses (beam search, greedy = beam 1, or
sampling) and its finished ones. The engine feeds it the rows of one batched `decoder_step`
that belong to it; it answers which state rows survive. It never sees other requests, so its
result cannot depend on its neighbours.

Conventions (the reference search in the tests follows the same ones):

- A hypothesis' length L counts its generated tokens, EOS included. `max_steps` bounds L; a
  live hypothesis that reaches it is finished as it is (truncated, no EOS).
- EOS is not allowed while fewer than `min_length` tokens were generated.
- Beam step (fairseq-style): from all candidates of all live rows (after masking), take the
  2B best by cumulative log-prob; an EOS among the first B is finished; the first B non-EOS
  continue. `decoder_step` returns only each row's top-k, so the engine asks for
  k = 2B + 1 + (most tokens any row has blocked), which contains every candidate that this
  rule can pick: the step is exact, as if the whole vocabulary had been scored.
- Final score (GNMT): logp / ((5 + L) / 6) ** alpha + beta * sum_j log(min(coverage_j, 1)),
  coverage_j the attention mass source token j received over the L steps (clipped at 1e-12).
- Stopping is exact: a request stops when it has n_best finished hypotheses and no live one
  can beat the n-th of them. Log-probs only decrease, and alpha >= 0, beta >= 0, so a live
  hypothesis with log-prob p <= 0 can at best reach p / lp(max_steps) + 0 (its longest
  descendant, full coverage). Stopping therefore never changes the n-best compared to running
  to max length.
- Sampling (beam 1): the candidate set is the row's top `top_k` tokens, or the top
  `SAMPLING_CANDIDATES` when `top_k` is not given (decoder_step returns top-k only), so
  `top_p` acts within that set. The sampled token is drawn from softmax(logp / temperature)
  restricted to the smallest prefix whose mass reaches `top_p`, with the request's own
  `numpy.random.Generator(seed)`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

MAX_BEAM_SIZE = 16
"""Largest beam a request may ask for (the schema's limit; settings keep the live-hypothesis
cap at or above it, so every valid request fits)."""

SAMPLING_CANDIDATES = 50
"""Candidates per step for sampling when `top_k` is not given (decoder_step is top-k only)."""

LENGTH_SLACK = 10
"""Tokens added to the ratio cap, so that very short sources still get room."""

COVERAGE_FLOOR = 1e-12
"""Coverage below this is clipped before its log (an untouched source token is not -inf)."""


@dataclass(frozen=True)
class SearchOptions:
    """How one request is decoded. The HTTP schema (`service.api.translate`) declares and checks
    every limit and combination; the search trusts what it is given."""

    beam_size: int = 5
    """Hypotheses kept per step; 1 is greedy (or sampling when a sampling option is set)."""
    n_best: int = 1
    """Finished hypotheses returned, best first; at most `beam_size`."""
    max_length: int | None = None
    """Absolute cap on generated tokens (EOS included); None: the model's limit."""
    max_length_ratio: float | None = 2.0
    """Cap of ceil(ratio * source tokens) + LENGTH_SLACK generated tokens; None: off."""
    min_length: int = 0
    """Tokens (EOS excluded) to generate before EOS is allowed."""
    length_penalty: float = 0.0
    """GNMT alpha: scores are divided by ((5 + L) / 6) ** alpha; 0 disables."""
    coverage_penalty: float = 0.0
    """GNMT beta: adds beta * sum log(min(coverage, 1)); 0 disables."""
    no_repeat_ngram_size: int = 0
    """Forbid repeating any n-gram of this size within a hypothesis; 0 disables."""
    temperature: float | None = None
    """Sampling temperature; setting it (or top_k/top_p) turns sampling on."""
    top_k: int | None = None
    """Sample among the k most probable tokens."""
    top_p: float | None = None
    """Nucleus sampling mass, within the candidate set."""
    seed: int | None = None
    """Seed of the request's own random generator (sampling); None: fresh entropy."""
    return_attention: bool = False
    """Keep each hypothesis' attention rows (target x source) for the answer."""

    @property
    def sampling(self) -> bool:
        return self.temperature is not None or self.top_k is not None or self.top_p is not None


@dataclass(frozen=True)
class DecodeLimits:
    """What the model fixes: special ids, vocabulary and its decode-length limit."""

    bos_id: int = 2
    """First input token of every hypothesis."""
    eos_id: int = 3
    """Token that ends a hypothesis."""
    vocab_size: int = 8000
    """Upper bound of k in decoder_step."""
    max_decode_length: int = 128
    """The model's cap on generated tokens (manifest limits.max_decode_length)."""


def max_steps(options: SearchOptions, src_len: int, limits: DecodeLimits) -> int:
    """The request's cap on generated tokens (EOS included): the smallest cap in force."""
    cap = limits.max_decode_length
    if options.max_length is not None:
        cap = min(cap, options.max_length)
    if options.max_length_ratio is not None:
        cap = min(cap, math.ceil(options.max_length_ratio * src_len) + LENGTH_SLACK)
    return max(cap, 1)


def length_penalty(length: int, alpha: float) -> float:
    """GNMT length normaliser ((5 + L) / 6) ** alpha."""
    return ((5.0 + length) / 6.0) ** alpha if alpha else 1.0


def coverage_penalty(coverage: np.ndarray | None, beta: float) -> float:
    """GNMT coverage term beta * sum_j log(min(coverage_j, 1)) (<= 0)."""
    if not beta or coverage is None:
        return 0.0
    clipped = np.clip(coverage, COVERAGE_FLOOR, 1.0)
    return float(beta * np.log(clipped).sum())


@dataclass
class Hypothesis:
    """One hypothesis: generated ids (EOS included when it ended), log-prob, final score."""

    token_ids: tuple[int, ...]
    logprob: float
    score: float = 0.0
    ended: bool = False
    coverage: np.ndarray | None = None  # (S,) attention mass per source token
    attention: tuple[np.ndarray, ...] = ()  # L rows of (S,), only with return_attention

    def attention_matrix(self) -> np.ndarray | None:
        """(L, S) attention, one row per generated token (EOS included), or None."""
        return np.stack(self.attention) if self.attention else None


@dataclass
class RequestSearch:
    """The decoding state of one request. See the module doc for the exact rules."""

    options: SearchOptions
    src_len: int
    limits: DecodeLimits
    live: list[Hypothesis] = field(default_factory=list)
    finished: list[Hypothesis] = field(default_factory=list)
    steps: int = 0
    done: bool = False

    def __post_init__(self) -> None:
        self.max_steps = max_steps(self.options, self.src_len, self.limits)
        coverage = np.zeros(self.src_len) if self.options.coverage_penalty else None
        self.live = [Hypothesis((), 0.0, coverage=coverage)]
        self._rng = np.random.default_rng(self.options.seed)
        self._k_cache = (-1, 0)  # (steps, k) of the last k_needed()

    # -- what the engine asks -------------------------------------------------------------

    @property
    def rows(self) -> int:
        return len(self.live)

    def prev_ids(self) -> np.ndarray:
        """(rows,) int64: each live hypothesis' last token (BOS at the start)."""
        bos = self.limits.bos_id
        return np.array([h.token_ids[-1] if h.token_ids else bos for h in self.live], np.int64)

    def k_needed(self) -> int:
        """Top-k this request needs from the next decoder step (cached per step)."""
        if self._k_cache[0] == self.steps:
            return self._k_cache[1]
        o = self.options
        if o.sampling:
            k = o.top_k if o.top_k is not None else SAMPLING_CANDIDATES
        else:
            blocked = 0
            if o.no_repeat_ngram_size:
                blocked = max((len(self._banned(h)) for h in self.live), default=0)
            k = 2 * o.beam_size + 1 + blocked
        k = max(1, min(k, self.limits.vocab_size))
        self._k_cache = (self.steps, k)
        return k

    # -- one step -------------------------------------------------------------------------

    def step(self, logprobs: np.ndarray, ids: np.ndarray, attention: np.ndarray) -> np.ndarray:
        """Advance by one token. Inputs (rows, k') with k' >= k_needed() and (rows, S).

        Returns the parent row of every new live hypothesis, (rows_next,) int64, so the engine
        gathers the decoder state with it.
        """
        k = self.k_needed()
        logprobs = logprobs[:, :k].astype(np.float64)  # (R, k) own candidates only
        ids = ids[:, :k]  # (R, k)
        attention = attention[:, : self.src_len]  # (R, S)
        allowed = self._allowed(ids)  # (R, k) bool
        if self.options.sampling:
            parents = self._sample(logprobs, ids, allowed, attention)
        else:
            parents = self._beam(logprobs, ids, allowed, attention)
        self.steps += 1
        if self.steps >= self.max_steps:
            for hyp in self.live:
                self._finish(hyp)
            self.live, parents = [], parents[:0]
        self.done = self._should_stop()
        return parents

    def _allowed(self, ids: np.ndarray) -> np.ndarray | None:
        """(R, k) bool of candidates allowed, or None when all are."""
        if self.steps >= self.options.min_length and not self.options.no_repeat_ngram_size:
            return None
        allowed = np.ones(ids.shape, dtype=bool)  # (R, k)
        if self.steps < self.options.min_length:
            allowed &= ids != self.limits.eos_id
        if self.options.no_repeat_ngram_size:
            for r, hyp in enumerate(self.live):
                banned = self._banned(hyp)
                if banned:
                    allowed[r] &= ~np.isin(ids[r], list(banned))
        return allowed

    def _banned(self, hyp: Hypothesis) -> set[int]:
        """Tokens that would repeat an n-gram of `hyp` (no_repeat_ngram_size)."""
        n = self.options.no_repeat_ngram_size
        toks = hyp.token_ids
        if n <= 0 or len(toks) < n - 1:
            return set()
        if n == 1:
            return set(toks)
        prefix = toks[len(toks) - n + 1 :]
        return {toks[i + n - 1] for i in range(len(toks) - n + 1) if toks[i : i + n - 1] == prefix}

    def _beam(self, logprobs: np.ndarray, ids: np.ndarray, allowed: np.ndarray | None,
              attention: np.ndarray) -> np.ndarray:
        beam = self.options.beam_size
        base = np.array([h.logprob for h in self.live])  # (R,)
        total = base[:, None] + logprobs  # (R, k)
        if allowed is not None:
            total[~allowed] = -np.inf
        flat = total.ravel()  # (R * k,)
        order = np.argsort(-flat, kind="stable")[: 2 * beam]
        order = order[np.isfinite(flat[order])]  # masked (or -inf / NaN from the model)
        if order.size == 0:  # every candidate blocked: the hypotheses end here, truncated
            for hyp in self.live:
                self._finish(hyp)
            self.live = []
            return np.zeros(0, dtype=np.int64)
        eos = self.limits.eos_id
        rows = (order // ids.shape[1]).tolist()
        toks = ids.ravel()[order].tolist()
        totals = flat[order].tolist()
        new_live: list[Hypothesis] = []
        parents: list[int] = []
        for rank, (r, tok, logprob) in enumerate(zip(rows, toks, totals, strict=True)):
            if tok == eos:
                if rank < beam:
                    self._finish(self._extend(r, tok, logprob, attention), ended=True)
            elif len(new_live) < beam:
                new_live.append(self._extend(r, tok, logprob, attention))
                parents.append(r)
        self.live = new_live
        return np.array(parents, dtype=np.int64)

    def _sample(self, logprobs: np.ndarray, ids: np.ndarray, allowed: np.ndarray | None,
                attention: np.ndarray) -> np.ndarray:
        o = self.options
        # candidate columns, best first; none left (all blocked): the hypothesis ends here
        cand = np.arange(ids.shape[1]) if allowed is None else np.flatnonzero(allowed[0])
        cand = cand[np.isfinite(logprobs[0, cand])]
        if cand.size == 0:
            self._finish(self.live[0])
            self.live = []
            return np.zeros(0, dtype=np.int64)
        lp = logprobs[0, cand]
        with np.errstate(over="ignore"):  # max first: a tiny temperature gives 0 or -inf
            scaled = (lp - lp.max()) / (o.temperature or 1.0)  # (greedy), never inf - inf
        probs = np.exp(scaled)
        probs /= probs.sum()
        if o.top_p is not None and o.top_p < 1.0:
            keep = int(np.searchsorted(np.cumsum(probs), o.top_p) + 1)
            probs = probs[:keep] / probs[:keep].sum()
        j = int(cand[self._rng.choice(probs.size, p=probs)])
        tok = int(ids[0, j])
        hyp = self._extend(0, tok, self.live[0].logprob + float(logprobs[0, j]), attention)
        if tok == self.limits.eos_id:
            self._finish(hyp, ended=True)
            self.live = []
            return np.zeros(0, dtype=np.int64)
        self.live = [hyp]
        return np.zeros(1, dtype=np.int64)

    def _extend(self, row: int, tok: int, logprob: float, attention: np.ndarray) -> Hypothesis:
        parent = self.live[row]
        coverage = None if parent.coverage is None else parent.coverage + attention[row]
        attn = parent.attention + (attention[row].copy(),) if self.options.return_attention else ()
        return Hypothesis(parent.token_ids + (tok,), logprob, coverage=coverage, attention=attn)

    # -- finishing and stopping -----------------------------------------------------------

    def _finish(self, hyp: Hypothesis, ended: bool = False) -> None:
        o = self.options
        hyp.ended = ended
        hyp.score = hyp.logprob / length_penalty(len(hyp.token_ids), o.length_penalty)
        hyp.score += coverage_penalty(hyp.coverage, o.coverage_penalty)
        self.finished.append(hyp)
        self.finished.sort(key=lambda h: -h.score)  # stable: earlier wins ties
        del self.finished[o.n_best :]

    def best_possible(self, hyp: Hypothesis) -> float:
        """Upper bound on the final score of any descendant of live `hyp`."""
        return min(hyp.logprob, 0.0) / length_penalty(self.max_steps, self.options.length_penalty)

    def _should_stop(self) -> bool:
        if not self.live:
            return True
        if self.options.sampling or len(self.finished) < self.options.n_best:
            return False
        worst = self.finished[-1].score
        return all(self.best_possible(h) <= worst for h in self.live)

    def results(self) -> list[Hypothesis]:
        """The n-best finished hypotheses, best first (call once `done`)."""
        return list(self.finished)
