"""The language model's export graphs (docs/contracts.md).

- `prefill`: input_ids int64 [batch, seq], lengths int64 [batch] -> state float32 [batch,
  state_dim] (after each row's own last token), log_probs float32 [batch, seq, vocab] (the
  next-token distribution at every position, zero on padding): one call reads a batch of
  prompts, or scores a batch of texts.
- `lm_step`: prev_ids int64 [rows], state float32 [rows, state_dim] -> new_state float32
  [rows, state_dim], log_probs float32 [rows, vocab]: every live sequence advances by one
  token (the full distribution: temperature, top-k and top-p sampling need it).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn


class PrefillGraph(nn.Module):
    """`LanguageModel.prefill`."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: Tensor, lengths: Tensor) -> tuple[Tensor, Tensor]:
        return self.model.prefill(input_ids, lengths)  # type: ignore[operator,no-any-return]


class LMStepGraph(nn.Module):
    """`LanguageModel.lm_step`."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, prev_ids: Tensor, state: Tensor) -> tuple[Tensor, Tensor]:
        return self.model.lm_step(prev_ids, state)  # type: ignore[operator,no-any-return]


def lm_examples(model: nn.Module, ids: Tensor, lengths: Tensor, vocab_size: int
                ) -> tuple[tuple[Tensor, Tensor], tuple[Tensor, Tensor]]:
    """Example inputs of both graphs: the prefill batch, and 5 step rows from its states."""
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        state, _ = PrefillGraph(model).eval()(ids, lengths)  # (B, S)
    index = torch.tensor([0, 0, 1, 2, 2], dtype=torch.int64)  # (R,) rows != batch
    prev = torch.randint(4, vocab_size, (5,), generator=gen)
    return (ids, lengths), (prev, state[index])
