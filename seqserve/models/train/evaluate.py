"""Validation and test evaluation of classifiers and translators (eval mode, no grad)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from seqserve.models.diagnostics.forms import translation_forms
from seqserve.models.nn.classifier import Classifier
from seqserve.models.nn.decoding import beam_search, greedy_decode
from seqserve.models.nn.translator import Translator
from seqserve.models.text.tokenizer import Tokenizer
from seqserve.models.train.batches import EncodedExample, collate, sorted_batches
from seqserve.models.train.metrics import accuracy, macro_f1, translation_metrics


@torch.no_grad()
def evaluate_classifier(model: Classifier, data: Sequence[EncodedExample],
                        batch_size: int) -> dict[str, float]:
    """Mean loss, accuracy and macro-F1 over `data`."""
    model.eval()
    predictions = [0] * len(data)
    total_loss = 0.0
    for index in sorted_batches([len(e.source) for e in data], batch_size):
        batch = collate([data[i] for i in index])
        logits, loss = model(batch["ids"], batch["lengths"], batch["labels"])
        assert loss is not None
        total_loss += float(loss) * len(index)
        for i, p in zip(index, logits.argmax(-1).tolist(), strict=True):
            predictions[i] = p
    labels = [e.label for e in data]
    return {"loss": total_loss / max(1, len(data)),
            "accuracy": accuracy(predictions, labels),
            "macro_f1": macro_f1(predictions, labels, model.config.num_labels)}


@torch.no_grad()
def evaluate_translator(model: Translator, data: Sequence[EncodedExample],
                        references: Sequence[str], tok: Tokenizer, batch_size: int,
                        beam_size: int = 1, length_penalty: float = 0.0,
                        forms: Sequence[str] | None = None) -> dict[str, Any]:
    """Teacher-forced loss and token accuracy, then decoding (greedy, or beam search when
    beam_size > 1) scored by exact match, chrF and BLEU against the raw reference strings;
    with `forms` (one per row) also per form ("forms": models/diagnostics/forms.py)."""
    model.eval()
    cfg = model.config
    hypotheses = [""] * len(data)
    total_loss, correct, tokens = 0.0, 0, 0
    for index in sorted_batches([len(e.source) for e in data], batch_size):
        batch = collate([data[i] for i in index], cfg.bos_id, cfg.eos_id, cfg.pad_id)
        logits, loss = model(batch["ids"], batch["lengths"], batch["tgt_in"], batch["tgt_out"])
        assert loss is not None
        valid = batch["tgt_out"] != cfg.pad_id  # (B, T)
        n = int(valid.sum())
        total_loss += float(loss) * n
        tokens += n
        correct += int(((logits.argmax(-1) == batch["tgt_out"]) & valid).sum())
        decoded = _decode(model, batch["ids"], batch["lengths"], beam_size, length_penalty)
        for i, ids in zip(index, decoded, strict=True):
            hypotheses[i] = tok.decode(ids)
    result: dict[str, Any] = {"loss": total_loss / max(1, tokens),
                              "token_accuracy": correct / max(1, tokens)}
    result.update(translation_metrics(hypotheses, list(references)))
    if forms is not None:
        result["forms"] = translation_forms(forms, hypotheses, references)
    return result


def _decode(model: Translator, ids: torch.Tensor, lengths: torch.Tensor, beam_size: int,
            length_penalty: float) -> list[list[int]]:
    """Best token ids per row: greedy for beam_size 1, else beam search."""
    if beam_size <= 1:
        return greedy_decode(model, ids, lengths)
    beams = beam_search(model, ids, lengths, beam_size=beam_size, n_best=1,
                        length_penalty=length_penalty)
    return [hyps[0].tokens if hyps else [] for hyps in beams]
