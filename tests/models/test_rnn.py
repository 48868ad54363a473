"""Padding-safe (bi)RNN: a row's outputs do not depend on the padding of its batch."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from seqserve.models.nn.rnn import PaddingSafeRNN, length_mask, reverse_index

torch.set_num_threads(1)

LENGTHS = [6, 1, 9, 3, 9]


def _batch(input_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    lengths = torch.tensor(LENGTHS)
    x = torch.randn(len(LENGTHS), max(LENGTHS), input_size)  # (B, T, I)
    x = x * length_mask(lengths, x.shape[1]).unsqueeze(-1)  # pad positions zero
    return x, lengths


def test_reverse_index_reverses_within_length_and_is_an_involution() -> None:
    lengths = torch.tensor([3, 5, 1])
    index = reverse_index(lengths, 5)
    assert index.tolist() == [[2, 1, 0, 3, 4], [4, 3, 2, 1, 0], [0, 1, 2, 3, 4]]
    assert torch.equal(index.gather(1, index), torch.arange(5).expand(3, 5))


@pytest.mark.parametrize("cell", ["rnn", "lstm", "gru"])
@pytest.mark.parametrize("bidirectional", [True, False])
def test_padded_batch_matches_each_row_alone(cell: str, bidirectional: bool) -> None:
    torch.manual_seed(0)
    rnn = PaddingSafeRNN(cell, 8, 12, num_layers=2, bidirectional=bidirectional).eval()
    x, lengths = _batch(8)
    outputs, finals = rnn(x, lengths)
    width = 12 * (2 if bidirectional else 1)
    assert outputs.shape == (5, 9, width) and finals.shape == (2, 5, width)
    for row, n in enumerate(LENGTHS):
        alone, alone_final = rnn(x[row : row + 1, :n], lengths[row : row + 1])
        assert torch.allclose(alone[0], outputs[row, :n], atol=1e-5, rtol=0)
        assert torch.allclose(alone_final[:, 0], finals[:, row], atol=1e-5, rtol=0)
        assert outputs[row, n:].abs().sum().item() == 0.0


@pytest.mark.parametrize("cell", ["rnn", "lstm", "gru"])
def test_matches_torch_bidirectional_module_on_full_length_rows(cell: str) -> None:
    """With no padding the result equals nn.LSTM/GRU/RNN(bidirectional=True) with the same
    weights, so the construction is the standard bidirectional RNN."""
    torch.manual_seed(1)
    ours = PaddingSafeRNN(cell, 6, 10, num_layers=1, bidirectional=True).eval()
    ref_cls = {"rnn": nn.RNN, "lstm": nn.LSTM, "gru": nn.GRU}[cell]
    ref = ref_cls(6, 10, batch_first=True, bidirectional=True).eval()
    with torch.no_grad():
        for name, param in ours.forward_layers[0].named_parameters():
            getattr(ref, name).copy_(param)
        for name, param in ours.backward_layers[0].named_parameters():
            getattr(ref, f"{name}_reverse").copy_(param)
    x = torch.randn(3, 7, 6)
    expected, _ = ref(x)
    got, _ = ours(x, torch.tensor([7, 7, 7]))
    assert torch.allclose(got, expected, atol=1e-5, rtol=0)


def test_plain_bidirectional_lstm_is_not_padding_safe() -> None:
    """The reason for PaddingSafeRNN: nn.LSTM over a padded batch corrupts short rows."""
    torch.manual_seed(2)
    ref = nn.LSTM(8, 12, batch_first=True, bidirectional=True).eval()
    x, _ = _batch(8)
    padded, _ = ref(x)
    alone, _ = ref(x[1:2, :1])
    assert (padded[1, 0] - alone[0, 0]).abs().max().item() > 1e-4


def _forget_slices(module: nn.Module, gate: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    size = module.hidden_size  # type: ignore[union-attr]
    params = dict(module.named_parameters())
    return [(params[name][gate * size : (gate + 1) * size],
             params[name.replace("bias_ih", "bias_hh")][gate * size : (gate + 1) * size])
            for name in params if name.startswith("bias_ih")]


@pytest.mark.parametrize("variant", [{}, {"peephole": True}, {"cifg": True}])
def test_forget_bias_sets_every_lstm_layers_forget_gate(variant: dict[str, bool]) -> None:
    from seqserve.models.nn.lstm_variants import VariantLSTM
    from seqserve.models.nn.rnn import init_forget_bias

    torch.manual_seed(0)
    rnn = PaddingSafeRNN("lstm", 4, 6, num_layers=2, bidirectional=True, **variant)
    before = {k: v.clone() for k, v in rnn.state_dict().items()}
    assert init_forget_bias(rnn, 2.0) == 4  # 2 layers x 2 directions
    gate = 0 if variant.get("cifg") else 1  # CIFG stacks f, g, o
    for layer in [*rnn.forward_layers, *rnn.backward_layers]:
        assert isinstance(layer, VariantLSTM if variant else nn.LSTM)
        for b_ih, b_hh in _forget_slices(layer, gate):
            assert bool((b_ih == 2.0).all()) and bool((b_hh == 0.0).all())
    changed = {k for k, v in rnn.state_dict().items() if not torch.equal(v, before[k])}
    assert changed == {k for k in before if "bias_" in k}  # only the biases' forget blocks
    assert init_forget_bias(rnn, None) == 0
    gru = PaddingSafeRNN("gru", 4, 6)
    assert init_forget_bias(gru, 1.0) == 0


@pytest.mark.parametrize("task", ["classifier", "tagger", "translator"])
def test_every_family_applies_its_forget_bias(task: str) -> None:
    from seqserve.models.checkpoint import build_model

    config: dict[str, object] = {"vocab_size": 40, "cell": "lstm", "hidden_size": 8,
                                 "embed_size": 4, "forget_bias": 1.5}
    if task != "translator":
        config["num_labels"] = 3
    model = build_model(task, config)
    lstms = [m for m in model.modules() if isinstance(m, nn.LSTM)]
    assert len(lstms) == (3 if task == "translator" else 4)  # translator: 2 enc + decoder
    for lstm in lstms:
        for b_ih, b_hh in _forget_slices(lstm, 1):
            assert bool((b_ih == 1.5).all()) and bool((b_hh == 0.0).all())
    config["forget_bias"] = None  # PyTorch's uniform init, as before the option existed
    lstm = next(m for m in build_model(task, config).modules() if isinstance(m, nn.LSTM))
    b_ih, _ = _forget_slices(lstm, 1)[0]
    assert len(set(b_ih.tolist())) == b_ih.numel()
