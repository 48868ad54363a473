"""Attention: export-friendly masked softmax, pooling (classifier) and decoder attention.

Masked positions get a large negative score (not -inf), so a softmax never sees NaN traps
in exported graphs; every row has at least one valid position by contract.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

NEG_INF = -1e9


def masked_softmax(scores: Tensor, mask: Tensor) -> Tensor:
    """Softmax over the last axis with masked (False) positions at exactly zero weight.

    Inputs:  scores (..., S) float, mask broadcastable to scores, bool, True = valid.
    Outputs: weights (..., S) summing to 1 over valid positions.
    """
    return torch.softmax(scores.masked_fill(~mask, NEG_INF), dim=-1)


class AttentionPooling(nn.Module):
    """Weighted mean of a sequence, weights from a learned score over valid positions.

    additive: score = v^T tanh(W h + b) with W: (D -> hidden) (the canonical classifier).
    dot:      score = q . h with a learned query q (D,).
    general:  score = q . (W h) with W: (D -> D) and a learned query q.

    Inputs:  states (B, T, D), mask (B, T) bool.
    Outputs: pooled (B, D), weights (B, T).
    """

    def __init__(self, kind: str, size: int, hidden: int) -> None:
        super().__init__()
        self.kind = kind
        if kind == "additive":
            self.proj = nn.Linear(size, hidden)
            self.score = nn.Linear(hidden, 1, bias=False)
        elif kind in ("dot", "general"):
            self.query = nn.Parameter(torch.randn(size) / size**0.5)
            if kind == "general":
                self.proj = nn.Linear(size, size, bias=False)
        else:
            raise ValueError(f"attention={kind!r} is unknown: use additive, dot or general")

    def forward(self, states: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
        if self.kind == "additive":
            scores = self.score(torch.tanh(self.proj(states))).squeeze(-1)  # (B, T)
        elif self.kind == "general":
            scores = self.proj(states) @ self.query  # (B, T)
        else:
            scores = states @ self.query  # (B, T)
        weights = masked_softmax(scores, mask)  # (B, T)
        pooled = (weights.unsqueeze(-1) * states).sum(dim=1)  # (B, D)
        return pooled, weights


class DecoderAttention(nn.Module):
    """Global attention of decoder queries over encoder memory.

    additive (Bahdanau; Luong's concat): score = v^T tanh(W_q q + W_k m + b)
    dot (Luong):         score = q . m          (needs query size == memory size)
    general (Luong):     score = q . (W m)

    Inputs:  query (B, Tq, Hq), memory (B, S, D), mask (B, S) bool.
    Outputs: context (B, Tq, D), weights (B, Tq, S).
    """

    def __init__(self, kind: str, query_size: int, memory_size: int, hidden: int) -> None:
        super().__init__()
        self.kind = kind
        if kind == "additive":
            self.query_proj = nn.Linear(query_size, hidden, bias=False)
            self.key_proj = nn.Linear(memory_size, hidden)
            self.score = nn.Linear(hidden, 1, bias=False)
        elif kind == "general":
            self.key_proj = nn.Linear(memory_size, query_size, bias=False)
        elif kind == "dot":
            if query_size != memory_size:
                raise ValueError(f"dot attention needs query size {query_size} == memory size "
                                 f"{memory_size}: use attention='general' or 'additive'")
        else:
            raise ValueError(f"attention={kind!r} is unknown: use additive, dot or general")

    def keys(self, memory: Tensor) -> Tensor:
        """Memory projected for scoring: (B, S, D) -> (B, S, A | Hq | D). Depends on the
        memory only, so a decoder computes it once per request, not once per step and beam."""
        if self.kind == "dot":
            return memory  # (B, S, D)
        return self.key_proj(memory)  # (B, S, A) additive, (B, S, Hq) general

    def scores(self, query: Tensor, keys: Tensor) -> Tensor:
        """Unnormalised scores (B, Tq, S) of query (B, Tq, Hq) against `keys(memory)`."""
        if self.kind == "additive":
            q = self.query_proj(query).unsqueeze(2)  # (B, Tq, 1, A)
            return self.score(torch.tanh(q + keys.unsqueeze(1))).squeeze(-1)  # (B, Tq, S)
        return query @ keys.transpose(1, 2)  # (B, Tq, S)

    def forward(self, query: Tensor, memory: Tensor, mask: Tensor,
                keys: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """`keys` = `self.keys(memory)` when the caller already has it (row-aligned)."""
        keys = self.keys(memory) if keys is None else keys
        weights = masked_softmax(self.scores(query, keys), mask.unsqueeze(1))  # (B, Tq, S)
        context = weights @ memory  # (B, Tq, D)
        return context, weights
