"""Sequence tagger: embedding -> padding-safe stacked (bi)RNN -> per-token linear softmax head.

One label per token (subword piece). Training targets carry the ignore index -100 on padding
and on pieces that do not start a word (models/text/word_align.py), so only first pieces count.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn

from seqserve.models.config import TaggerConfig
from seqserve.models.nn.rnn import init_forget_bias, length_mask, token_encoder

IGNORE_INDEX = -100
"""Target value of positions without a label (padding, non-first pieces)."""


class Tagger(nn.Module):
    """See module doc. `tag` is the export graph; `forward` adds the loss for training."""

    def __init__(self, config: TaggerConfig) -> None:
        super().__init__()
        self.config = config
        c = config
        self.embedding, self.rnn = token_encoder(c)  # (B, T) -> (B, T, E) -> (B, T, D)
        self.dropout = nn.Dropout(c.dropout)
        self.head = nn.Linear(self.rnn.output_size, c.num_labels)
        init_forget_bias(self, c.forget_bias)

    def logits(self, input_ids: Tensor, lengths: Tensor) -> Tensor:
        """Inputs: input_ids (B, T) int64 right-padded, lengths (B,) int64, 1 <= lengths <= T.
        Outputs: logits (B, T, C)."""
        x = self.embedding(input_ids)  # (B, T, E)
        states, _ = self.rnn(x, lengths)  # (B, T, D*H), zero on padding
        return self.head(self.dropout(states))  # type: ignore[no-any-return]  # (B, T, C)

    def tag(self, input_ids: Tensor, lengths: Tensor) -> Tensor:
        """Per-token log-probabilities, the export graph.

        Inputs:  input_ids (B, T) int64 right-padded, lengths (B,) int64, 1 <= lengths <= T.
        Outputs: log_probs (B, T, C), exactly zero on padded positions.
        """
        mask = length_mask(lengths, input_ids.shape[1]).unsqueeze(-1)  # (B, T, 1)
        log_probs = F.log_softmax(self.logits(input_ids, lengths), dim=-1)  # (B, T, C)
        return log_probs * mask.to(log_probs.dtype)  # (B, T, C)

    def forward(self, input_ids: Tensor, lengths: Tensor,
                labels: Tensor | None = None) -> tuple[Tensor, Tensor | None]:
        """Inputs: input_ids (B, T), lengths (B,), labels (B, T) int64 with IGNORE_INDEX on
        unlabelled positions (padding included), or None.
        Outputs: logits (B, T, C), loss (mean cross-entropy over labelled positions) or None.
        """
        logits = self.logits(input_ids, lengths)  # (B, T, C)
        if labels is None:
            return logits, None
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1),
                               ignore_index=IGNORE_INDEX)
        return logits, loss
