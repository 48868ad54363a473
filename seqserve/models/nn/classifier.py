"""Sequence classifier: embedding -> padding-safe stacked (bi)RNN -> attention pooling -> MLP."""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn

from seqserve.models.config import ClassifierConfig
from seqserve.models.nn.attention import AttentionPooling
from seqserve.models.nn.rnn import init_forget_bias, length_mask, token_encoder


class Classifier(nn.Module):
    """The canonical classifier of DESIGN.md (BiLSTM + additive attention pooling by default).

    `classify` is the export graph; `forward` adds the loss for training.
    """

    def __init__(self, config: ClassifierConfig) -> None:
        super().__init__()
        self.config = config
        c = config
        self.embedding, self.rnn = token_encoder(c)  # (B, T) -> (B, T, E) -> (B, T, D)
        size = self.rnn.output_size
        self.pool = AttentionPooling(c.attention, size, size // 2)
        self.head = nn.Sequential(
            nn.Linear(size, c.head_size),
            nn.GELU(),
            nn.Dropout(c.dropout),
            nn.Linear(c.head_size, c.num_labels),
        )
        init_forget_bias(self, c.forget_bias)

    def classify(self, input_ids: Tensor, lengths: Tensor) -> tuple[Tensor, Tensor]:
        """Class scores and pooling weights.

        Inputs:  input_ids (B, T) int64 right-padded, lengths (B,) int64, 1 <= lengths <= T.
        Outputs: logits (B, C), attention (B, T) (zero on padding, rows sum to 1).
        """
        mask = length_mask(lengths, input_ids.shape[1])  # (B, T)
        x = self.embedding(input_ids)  # (B, T, E)
        states, _ = self.rnn(x, lengths)  # (B, T, D*H)
        pooled, attention = self.pool(states, mask)  # (B, D*H), (B, T)
        return self.head(pooled), attention  # (B, C), (B, T)

    def forward(self, input_ids: Tensor, lengths: Tensor,
                labels: Tensor | None = None) -> tuple[Tensor, Tensor | None]:
        """Inputs: input_ids (B, T), lengths (B,), labels (B,) int64 or None.
        Outputs: logits (B, C), loss (scalar mean cross-entropy) or None.
        """
        logits, _ = self.classify(input_ids, lengths)  # (B, C)
        loss = F.cross_entropy(logits, labels) if labels is not None else None
        return logits, loss
