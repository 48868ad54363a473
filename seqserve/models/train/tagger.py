"""Tagger training pieces: encoding tagged texts to piece-level targets, batches, evaluation.

A word's tag sits on its first piece (models/text/word_align.py); other pieces and padding carry
IGNORE_INDEX. Metrics are per word (= per first piece): token accuracy, per-label F1 and macro
F1 over the labels that occur in gold or predictions.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from seqserve.models.diagnostics.forms import tagging_forms
from seqserve.models.nn.tagger import IGNORE_INDEX, Tagger
from seqserve.models.text.tokenizer import Tokenizer
from seqserve.models.text.word_align import piece_labels
from seqserve.models.train.batches import EncodedExample, pad, sorted_batches
from seqserve.models.train.metrics import label_f1


def encode_tagging(rows: Sequence[dict[str, Any]], tok: Tokenizer, labels: list[str],
                   max_length: int) -> list[EncodedExample]:
    """Pieces truncated to max_length with per-piece targets in `EncodedExample.target` (words cut
    off by the truncation are dropped; an empty text becomes one unlabelled unk token)."""
    index = {label: i for i, label in enumerate(labels)}
    out = []
    for row in rows:
        pieces = tok.encode_with_offsets(row["text"])[:max_length]
        if not pieces:
            out.append(EncodedExample([tok.unk_id], -1, (IGNORE_INDEX,)))
            continue
        targets = piece_labels(row["text"], pieces, [index[t] for t in row["tags"]])
        out.append(EncodedExample([p.id for p in pieces], -1, tuple(targets)))
    return out


def collate_tagging(batch: Sequence[EncodedExample], bos_id: int = 2, eos_id: int = 3,
                    pad_id: int = 0) -> dict[str, Tensor]:
    """ids (B, T), lengths (B,), tags (B, T) with IGNORE_INDEX on padding."""
    return {"ids": pad([e.source for e in batch], pad_id),  # (B, T)
            "lengths": torch.tensor([len(e.source) for e in batch]),  # (B,)
            "tags": pad([e.target for e in batch], IGNORE_INDEX)}  # (B, T)


def label_scores(predictions: list[int], gold: list[int],
                 labels: Sequence[str]) -> dict[str, float]:
    """Per-label F1 (labels present in gold or predictions) and their unweighted mean."""
    per = {labels[c]: f1 for c, f1 in label_f1(predictions, gold, len(labels)).items()}
    return {**{f"f1/{k}": v for k, v in per.items()},
            "macro_f1": sum(per.values()) / len(per) if per else 0.0}


@torch.no_grad()
def evaluate_tagger(model: Tagger, data: Sequence[EncodedExample], batch_size: int,
                    labels: Sequence[str], forms: Sequence[str] | None = None) -> dict[str, Any]:
    """Mean loss per labelled word, token (word) accuracy, per-label F1 and macro F1; with
    `forms` (one per row) also token accuracy per form ("forms": models/diagnostics/forms.py)."""
    model.eval()
    predictions: list[int] = []
    gold: list[int] = []
    hits = [(0, 0)] * len(data)  # per row: (correct words, words)
    total_loss, words = 0.0, 0
    for index in sorted_batches([len(e.source) for e in data], batch_size):
        batch = collate_tagging([data[i] for i in index], pad_id=model.config.pad_id)
        logits, loss = model(batch["ids"], batch["lengths"], batch["tags"])
        keep = batch["tags"] != IGNORE_INDEX  # (B, T)
        n = int(keep.sum())
        if loss is not None and n:
            total_loss += float(loss) * n
        words += n
        right = (logits.argmax(-1) == batch["tags"]) & keep  # (B, T)
        for i, row_right, row_keep in zip(index, right.sum(1).tolist(), keep.sum(1).tolist(),
                                          strict=True):
            hits[i] = (int(row_right), int(row_keep))
        predictions += logits.argmax(-1)[keep].tolist()
        gold += batch["tags"][keep].tolist()
    accuracy = sum(p == y for p, y in zip(predictions, gold, strict=True)) / max(1, words)
    result: dict[str, Any] = {"loss": total_loss / max(1, words), "token_accuracy": accuracy,
                              **label_scores(predictions, gold, labels)}
    if forms is not None:
        result["forms"] = tagging_forms(forms, hits)
    return result
