"""What a translation request asks of the search, and the rules the search follows.

The options (`SearchOptions`), the model's limits (`DecodeLimits`), the length cap
(`max_steps`), the GNMT penalties and the answer (`Hypothesis`). The search itself runs for
every live request of a decode group at once, as array operations (`beam_search.Beams`); nothing in
it looks at another request's rows, so no request's result depends on its neighbours.

Conventions (the reference search in the tests follows the same ones):

- A hypothesis' length L counts its generated tokens, EOS included. `max_steps` bounds L; a
  live hypothesis that reaches it is finished as it is (truncated, no EOS).
- EOS is not allowed while fewer than `min_length` tokens were generated.
- Beam step (fairseq-style): from all candidates of all live rows of a request (after
  masking), take the 2B best by cumulative log-prob, ties to the lower (row, column); an EOS
  among the first B is finished; the first B non-EOS continue. `decoder_step` returns only
  each row's top-k (best first), so the scheduler asks for k = 2B + 1 + (most tokens any row
  has blocked), which contains every candidate that this rule can pick: the step is exact, as
  if the whole vocabulary had been scored.
- Final score (GNMT): logp / ((5 + L) / 6) ** alpha + beta * sum_j log(min(coverage_j, 1)),
  coverage_j the attention mass source token j received over the L steps (clipped at 1e-12).
- Stopping is exact: a request stops when it has n_best finished hypotheses and no live one
  can beat the n-th of them. Log-probs only decrease, and alpha >= 0, beta >= 0, so a live
  hypothesis with log-prob p <= 0 can at best reach p / lp(max_steps) + 0 (its longest
  descendant, full coverage). Stopping therefore never changes the n-best compared to running
  to max length. Finished hypotheses are ranked by score, ties to the one finished first.
- Hopeless hypotheses: the same bound, per hypothesis. Once a request's n-best is full, a
  candidate that would continue but whose bound does not beat the n-th finished score is
  dropped (not for sampling). No answer changes: the bound grows with the log-prob, so every
  candidate that may still enter ranks above every one that may not (and only descends from
  rows that may), the same candidates fill the first 2B places, finish and continue, and
  the request stops at the same step (when none that may enter is left). Only the rows that
  could never matter go: 7% of the row-steps on the demo's test split at beam 5.
- Sampling (beam 1): the candidate set is the row's top `top_k` tokens, or the top
  `SAMPLING_CANDIDATES` when `top_k` is not given (decoder_step returns top-k only), so
  `top_p` acts within that set. The sampled token is drawn from softmax(logp / temperature)
  restricted to the smallest prefix whose mass reaches `top_p`, with the request's own
  `numpy.random.Generator(seed)`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

MAX_BEAM_SIZE = 16
"""Largest beam a request may ask for (the schema's limit; settings keep the live-hypothesis
cap at or above it, so every valid request fits)."""

DEFAULT_BEAM_SIZE = 5
"""Beam width when a request gives none and sets no sampling option (then 1): the one place
this default is written (`SearchOptions` and the HTTP schema both read it)."""

SAMPLING_CANDIDATES = 50
"""Candidates per step for sampling when `top_k` is not given (decoder_step is top-k only)."""

LENGTH_SLACK = 10
"""Tokens added to the ratio cap, so that very short sources still get room."""

COVERAGE_FLOOR = 1e-12
"""Coverage below this is clipped before its log (an untouched source token is not -inf)."""


@dataclass(frozen=True)
class SearchOptions:
    """How one request is decoded. The HTTP schema (`seqserve.service.api.translate`) declares and
    checks every limit and combination, and takes its defaults from these (`DEFAULTS`); the
    search trusts what it is given."""

    beam_size: int = DEFAULT_BEAM_SIZE
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


DEFAULTS = SearchOptions()
"""Every search option's default: the one table the HTTP schema and the CLI read."""


@dataclass(frozen=True)
class DecodeLimits:
    """What the model fixes: special ids, vocabulary and its decode-length limit. No defaults:
    they are the bundle's (`models.decode_limits(manifest)` reads them)."""

    bos_id: int
    """First input token of every hypothesis."""
    eos_id: int
    """Token that ends a hypothesis."""
    vocab_size: int
    """Upper bound of k in decoder_step."""
    max_decode_length: int
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
