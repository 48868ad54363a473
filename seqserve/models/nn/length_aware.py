"""A drop-in unidirectional nn.LSTM / nn.GRU / nn.RNN whose final state is each row's own.

`LengthAwareRNN(rnn)` wraps a user's layer (batch_first or not, any number of layers) and
keeps its weights (the very Parameter objects). Called as `rnn(x, lengths, hx=None)` it returns
nn.LSTM's outputs, but taken within each row's length: output (B, T, H) with zeros past each
row's length, and h_n (layers, B, H) (an LSTM: (h_n, c_n)) after each row's *last valid* step,
not after the batch's padding. That is what a stateful feature-sequence graph must return as
`new_state` (docs/bundle-format.md): the next chunk of the row continues from it. A native
layer cannot give it (it returns the state after the last position, padding included, and
`pack_padded_sequence` does not export), so this runs the cell equations as the language
model's prefill does: a loop over time that keeps a row's state once it ended
(`seqserve.models.nn.masked_rnn`: a scripted loop, exported as an ONNX Loop with a dynamic
trip count and kept as a scripted call by TorchScript; a `scan` under PyTorch's default ONNX
exporter). The equations are PyTorch's, so the wrapped layer and the
original agree to float rounding on unpadded rows.
"""

from __future__ import annotations

from typing import Any

from torch import Tensor, nn

from seqserve.models.nn.masked_rnn import run_within_lengths


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

    def forward(self, x: Tensor, lengths: Tensor, hx: Any = None) -> tuple[Tensor, Any]:
        output, h_n, c_n = run_within_lengths(self.rnn, x, lengths, hx)
        return (output, (h_n, c_n)) if self.is_lstm else (output, h_n)
