"""Classifier: parameter count, shapes for every cell and attention, batch invariance."""

from __future__ import annotations

import pytest
import torch

from seqserve.models.config import ClassifierConfig
from seqserve.models.nn.classifier import Classifier
from seqserve.models.nn.rnn import length_mask

torch.set_num_threads(1)

LENGTHS = [5, 1, 9, 3]


def _tiny(**overrides: object) -> Classifier:
    cfg = ClassifierConfig(vocab_size=40, num_labels=3, embed_size=8, hidden_size=12,
                           head_size=10, **overrides)  # type: ignore[arg-type]
    return Classifier(cfg).eval()


def _batch(vocab: int = 40) -> tuple[torch.Tensor, torch.Tensor]:
    lengths = torch.tensor(LENGTHS)
    ids = torch.randint(4, vocab, (len(LENGTHS), max(LENGTHS)))  # (B, T)
    return ids.masked_fill(~length_mask(lengths, ids.shape[1]), 0), lengths


def test_default_configuration_has_the_canonical_parameter_count() -> None:
    model = Classifier(ClassifierConfig(vocab_size=20000, num_labels=5))
    assert sum(p.numel() for p in model.parameters()) == 3_269_253


@pytest.mark.parametrize("cell", ["rnn", "lstm", "gru"])
@pytest.mark.parametrize("attention", ["additive", "dot", "general"])
@pytest.mark.parametrize("bidirectional", [True, False])
def test_shapes_and_padded_batch_matches_rows_alone(cell: str, attention: str,
                                                    bidirectional: bool) -> None:
    torch.manual_seed(0)
    model = _tiny(cell=cell, attention=attention, bidirectional=bidirectional)
    ids, lengths = _batch()
    logits, attn = model.classify(ids, lengths)
    assert logits.shape == (4, 3) and attn.shape == (4, 9)
    assert torch.allclose(attn.sum(-1), torch.ones(4), atol=1e-6)
    for row, n in enumerate(LENGTHS):
        assert attn[row, n:].abs().sum().item() == 0.0
        alone_logits, alone_attn = model.classify(ids[row : row + 1, :n], lengths[row : row + 1])
        assert torch.allclose(alone_logits[0], logits[row], atol=1e-5, rtol=0)
        assert torch.allclose(alone_attn[0], attn[row, :n], atol=1e-5, rtol=0)


def test_forward_returns_loss_only_with_labels_and_it_backpropagates() -> None:
    model = _tiny().train()
    ids, lengths = _batch()
    logits, loss = model(ids, lengths)
    assert logits.shape == (4, 3) and loss is None
    _, loss = model(ids, lengths, torch.tensor([0, 1, 2, 0]))
    assert loss is not None and loss.ndim == 0
    loss.backward()
    assert model.embedding.weight.grad is not None
    assert model.embedding.weight.grad[0].abs().sum().item() == 0.0  # padding row frozen


@pytest.mark.parametrize(("field", "value"), [("cell", "tcn"), ("attention", "mlp"),
                                              ("num_labels", 1), ("dropout", 1.5)])
def test_bad_config_names_the_field(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=field):
        ClassifierConfig(**{field: value})  # type: ignore[arg-type]


def test_config_dict_round_trip() -> None:
    cfg = ClassifierConfig(cell="gru", num_labels=7)
    assert ClassifierConfig.from_dict(cfg.to_dict()) == cfg
    with pytest.raises(ValueError, match="bogus"):
        ClassifierConfig.from_dict({**cfg.to_dict(), "bogus": 1})
