"""Feature-sequence models written outside seqserve, in the style of the PyTorch tutorials
(their own tensor names, nn.GRU / nn.LSTM), for the pack and serving tests. Initialised, not
trained: the comparisons only need the served answers to equal the eager module's."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

import seqserve.pack

NORM = {"mean": [10.0, -2.0, 0.5], "std": [4.0, 0.5, 2.0]}
"""Input normalisation of the 3-feature test models (clients send raw values)."""
SCALE = {"mean": [300.0], "std": [25.0]}
"""Output scale of the regression test models."""


class GRUForecaster(nn.Module):
    """A stateful many-to-many forecaster: a 2-layer GRU (state at each row's own end via
    seqserve.pack.length_aware) and a per-step linear head; forward(x, lengths, state) with
    state (batch, layers * hidden), as a user who keeps one flat state row would write it."""

    def __init__(self, features: int = 3, hidden: int = 12, layers: int = 2) -> None:
        super().__init__()
        self.layers, self.hidden = layers, hidden
        self.rnn = seqserve.pack.length_aware(nn.GRU(features, hidden, layers,
                                                     batch_first=True))
        self.head = nn.Linear(hidden, 1)

    def forward(self, x: Tensor, lengths: Tensor, state: Tensor) -> tuple[Tensor, Tensor]:
        h0 = state.reshape(state.shape[0], self.layers, self.hidden).transpose(0, 1)
        y, h_n = self.rnn(x, lengths, h0.contiguous())
        return self.head(y), h_n.transpose(0, 1).reshape(state.shape[0], -1)


class LSTMSensorClassifier(nn.Module):
    """A stateful many-to-one classifier: length-aware LSTM, (h, c) as two arguments, logits
    from the last valid step."""

    def __init__(self, features: int = 3, hidden: int = 10, classes: int = 3) -> None:
        super().__init__()
        self.lstm = seqserve.pack.length_aware(nn.LSTM(features, hidden, 2, batch_first=True))
        self.out = nn.Linear(hidden, classes)

    def forward(self, x: Tensor, lengths: Tensor, h: Tensor, c: Tensor
                ) -> tuple[Tensor, Tensor, Tensor]:
        _, (h_n, c_n) = self.lstm(x, lengths, (h, c))
        return self.out(h_n[-1]), h_n, c_n


class TutorialLSTMTagger(nn.Module):
    """The tutorial's stateless per-step regression: nn.LSTM over the (padded) batch and a
    linear head (unidirectional, so a step's output never sees the padding after it)."""

    def __init__(self, features: int = 3, hidden: int = 16) -> None:
        super().__init__()
        self.lstm = nn.LSTM(features, hidden, batch_first=True)
        self.head = nn.Linear(hidden, 1)

    def forward(self, x: Tensor, lengths: Tensor) -> Tensor:
        y, _ = self.lstm(x)
        return self.head(y)


class NaiveStatefulGRU(nn.Module):
    """The classic mistake: a native nn.GRU's h_n is the state after the batch's padding."""

    def __init__(self, features: int = 3, hidden: int = 8) -> None:
        super().__init__()
        self.rnn = nn.GRU(features, hidden, batch_first=True)
        self.head = nn.Linear(hidden, 1)

    def forward(self, x: Tensor, lengths: Tensor, h: Tensor) -> tuple[Tensor, Tensor]:
        y, h_n = self.rnn(x, h)
        return self.head(y), h_n


def init(model: nn.Module, seed: int = 0, gain: float = 1.5) -> nn.Module:
    """Fixed random weights, scaled so that outputs depend visibly on the inputs."""
    torch.manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn_like(p) * 0.3 * gain)
    return model.eval()


def normalise(series: np.ndarray, norm: dict[str, list[float]] = NORM) -> np.ndarray:
    return (series - np.asarray(norm["mean"])) / np.asarray(norm["std"])


def eager_series(model: nn.Module, series: np.ndarray, stateful: int = 0,
                 norm: dict[str, list[float]] | None = NORM,
                 scale: dict[str, list[float]] | None = None) -> np.ndarray:
    """The eager module's outputs for one raw series (T, D), from zero state: normalised as
    the server does, the output scale undone."""
    x = normalise(series, norm) if norm else series
    xt = torch.tensor(x[None], dtype=torch.float32)
    n = torch.tensor([len(series)])
    args: list[Any] = [xt, n]
    if isinstance(model, GRUForecaster):
        args.append(torch.zeros(1, model.layers * model.hidden))
    elif isinstance(model, LSTMSensorClassifier):
        args += [torch.zeros(2, 1, 10), torch.zeros(2, 1, 10)]
    with torch.no_grad():
        out = model(*args)
    y = (out[0] if isinstance(out, tuple) else out)[0].numpy().astype(np.float64)
    if scale:
        y = y * np.asarray(scale["std"]) + np.asarray(scale["mean"])
    return y


def raw_series(rng: np.random.Generator, steps: int, features: int = 3) -> np.ndarray:
    """A raw series around the normalisation's mean (what a sensor would send)."""
    z = rng.standard_normal((steps, features))
    return z * np.asarray(NORM["std"]) + np.asarray(NORM["mean"])


def pack_tiny_series(repo: Path, name: str = "tiny-series") -> Path:
    """The bad-input table's feature-sequence model: the stateful GRU forecaster, packed by
    the Python API with normalisation and output scale, max 16 steps (a second or two)."""
    from seqserve.export.pack.api import sequence_tagger

    return sequence_tagger(init(GRUForecaster()), features=3, outputs=1, normalization=NORM,
                           output_scale=SCALE, repo=repo, name=name, version=1, max_steps=16,
                           progress=False, grid={"batch_sizes": (1, 3), "lengths": (1, 7)})
