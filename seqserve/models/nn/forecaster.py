"""A small recurrent forecaster: normalised features per step -> next step's normalised values.

`Forecaster.forward(features, lengths, state) -> (outputs, new_state)` is the serving contract
of a stateful sequence tagger (issue 21): features float32 (B, T, D), lengths int64 (B,),
state float32 (B, S) -> outputs float32 (B, T, K), new_state float32 (B, S).

- `outputs[:, t]` is the one-step-ahead forecast made after reading step t: the normalised
  value of the next step of the first K features (the model is trained on K = D = 1, the CO2
  level). Padded positions (t >= lengths[b]) are 0.
- `new_state` is the recurrent state after each row's last valid step; padded steps change
  neither the state nor the valid outputs. Passing a row's `new_state` into the next chunk's
  `state` continues the series: k chunks give what the whole series gives at once (tested).
- Zero state = the start of a series.

Residual on persistence: `outputs = features[..., :K] + step_scale * head(h)`. The network
predicts the change from the current value, in units of the training span's typical weekly
change (`step_scale`, a buffer the trainer sets; kept in the checkpoint). Why the delta: the
CO2 level trends upward (316 -> 373 ppm) and the test span reaches 373.9 ppm, well above the
training span's highest week (367.0), so a head that had to produce the level itself would
extrapolate outside the range it was fitted on; the weekly change (the seasonal cycle plus
noise) is stationary and stays in range, and a freshly initialised model already starts at
the persistence forecast.

Inputs and outputs are normalised: the server (or the trainer) subtracts the training span's
mean and divides by its std (the manifest's `normalization`), and de-normalises outputs with
`output_scale` (the same mean/std for a residual model).

State layout (S = L * H for a GRU, 2 * L * H for an LSTM): `[h_0, ..., h_{L-1}]` for a GRU;
`[h_0, ..., h_{L-1}, c_0, ..., c_{L-1}]` for an LSTM (all of h's layers first, then all of c's,
each H wide).

Two paths share one set of weights (a native nn.GRU / nn.LSTM):
- `teacher_forward(features, state)` trains on full-length windows with the native layer
  (fast; no padding);
- `forward` serves: the same cell equations (PyTorch's gate orders) as a scripted loop over
  time that keeps a row's state once it has ended (`torch.where` on the length mask, the
  language model's loops of models/nn/lm.py): packed sequences do not export, and nn.LSTM would
  return the last position's state, not each row's own. It exports as an ONNX Loop with a
  dynamic trip count. Both paths agree to float rounding (tested).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from seqserve.models.config import StackConfig, check_recurrent
from seqserve.models.nn.lm import _gru_loop, _lstm_loop
from seqserve.models.nn.rnn import init_forget_bias, length_mask

CELLS = ("gru", "lstm")


@dataclass(frozen=True)
class ForecasterConfig(StackConfig):
    """Stacked GRU/LSTM (1-3 layers, cells gru | lstm) -> linear head, residual on the current
    value; dropout acts between layers only (it needs num_layers > 1)."""

    hidden_size: int = 32
    cell: str = "gru"
    dropout: float = 0.0
    features: int = 1
    """Input features per step D."""
    outputs: int = 1
    """Forecast values per step K (the next step of the first K features; K <= D)."""

    def __post_init__(self) -> None:
        check_recurrent(self, CELLS, ("features", "outputs", "hidden_size"))
        if self.outputs > self.features:
            raise ValueError(f"outputs={self.outputs} must be <= features={self.features}: "
                             "each output forecasts the next value of one input feature")

    @property
    def state_dim(self) -> int:
        """Flat state width per row S."""
        return self.num_layers * self.hidden_size * (2 if self.cell == "lstm" else 1)


class Forecaster(nn.Module):
    """See module doc."""

    step_scale: Tensor
    _eye: Tensor
    _no_peephole: Tensor

    def __init__(self, config: ForecasterConfig) -> None:
        super().__init__()
        self.config = cfg = config
        rnn_cls = nn.GRU if cfg.cell == "gru" else nn.LSTM
        self.rnn = rnn_cls(cfg.features, cfg.hidden_size, cfg.num_layers, batch_first=True,
                           dropout=cfg.dropout if cfg.num_layers > 1 else 0.0)
        self.head = nn.Linear(cfg.hidden_size, cfg.outputs)
        nn.init.zeros_(self.head.weight)  # starts at the persistence forecast
        nn.init.zeros_(self.head.bias)
        self.register_buffer("step_scale", torch.ones(cfg.outputs))
        """Typical one-step change of each output in normalised units (set by the trainer)."""
        h = cfg.hidden_size
        self.register_buffer("_eye", torch.eye(h), persistent=False)  # LSTM: no projection
        self.register_buffer("_no_peephole", torch.zeros(3, h), persistent=False)
        if cfg.cell == "lstm":
            init_forget_bias(self, cfg.forget_bias)

    # -- state layout -----------------------------------------------------------------------

    def split_state(self, state: Tensor) -> tuple[Tensor, Tensor | None]:
        """Flat (B, S) -> h (L, B, H) and, for an LSTM, c (L, B, H)."""
        cfg = self.config
        b, n = state.shape[0], cfg.num_layers * cfg.hidden_size
        h = state[:, :n].reshape(b, cfg.num_layers, cfg.hidden_size).transpose(0, 1)
        if cfg.cell != "lstm":
            return h.contiguous(), None
        c = state[:, n:].reshape(b, cfg.num_layers, cfg.hidden_size).transpose(0, 1)
        return h.contiguous(), c.contiguous()

    def join_state(self, h: Tensor, c: Tensor | None) -> Tensor:
        """h (L, B, H) [and c (L, B, H)] -> flat (B, S)."""
        parts = [h] if c is None else [h, c]
        return torch.cat([p.transpose(0, 1).reshape(p.shape[1], -1) for p in parts], dim=1)

    def zero_state(self, batch: int) -> Tensor:
        return torch.zeros(batch, self.config.state_dim, device=self.step_scale.device)

    # -- outputs ----------------------------------------------------------------------------

    def _outputs(self, features: Tensor, top: Tensor) -> Tensor:
        k = self.config.outputs
        return features[..., :k] + self.step_scale * self.head(top)  # (B, T, K)

    # -- training: native layer over full-length windows -------------------------------------

    def teacher_forward(self, features: Tensor, state: Tensor | None = None
                        ) -> tuple[Tensor, Tensor]:
        """features (B, T, D), every row full length; state (B, S) or None (zeros) ->
        outputs (B, T, K), state after the last step (B, S)."""
        if state is None:
            state = self.zero_state(features.shape[0])
        h0, c0 = self.split_state(state)
        if c0 is None:
            top, hn = self.rnn(features, h0)
            cn = None
        else:
            top, (hn, cn) = self.rnn(features, (h0, c0))
        return self._outputs(features, top), self.join_state(hn, cn)

    # -- serving: masked loop, each row's own state ------------------------------------------

    def forward(self, features: Tensor, lengths: Tensor, state: Tensor
                ) -> tuple[Tensor, Tensor]:
        """features (B, T, D) normalised, lengths (B,) int64, state (B, S) ->
        outputs (B, T, K) normalised (0 on padding), new_state (B, S) (module doc)."""
        cfg = self.config
        valid = length_mask(lengths, features.shape[1]).unsqueeze(-1)  # (B, T, 1) bool
        h_all, c_all = self.split_state(state)
        x = features
        hs: list[Tensor] = []
        cs: list[Tensor] = []
        for i in range(cfg.num_layers):
            w_ih = getattr(self.rnn, f"weight_ih_l{i}")
            w_hh = getattr(self.rnn, f"weight_hh_l{i}")
            b_ih = getattr(self.rnn, f"bias_ih_l{i}")
            b_hh = getattr(self.rnn, f"bias_hh_l{i}")
            if c_all is not None:
                x, h, c = _lstm_loop(F.linear(x, w_ih, b_ih + b_hh), valid, w_hh, self._eye,
                                     self._no_peephole, h_all[i], c_all[i], False)
                hs.append(h)
                cs.append(c)
            else:
                x, h = _gru_loop(F.linear(x, w_ih, b_ih), valid, w_hh, b_hh, h_all[i])
                hs.append(h)
        outputs = self._outputs(features, x).masked_fill(~valid, 0.0)
        return outputs, torch.cat(hs + cs, dim=-1)
