"""A drop-in unidirectional nn.LSTM / nn.GRU / nn.RNN whose final state is each row's own.

`LengthAwareRNN(rnn)` wraps a user's layer (batch_first or not, any number of layers) and
keeps its weights (the very Parameter objects). Called as `rnn(x, lengths, hx=None)` it returns
nn.LSTM's outputs, but taken within each row's length: output (B, T, H) with zeros past each
row's length, and h_n (layers, B, H) (an LSTM: (h_n, c_n)) after each row's *last valid* step,
not after the batch's padding. That is what a stateful feature-sequence graph must return as
`new_state` (docs/bundle-format.md): the next chunk of the row continues from it. A native
layer cannot give it (it returns the state after the last position, padding included, and
`pack_padded_sequence` does not export), so this runs the cell equations as the language
model's prefill does: a scripted loop over time that keeps a row's state once it ended
(`seqserve.models.nn.lm`), exported as an ONNX Loop with a dynamic trip count and kept as a
scripted call by TorchScript. The equations are PyTorch's, so the wrapped layer and the
original agree to float rounding on unpadded rows.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from seqserve.models.nn.lm import _gru_loop, _lstm_loop, _rnn_loop
from seqserve.models.nn.rnn import length_mask


class LengthAwareRNN(nn.Module):
    """See the module doc. Call as `rnn(x, lengths, hx=None)`."""

    def __init__(self, rnn: nn.RNNBase) -> None:
        super().__init__()
        if not isinstance(rnn, nn.LSTM | nn.GRU | nn.RNN):
            raise TypeError(f"expected an nn.LSTM, nn.GRU or nn.RNN, got {type(rnn).__name__}")
        if rnn.bidirectional:
            raise ValueError("a bidirectional layer has no state to continue from; use "
                             "seqserve.pack.bidirectional for a stateless model")
        if getattr(rnn, "proj_size", 0):
            raise ValueError("proj_size is not supported by the wrapper")
        if isinstance(rnn, nn.RNN) and rnn.nonlinearity != "tanh":
            raise ValueError("only nn.RNN(nonlinearity='tanh') is supported by the wrapper")
        self.rnn = rnn
        self.is_lstm = isinstance(rnn, nn.LSTM)
        self.is_gru = isinstance(rnn, nn.GRU)

    def _weights(self, layer: int, like: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        r = self.rnn
        w_ih, w_hh = getattr(r, f"weight_ih_l{layer}"), getattr(r, f"weight_hh_l{layer}")
        if r.bias:
            return w_ih, w_hh, getattr(r, f"bias_ih_l{layer}"), getattr(r, f"bias_hh_l{layer}")
        zeros = torch.zeros(w_hh.shape[0], dtype=like.dtype, device=like.device)
        return w_ih, w_hh, zeros, zeros

    def forward(self, x: Tensor, lengths: Tensor, hx: Any = None) -> tuple[Tensor, Any]:
        r = self.rnn
        if not r.batch_first:
            x = x.transpose(0, 1)  # (B, T, I)
        valid = length_mask(lengths.to(torch.int64), x.shape[1]).unsqueeze(-1)  # (B, T, 1)
        zeros = x[:, 0, :1] * 0.0  # (B, 1): follows the batch and device
        h0: Any = None
        c0: Any = None
        if hx is not None:
            h0, c0 = (hx[0], hx[1]) if self.is_lstm else (hx, None)
        hs: list[Tensor] = []
        cs: list[Tensor] = []
        for layer in range(r.num_layers):
            w_ih, w_hh, b_ih, b_hh = self._weights(layer, x)
            h = zeros.expand(-1, r.hidden_size) if h0 is None else h0[layer]
            if self.is_lstm:
                c = zeros.expand(-1, r.hidden_size) if c0 is None else c0[layer]
                eye = torch.eye(r.hidden_size, dtype=x.dtype, device=x.device)
                peep = torch.zeros(3, r.hidden_size, dtype=x.dtype, device=x.device)
                x, h, c = _lstm_loop(F.linear(x, w_ih, b_ih + b_hh), valid, w_hh, eye, peep,
                                     h, c, False)
                cs.append(c)
            else:
                loop = _gru_loop if self.is_gru else _rnn_loop
                x, h = loop(F.linear(x, w_ih, b_ih), valid, w_hh, b_hh, h)
            hs.append(h)
        output = x * valid.to(x.dtype)
        if not r.batch_first:
            output = output.transpose(0, 1)
        h_n = torch.stack(hs, dim=0)  # (L, B, H)
        if self.is_lstm:
            return output, (h_n, torch.stack(cs, dim=0))
        return output, h_n
