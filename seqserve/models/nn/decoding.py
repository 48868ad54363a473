"""Eager reference decoding: greedy and beam search as pure functions of a translator.

They use only `model.encode` and `model.decode_step` (the two exported graphs), so the export
parity tests and the serving engine compare against exactly this. Each request's result is
independent of its batch neighbours: rows never share state and each request has its own
stopping rule and length limit (derived from its own source length).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch import Tensor


class StepModel(Protocol):
    """What decoding needs from a translator (the eager `Translator` satisfies it)."""

    @property
    def config(self) -> Any: ...

    def encode(self, src_ids: Tensor, src_lengths: Tensor) -> tuple[Tensor, Tensor, Tensor]: ...

    def decode_step(self, prev_ids: Tensor, state: Tensor, memory: Tensor, src_mask: Tensor,
                    memory_index: Tensor, k: int | Tensor
                    ) -> tuple[Tensor, Tensor, Tensor, Tensor]: ...


@dataclass(frozen=True)
class BeamHypothesis:
    """A finished beam hypothesis: tokens without bos/eos, summed log-prob, ranking score."""

    tokens: list[int]
    logprob: float
    score: float


def max_decode_length(src_length: int, cap: int, ratio: float = 2.0, extra: int = 10) -> int:
    """Per-request decode limit: ratio * source length + extra, at most cap."""
    return max(1, min(cap, int(ratio * src_length) + extra))


GNMT_BEAM_SIZE, GNMT_ALPHA = 4, 0.6
"""The eager reference search's defaults are GNMT's published setting (beam 4, alpha 0.6),
for comparisons with the literature; they are named apart from the server's request defaults
(service/scheduling/search.py: beam 5, alpha 0), what a request that asks for nothing gets,
and training evaluates with the beam and penalty it is given."""


def gnmt_length_penalty(length: int, alpha: float) -> float:
    """GNMT length penalty ((5 + length) / 6) ** alpha (alpha 0 = plain log-prob)."""
    return ((5.0 + length) / 6.0) ** alpha


def _special_ids(model: StepModel) -> tuple[int, int, int]:
    cfg = model.config
    return int(cfg.bos_id), int(cfg.eos_id), int(cfg.max_length)  # type: ignore[attr-defined]


@torch.no_grad()
def greedy_decode(model: StepModel, src_ids: Tensor, src_lengths: Tensor,
                  max_len: int | None = None) -> list[list[int]]:
    """Greedy decoding of a right-padded batch.

    Inputs:  src_ids (B, S) int64, src_lengths (B,) int64; max_len caps every row (default:
             `max_decode_length` of each row's own source length and the model's max_length).
    Outputs: B token lists without bos/eos.
    """
    bos, eos, cap = _special_ids(model)
    memory, src_mask, state = model.encode(src_ids, src_lengths)
    rows = src_ids.shape[0]
    limits = [max_len or max_decode_length(int(n), cap) for n in src_lengths.tolist()]
    memory_index = torch.arange(rows, device=src_ids.device)  # (B,)
    prev = torch.full((rows,), bos, dtype=torch.long, device=src_ids.device)  # (B,)
    outputs: list[list[int]] = [[] for _ in range(rows)]
    done = [False] * rows
    for step in range(max(limits)):
        state, _, top_ids, _ = model.decode_step(prev, state, memory, src_mask, memory_index, 1)
        prev = top_ids[:, 0]  # (B,)
        for row, token in enumerate(prev.tolist()):
            if done[row]:
                continue
            if token == eos:
                done[row] = True
            else:
                outputs[row].append(token)
                done[row] = step + 1 >= limits[row]
        if all(done):
            break
    return outputs


@dataclass
class _Beam:
    """Live and finished hypotheses of one request."""

    request: int
    limit: int
    alpha: float
    tokens: list[list[int]]
    logprobs: list[float]
    finished: list[BeamHypothesis]

    def finish(self, tokens: list[int], logprob: float) -> None:
        score = logprob / gnmt_length_penalty(len(tokens), self.alpha)
        self.finished.append(BeamHypothesis(tokens, logprob, score))

    def done(self, beam_size: int) -> bool:
        """No live hypothesis can still enter the best beam_size finished ones: log-probs only
        fall, and the length penalty is largest at the limit."""
        if not self.tokens:
            return True
        if len(self.finished) < beam_size:
            return False
        kth = sorted((h.score for h in self.finished), reverse=True)[beam_size - 1]
        best_live = max(self.logprobs) / gnmt_length_penalty(self.limit, self.alpha)
        return best_live <= kth


@torch.no_grad()
def beam_search(model: StepModel, src_ids: Tensor, src_lengths: Tensor,
                beam_size: int = GNMT_BEAM_SIZE, n_best: int = 1,
                length_penalty: float = GNMT_ALPHA,
                max_len: int | None = None) -> list[list[BeamHypothesis]]:
    """Beam search over a batch; every hypothesis row points at its request's memory.

    Each step keeps beam_size live hypotheses per request; an eos candidate ranked inside the
    top beam_size finishes. A request stops when no live hypothesis can beat its beam_size-th
    finished score, or at its length limit.

    Inputs:  src_ids (B, S), src_lengths (B,); beam_size k; n_best results per request;
             length_penalty alpha of GNMT; max_len as in `greedy_decode`.
    Outputs: per request, up to n_best hypotheses, best first (score = logprob / lp(len)).
    """
    bos, eos, cap = _special_ids(model)
    memory, src_mask, state = model.encode(src_ids, src_lengths)
    beams = [_Beam(i, max_len or max_decode_length(int(n), cap), length_penalty, [[]], [0.0], [])
             for i, n in enumerate(src_lengths.tolist())]
    state_rows = list(range(len(beams)))  # row of `state` behind each live hypothesis
    step = 0
    while live := [b for b in beams if b.tokens]:
        prev = [(h[-1] if h else bos) for b in live for h in b.tokens]
        memory_index = [b.request for b in live for _ in b.tokens]
        state, top_lp, top_ids, _ = model.decode_step(
            torch.tensor(prev), state[torch.tensor(state_rows)], memory, src_mask,
            torch.tensor(memory_index), beam_size)
        state_rows, row, step = [], 0, step + 1
        for beam in live:
            width = len(beam.tokens)
            kept = _advance(beam, top_lp[row : row + width].tolist(),
                            top_ids[row : row + width].tolist(), beam_size, eos, step)
            state_rows.extend(row + parent for parent in kept)
            row += width
    return [sorted(b.finished, key=lambda h: h.score, reverse=True)[:n_best] for b in beams]


def _advance(beam: _Beam, logprobs: list[list[float]], ids: list[list[int]], beam_size: int,
             eos: int, step: int) -> list[int]:
    """Extend one request's beam by a step; returns the parent row of each live hypothesis."""
    candidates = sorted(
        ((beam.logprobs[p] + lp, p, tok) for p in range(len(beam.tokens))
         for lp, tok in zip(logprobs[p], ids[p], strict=True)),
        key=lambda c: c[0], reverse=True)
    tokens: list[list[int]] = []
    scores: list[float] = []
    parents: list[int] = []
    for rank, (total, parent, tok) in enumerate(candidates):
        if len(tokens) == beam_size:
            break
        if tok == eos:
            if rank < beam_size:
                beam.finish(beam.tokens[parent], total)
            continue
        tokens.append([*beam.tokens[parent], tok])
        scores.append(total)
        parents.append(parent)
    beam.tokens, beam.logprobs = tokens, scores
    if step >= beam.limit:
        for seq, total in zip(tokens, scores, strict=True):
            beam.finish(seq, total)
        beam.tokens, beam.logprobs = [], []
    elif beam.done(beam_size):
        beam.tokens, beam.logprobs = [], []
    return parents if beam.tokens else []
