"""Sampling (beam 1): the one per-request part of a decode step.

Each sampling request draws from its own `numpy.random.Generator(seed)`, so its draw cannot
be batched with other requests' without changing what a seed gives. Everything else about a
sampling request (masks, finishing, length cap) goes through the vectorised step with the
beam requests; only the draw below runs once per sampling request per step.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from seqserve.service.scheduling.search import SAMPLING_CANDIDATES, SearchOptions


def sampling_k(options: SearchOptions) -> int:
    """Candidates a sampling request needs from decoder_step (before the vocabulary cap)."""
    return options.top_k if options.top_k is not None else SAMPLING_CANDIDATES


@dataclass
class Sampler:
    """One sampling request's draw (see beam.py for the rule)."""

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
