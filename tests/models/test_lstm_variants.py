"""LSTM variants (projection, peepholes, CIFG): the cell equations, padding safety, configs."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor, nn

from seqserve.models.config import ClassifierConfig, TaggerConfig, TranslatorConfig
from seqserve.models.nn.classifier import Classifier
from seqserve.models.nn.lstm_variants import VariantLSTM
from seqserve.models.nn.rnn import PaddingSafeRNN, length_mask
from seqserve.models.nn.tagger import Tagger
from seqserve.models.nn.translator import Translator

torch.set_num_threads(1)

VARIANTS = [
    {"peephole": True},
    {"cifg": True},
    {"proj_size": 5},
    {"peephole": True, "cifg": True, "proj_size": 5},
]


def _reference_step(layer: VariantLSTM, x: Tensor, h: Tensor, c: Tensor) -> tuple[Tensor, Tensor]:
    """One step of the variant equations written out gate by gate (independent of the loop)."""
    gates = x @ layer.weight_ih_l0.T + layer.bias_ih_l0 + h @ layer.weight_hh_l0.T + \
        layer.bias_hh_l0
    size = layer.hidden_size
    p = layer.peephole_l0 if layer.peephole_l0 is not None else torch.zeros(3, size)
    if layer.cifg:
        f = torch.sigmoid(gates[:, :size] + p[1] * c)
        i, g, o_in = 1 - f, gates[:, size : 2 * size], gates[:, 2 * size :]
    else:
        i = torch.sigmoid(gates[:, :size] + p[0] * c)
        f = torch.sigmoid(gates[:, size : 2 * size] + p[1] * c)
        g, o_in = gates[:, 2 * size : 3 * size], gates[:, 3 * size :]
    c = f * c + i * torch.tanh(g)
    h = torch.sigmoid(o_in + p[2] * c) * torch.tanh(c)
    if layer.weight_hr_l0 is not None:
        h = h @ layer.weight_hr_l0.T
    return h, c


@pytest.mark.parametrize("variant", VARIANTS)
def test_variant_layer_follows_the_cell_equations(variant: dict[str, object]) -> None:
    torch.manual_seed(0)
    layer = VariantLSTM(4, 6, **variant)  # type: ignore[arg-type]
    x = torch.randn(3, 5, 4)
    out, (h_n, c_n) = layer(x)
    width = int(variant.get("proj_size", 0)) or 6  # type: ignore[call-overload]
    assert out.shape == (3, 5, width) and h_n.shape == (1, 3, width) and c_n.shape == (1, 3, 6)
    h, c = torch.zeros(3, width), torch.zeros(3, 6)
    for t in range(5):
        h, c = _reference_step(layer, x[:, t], h, c)
        torch.testing.assert_close(out[:, t], h, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(c_n[0], c, atol=1e-6, rtol=1e-5)


def test_variant_layer_without_variants_is_nn_lstm() -> None:
    torch.manual_seed(0)
    layer = VariantLSTM(4, 6)
    reference = nn.LSTM(4, 6, batch_first=True)
    reference.load_state_dict(layer.state_dict())
    x = torch.randn(2, 7, 4)
    torch.testing.assert_close(layer(x)[0], reference(x)[0], atol=1e-6, rtol=1e-5)


def test_peephole_and_cifg_change_the_output() -> None:
    torch.manual_seed(0)
    plain = VariantLSTM(4, 6, peephole=True)
    x = torch.randn(2, 5, 4)
    with torch.no_grad():
        before = plain(x)[0]
        assert plain.peephole_l0 is not None
        plain.peephole_l0.add_(1.0)
        assert (plain(x)[0] - before).abs().max() > 1e-3


@pytest.mark.parametrize("variant", VARIANTS)
def test_padding_safe_rnn_with_variant_is_batch_invariant(variant: dict[str, object]) -> None:
    torch.manual_seed(0)
    rnn = PaddingSafeRNN("lstm", 8, 12, num_layers=2, **variant).eval()  # type: ignore[arg-type]
    assert rnn.rnn_form == "loop"
    lengths = torch.tensor([6, 1, 9, 3])
    x = torch.randn(4, 9, 8) * length_mask(lengths, 9).unsqueeze(-1)
    out, finals = rnn(x, lengths)
    assert out.shape == (4, 9, rnn.output_size) and finals.shape == (2, 4, rnn.output_size)
    for row, n in enumerate(lengths.tolist()):
        alone, _ = rnn(x[row : row + 1, :n], lengths[row : row + 1])
        assert (out[row, :n] - alone[0]).abs().max() <= 1e-6
        assert not out[row, n:].any()


def test_native_form_without_variants() -> None:
    assert PaddingSafeRNN("lstm", 4, 6).rnn_form == "native"


@pytest.mark.parametrize("variant", VARIANTS)
def test_every_model_family_builds_and_backpropagates_with_a_variant(
        variant: dict[str, object]) -> None:
    torch.manual_seed(0)
    small = {"vocab_size": 40, "embed_size": 8, "hidden_size": 12, "num_layers": 1}
    ids, lengths = torch.randint(4, 40, (3, 6)), torch.tensor([6, 4, 2])
    clf = Classifier(ClassifierConfig(**small, num_labels=3, head_size=8, **variant))  # type: ignore[arg-type]
    tagger = Tagger(TaggerConfig(**small, num_labels=4, **variant))  # type: ignore[arg-type]
    mt = Translator(TranslatorConfig(**small, cell="lstm", **variant))  # type: ignore[arg-type]
    losses = [clf(ids, lengths, torch.tensor([0, 1, 2]))[1],
              tagger(ids, lengths, torch.randint(0, 4, (3, 6)))[1],
              mt(ids, lengths, ids[:, :4], ids[:, 1:5])[1]]
    for model, loss in zip((clf, tagger, mt), losses, strict=True):
        assert loss is not None and torch.isfinite(loss)
        loss.backward()
        rnn = model.encoder if isinstance(model, Translator) else model.rnn
        assert isinstance(rnn, PaddingSafeRNN) and rnn.rnn_form == "loop"
        assert isinstance(rnn.forward_layers[0], VariantLSTM)
        assert all(p.grad is not None for p in rnn.parameters())


@pytest.mark.parametrize(("overrides", "field"), [
    ({"cell": "gru", "peephole": True}, "cell='lstm'"),
    ({"cell": "rnn", "cifg": True}, "cell='lstm'"),
    ({"proj_size": 16}, "proj_size=16"),
    ({"proj_size": -1}, "proj_size=-1"),
])
def test_bad_variant_configs_name_the_field(overrides: dict[str, object], field: str) -> None:
    with pytest.raises(ValueError, match=field):
        TaggerConfig(hidden_size=16, **overrides)  # type: ignore[arg-type]


def test_translator_dot_attention_needs_matching_memory() -> None:
    with pytest.raises(ValueError, match="dot"):
        TranslatorConfig(cell="lstm", attention="dot", hidden_size=32, proj_size=8)
