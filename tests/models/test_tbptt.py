"""Truncated BPTT: same values as full BPTT, no gradient across a chunk boundary, still learns."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch

from seqserve.models.data.dataset import Dataset
from seqserve.models.nn.rnn import PaddingSafeRNN
from seqserve.models.train.run import run_training

torch.set_num_threads(1)

K, T = 4, 12


def _rnn(cell: str, bidirectional: bool, tbptt: int, **variant: object) -> PaddingSafeRNN:
    torch.manual_seed(0)
    rnn = PaddingSafeRNN(cell, 6, 8, num_layers=2, bidirectional=bidirectional,
                         **variant)  # type: ignore[arg-type]
    rnn.tbptt = tbptt
    return rnn.train()


def _input_grad(rnn: PaddingSafeRNN, select: slice, features: slice) -> torch.Tensor:
    """Per-position gradient norm (T,) on the input ("embedding output") of the loss taken
    on outputs at positions `select`, feature columns `features`."""
    x = torch.randn(2, T, 6, requires_grad=True)
    grads: list[torch.Tensor] = []
    x.register_hook(grads.append)
    out, _ = rnn(x, torch.tensor([T, T]))
    out[:, select, features].sum().backward()
    return grads[0].norm(dim=(0, 2))  # (T,)


@pytest.mark.parametrize("cell", ["rnn", "lstm", "gru"])
def test_tbptt_keeps_values(cell: str) -> None:
    x = torch.randn(3, T, 6)
    lengths = torch.tensor([T, 7, 2])
    full, _ = _rnn(cell, True, 0)(x, lengths)
    chunked, _ = _rnn(cell, True, K)(x, lengths)
    torch.testing.assert_close(chunked, full, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize(("cell", "variant"), [("lstm", {}), ("gru", {}), ("rnn", {}),
                                                ("lstm", {"peephole": True, "proj_size": 4})])
def test_forward_direction_gradient_stops_at_the_chunk_start(cell: str,
                                                             variant: dict[str, object]) -> None:
    chunk = slice(2 * K, 3 * K)  # loss of chunk j = 2 only
    grad = _input_grad(_rnn(cell, False, K, **variant), chunk, slice(None))
    assert grad[: 2 * K].max() == 0.0  # earlier chunks: nothing flows back
    assert (grad[chunk] > 0).all()
    control = _input_grad(_rnn(cell, False, 0, **variant), chunk, slice(None))
    assert control[: 2 * K].max() > 0.0  # full BPTT does reach them


def test_backward_direction_chunks_run_right_to_left() -> None:
    rnn = _rnn("lstm", True, K)
    width = rnn.output_size // 2
    # forward half of the middle chunk: gradient only inside and after nothing before it
    fwd = _input_grad(rnn, slice(K, 2 * K), slice(0, width))
    assert fwd[:K].max() == 0.0 and (fwd[K : 2 * K] > 0).all()
    # backward half of the middle chunk: its backward chunk covers the same positions (T = 3K)
    # and starts at their right end, so nothing flows into the later positions
    bwd = _input_grad(rnn, slice(K, 2 * K), slice(width, None))
    assert bwd[2 * K :].max() == 0.0 and (bwd[K : 2 * K] > 0).all()


def test_eval_mode_ignores_tbptt() -> None:
    rnn = _rnn("lstm", False, K).eval()
    grad = _input_grad(rnn, slice(2 * K, 3 * K), slice(None))
    assert grad[: 2 * K].max() > 0.0


def _marker_dataset(n: int, seed: int) -> Dataset:
    """label = the first word; the text runs on for 6..14 more words (several TBPTT chunks)."""
    rng = random.Random(seed)
    words = ["red", "green", "blue", "gold", "pink", "teal", "gray", "navy"]

    def rows(count: int) -> list[dict[str, str]]:
        out = []
        for _ in range(count):
            first = rng.choice(words[:3])
            rest = [rng.choice(words) for _ in range(rng.randint(6, 14))]
            out.append({"text": " ".join([first, *rest]), "label": first})
        return out

    return Dataset("marker", "classification",
                   {"train": rows(n), "valid": rows(80), "test": rows(80)},
                   ["blue", "green", "red"])


def test_classifier_with_tbptt_still_learns(tmp_path: Path) -> None:
    metrics = run_training(
        "classifier", _marker_dataset(600, 0), tmp_path / "run",
        {"vocab_size": 40, "embed_size": 16, "hidden_size": 16, "num_layers": 1,
         "head_size": 16, "max_length": 32},
        {"epochs": 4, "batch_size": 16, "lr": 1e-2, "warmup_steps": 5, "num_threads": 1,
         "tbptt": 3, "tokenizer_type": "word", "patience": 0},
        progress=False)
    assert metrics["accuracy"] > 0.9  # chance is 1/3


def test_tbptt_is_refused_for_translators(tmp_path: Path) -> None:
    from seqserve.models.errors import UserError

    with pytest.raises(UserError, match="tbptt"):
        run_training("translator", "numbers-en-fr", tmp_path / "mt", {"vocab_size": 200},
                     {"epochs": 1, "tbptt": 4, "tokenizer_type": "word"}, progress=False,
                     data_size=50)
