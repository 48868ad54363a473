"""Evaluation metrics (classification and translation) and per-layer gradient norms."""

from __future__ import annotations

from collections import defaultdict

import sacrebleu
import torch
from torch import nn


def accuracy(predictions: list[int], labels: list[int]) -> float:
    """Fraction of predictions equal to their label (0.0 for no examples)."""
    if not labels:
        return 0.0
    return sum(p == y for p, y in zip(predictions, labels, strict=True)) / len(labels)


def label_f1(predictions: list[int], labels: list[int], num_labels: int) -> dict[int, float]:
    """F1 of each class present in the predictions or the labels, by class index."""
    tp, fp, fn = [0] * num_labels, [0] * num_labels, [0] * num_labels
    for p, y in zip(predictions, labels, strict=True):
        if p == y:
            tp[y] += 1
        else:
            fp[p] += 1
            fn[y] += 1
    return {c: 2 * tp[c] / (2 * tp[c] + fp[c] + fn[c]) for c in range(num_labels)
            if tp[c] + fp[c] + fn[c] > 0}


def macro_f1(predictions: list[int], labels: list[int], num_labels: int) -> float:
    """Unweighted mean over classes of F1; a class absent from both sides is skipped."""
    scores = label_f1(predictions, labels, num_labels)
    return sum(scores.values()) / len(scores) if scores else 0.0


def translation_metrics(hypotheses: list[str], references: list[str]) -> dict[str, float]:
    """Exact match (after whitespace strip), chrF and BLEU (sacrebleu, corpus level, 0-100)."""
    if not references:
        return {"exact_match": 0.0, "chrf": 0.0, "bleu": 0.0}
    hyps = [h.strip() for h in hypotheses]
    refs = [r.strip() for r in references]
    exact = sum(h == r for h, r in zip(hyps, refs, strict=True)) / len(refs)
    return {
        "exact_match": exact,
        "chrf": float(sacrebleu.corpus_chrf(hyps, [refs]).score),
        "bleu": float(sacrebleu.corpus_bleu(hyps, [refs]).score),
    }


def layer_of(param_name: str) -> str:
    """Group a parameter into its layer: the module path without the tensor name, e.g.
    `rnn.forward_layers.0.weight_ih_l0` -> `rnn.forward_layers.0`."""
    return param_name.rsplit(".", 1)[0] if "." in param_name else param_name


@torch.no_grad()
def grad_norms(model: nn.Module) -> dict[str, float]:
    """L2 norm of the gradients of each layer (parameters without grad are skipped)."""
    squares: dict[str, float] = defaultdict(float)
    for name, param in model.named_parameters():
        if param.grad is not None:
            squares[layer_of(name)] += float(param.grad.detach().pow(2).sum())
    return {layer: value**0.5 for layer, value in squares.items()}


class RunningMean:
    """Mean of per-key values over an epoch (gradient norms, losses)."""

    def __init__(self) -> None:
        self.sums: dict[str, float] = defaultdict(float)
        self.counts: dict[str, int] = defaultdict(int)

    def add(self, values: dict[str, float], weight: int = 1) -> None:
        for key, value in values.items():
            self.sums[key] += value * weight
            self.counts[key] += weight

    def means(self) -> dict[str, float]:
        return {k: self.sums[k] / self.counts[k] for k in self.sums if self.counts[k]}
