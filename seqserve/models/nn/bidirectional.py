"""A drop-in bidirectional nn.LSTM / nn.GRU / nn.RNN that ignores batch padding.

`LengthAwareBidirectional(rnn)` wraps a user's bidirectional layer (batch_first or not) and
keeps its weights (the very Parameter objects: training either trains both). Called as
`rnn(x, lengths)` it runs the backward direction within each row's length (the
reverse-within-length form of `models.rnn.PaddingSafeRNN`), so a row's outputs do not depend
on how much padding its batch adds, and it exports to ONNX and TorchScript (unlike
`pack_padded_sequence(..., enforce_sorted=False)`, which torch's TorchScript-based ONNX
exporter cannot export). Outputs are nn.LSTM's: output (B, T, 2H) with zeros past each row's
length (as `pad_packed_sequence` gives), and h_n (layers x 2, B, H) taken at each row's last
valid token (forward) and first token (backward). An LSTM's c_n is returned only when called
without lengths (None otherwise: nn.LSTM keeps no per-step cell state to read it from); start
a decoder from h_n or the outputs.

Two forms of the same computation. Eagerly, under `torch.jit.trace` and under the
TorchScript-based ONNX exporter, each direction is the user's own native layer (one layer of
it), exported as an ONNX LSTM / GRU / RNN node whose time axis follows the input. Under
torch.export (PyTorch's default ONNX exporter, dynamo) a native layer is decomposed into a loop
unrolled over the example's length, which fixes the time axis to it and breaks the
reverse-within-length gathers at every other length; there the wrapper runs
`masked_rnn.run_within_lengths` instead, the same recurrence as a `scan` whose length is the
input's. Both forms give the same outputs and h_n to float rounding. That form runs tanh
cells only: an nn.RNN(nonlinearity='relu') raises under torch.export, naming `dynamo=False`
(under torch.compile alone it keeps the native form).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from seqserve.models.nn.masked_rnn import exporting, run_within_lengths, supported
from seqserve.models.nn.rnn import gather_time, length_mask, reverse_index


class LengthAwareBidirectional(nn.Module):
    """See the module doc. Call as `rnn(x, lengths)`; without lengths every row is full."""

    def __init__(self, rnn: nn.RNNBase) -> None:
        super().__init__()
        if not isinstance(rnn, nn.LSTM | nn.GRU | nn.RNN):
            raise TypeError(f"expected an nn.LSTM, nn.GRU or nn.RNN, got {type(rnn).__name__}")
        if getattr(rnn, "proj_size", 0):
            raise ValueError("proj_size is not supported by the wrapper")
        self.rnn = rnn
        self.batch_first = rnn.batch_first
        self.num_layers = rnn.num_layers
        self.bidirectional = rnn.bidirectional
        self.is_lstm = isinstance(rnn, nn.LSTM)
        self.cells = nn.ModuleList()
        for layer in range(rnn.num_layers):
            for suffix in ("", "_reverse") if rnn.bidirectional else ("",):
                self.cells.append(self._direction(rnn, layer, suffix))

    @staticmethod
    def _direction(rnn: nn.RNNBase, layer: int, suffix: str) -> nn.RNNBase:
        size_in = rnn.input_size if layer == 0 else rnn.hidden_size * (2 if rnn.bidirectional
                                                                        else 1)
        kwargs: dict[str, Any] = {"batch_first": True, "bias": rnn.bias}
        if isinstance(rnn, nn.RNN):
            kwargs["nonlinearity"] = rnn.nonlinearity
        one = type(rnn)(size_in, rnn.hidden_size, 1, **kwargs)  # type: ignore[arg-type]
        for name in list(one._flat_weights_names):
            shared = getattr(rnn, f"{name[:-1]}{layer}{suffix}")
            setattr(one, name, shared)  # the user's own Parameter, not a copy
        return one

    def _zero(self, x: Tensor, cell: nn.RNNBase) -> Any:
        h0 = torch.zeros_like(x[:, 0, :1]).unsqueeze(0).expand(1, -1, cell.hidden_size)
        h0 = h0.contiguous()
        return (h0, h0) if self.is_lstm else h0

    def _scanned(self, x: Tensor, lengths: Tensor, lengths_given: bool) -> tuple[Tensor, Any]:
        """The form under torch.export (module doc): x (B, T, I), lengths (B,) int64."""
        why = supported(self.rnn)
        if why is not None:  # the native form would fix the time axis: refuse, not that
            raise ValueError(f"seqserve.pack.bidirectional under PyTorch's default ONNX "
                             f"exporter (dynamo): {why}; export with dynamo=False")
        output, h_n, c_n = run_within_lengths(self.rnn, x, lengths, batch_first=True)
        output = output if self.batch_first else output.transpose(0, 1)
        if self.is_lstm:
            return output, (h_n, None if lengths_given else c_n)
        return output, h_n

    def forward(self, x: Tensor, lengths: Tensor | None = None,
                hx: Any = None) -> tuple[Tensor, Any]:
        if hx is not None:
            raise ValueError("an initial state is not supported by the wrapper (zeros)")
        if not self.batch_first:
            x = x.transpose(0, 1)  # (B, T, I)
        max_len = x.shape[1]
        lengths_given = lengths is not None
        if lengths is None:  # every row full; built from x to follow its batch and device
            lengths = torch.ones_like(x[:, :, 0], dtype=torch.int64).sum(1)
        lengths = lengths.to(device=x.device, dtype=torch.int64)
        # torch.compile alone (not exporting) re-traces per length: a relu layer stays native
        if exporting() and (supported(self.rnn) is None or torch.compiler.is_exporting()):
            return self._scanned(x, lengths, lengths_given)
        mask = length_mask(lengths, max_len).unsqueeze(-1).to(x.dtype)  # (B, T, 1)
        last = (lengths - 1).clamp(min=0).view(-1, 1, 1)  # (B, 1, 1)
        rev = reverse_index(lengths, max_len)  # (B, T)
        hs: list[Tensor] = []
        cs: list[Tensor] = []
        layer_in = x
        dirs = 2 if self.bidirectional else 1
        for layer in range(self.num_layers):
            outs = []
            for d in range(dirs):
                cell = self.cells[layer * dirs + d]
                seq = gather_time(layer_in, rev) if d else layer_in
                out, state = cell(seq, self._zero(seq, cell))  # type: ignore[arg-type]
                out = gather_time(out, rev) if d else out  # back in the original order
                outs.append(out)
                at = torch.zeros_like(last) if d else last
                hs.append(out.gather(1, at.expand(-1, 1, out.shape[2])).squeeze(1))
                if self.is_lstm and not lengths_given:
                    cs.append(state[1][0])
            layer_in = torch.cat(outs, dim=-1) * mask
            if layer + 1 < self.num_layers and self.rnn.dropout and self.training:
                layer_in = nn.functional.dropout(layer_in, self.rnn.dropout)
        output = layer_in if self.batch_first else layer_in.transpose(0, 1)
        h_n = torch.stack(hs, dim=0)  # (L*D, B, H)
        if self.is_lstm:  # c_n only without lengths: nn.LSTM keeps no per-step cell state
            return output, (h_n, torch.stack(cs, dim=0) if cs else None)
        return output, h_n
