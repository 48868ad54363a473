"""nn.LSTM / nn.GRU / nn.RNN run within each row's length: what packing computes, exportable.

`run_within_lengths(rnn, x, lengths, hx)` runs a user's layer (its very weights; any number of
layers; uni- or bidirectional; an LSTM's projection included) over a right-padded batch and
returns what the layer returns for `pack_padded_sequence(x, lengths, enforce_sorted=False)`
followed by `pad_packed_sequence`: outputs zeroed past each row's length, and h_n (and an
LSTM's c_n) after each row's *last valid* step per layer and direction (the backward direction
runs over each row reversed within its length, so its final state is the one after the row's
first token), rows in their given order.

Each direction of each layer is a masked loop over time that keeps a row's state once the row
has ended (the cell equations of `models.nn.lm`, PyTorch's). Two forms of the same loop:
eagerly, under `torch.jit.trace` and under the TorchScript-based ONNX exporter, the scripted
loops of `models.nn.lm` (an ONNX Loop with a dynamic trip count); under torch.export (PyTorch's
default ONNX exporter, dynamo), a `scan` (an ONNX Scan), which torch.export does not unroll,
so the time axis stays dynamic.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from seqserve.models.nn.lm import (
    _gru_cell,
    _gru_loop,
    _lstm_cell,
    _lstm_loop,
    _rnn_cell,
    _rnn_loop,
)
from seqserve.models.nn.rnn import gather_time, length_mask, reverse_index


def supported(rnn: nn.Module) -> str | None:
    """None when `run_within_lengths` runs this layer, else why not."""
    if not isinstance(rnn, nn.LSTM | nn.GRU | nn.RNN):
        return f"{type(rnn).__name__} is not an nn.LSTM, nn.GRU or nn.RNN"
    if isinstance(rnn, nn.RNN) and rnn.nonlinearity != "tanh":
        return "nn.RNN(nonlinearity='relu') is not supported (tanh only)"
    return None


def exporting() -> bool:
    """Whether torch.export / dynamo is tracing (then the loop is a `scan`)."""
    return bool(torch.compiler.is_compiling() or torch.compiler.is_exporting())


def _scan(kind: str, xw: Tensor, valid: Tensor, w_hh: Tensor, extra: Tensor, h: Tensor,
          c: Tensor | None) -> tuple[Tensor, Tensor, Tensor | None]:
    """The masked loop as torch's `scan` (time-major inside): same results as the scripted
    loops. `extra`: an LSTM's projection (identity without one), else the recurrent bias."""
    from torch._higher_order_ops.scan import scan

    xs = (xw.transpose(0, 1), valid.transpose(0, 1))  # (T, B, G*H), (T, B, 1)
    h = h.contiguous()  # the carry keeps its init's layout
    c = None if c is None else c.contiguous()
    if kind == "lstm":
        assert c is not None
        peep = torch.zeros(3, c.shape[1], dtype=xw.dtype, device=xw.device)

        def lstm_step(carry: tuple[Tensor, Tensor], step: tuple[Tensor, Tensor]
                      ) -> tuple[tuple[Tensor, Tensor], Tensor]:
            (h0, c0), (x_t, keep) = carry, step
            h1, c1 = _lstm_cell(x_t, w_hh, extra, peep, h0, c0, False)
            return (torch.where(keep, h1, h0), torch.where(keep, c1, c0)), h1

        (h, c), ys = scan(lstm_step, (h, c), xs)
        return ys.transpose(0, 1), h, c
    cell = _gru_cell if kind == "gru" else _rnn_cell

    def step_fn(h0: Tensor, step: tuple[Tensor, Tensor]) -> tuple[Tensor, Tensor]:
        x_t, keep = step
        h1 = cell(x_t, w_hh, extra, h0)
        return torch.where(keep, h1, h0), h1

    h, ys = scan(step_fn, h, xs)
    return ys.transpose(0, 1), h, None


def _direction(rnn: nn.RNNBase, kind: str, layer: int, suffix: str, seq: Tensor,
               valid: Tensor, h: Tensor, c: Tensor | None
               ) -> tuple[Tensor, Tensor, Tensor | None]:
    """One direction of one layer over seq (B, T, I) -> (out (B, T, P), h, c)."""
    w_ih = getattr(rnn, f"weight_ih_l{layer}{suffix}")
    w_hh = getattr(rnn, f"weight_hh_l{layer}{suffix}")
    if rnn.bias:
        b_ih = getattr(rnn, f"bias_ih_l{layer}{suffix}")
        b_hh = getattr(rnn, f"bias_hh_l{layer}{suffix}")
    else:
        b_ih = b_hh = torch.zeros(w_hh.shape[0], dtype=seq.dtype, device=seq.device)
    scanning = exporting()
    if kind == "lstm":
        assert c is not None
        proj = getattr(rnn, "proj_size", 0)
        w_hr = (getattr(rnn, f"weight_hr_l{layer}{suffix}") if proj else
                torch.eye(rnn.hidden_size, dtype=seq.dtype, device=seq.device))
        xw = F.linear(seq, w_ih, b_ih + b_hh)
        if scanning:
            return _scan(kind, xw, valid, w_hh, w_hr, h, c)
        peep = torch.zeros(3, rnn.hidden_size, dtype=seq.dtype, device=seq.device)
        out, h, c = _lstm_loop(xw, valid, w_hh, w_hr, peep, h, c, False)
        return out, h, c
    xw = F.linear(seq, w_ih, b_ih)
    if scanning:
        return _scan(kind, xw, valid, w_hh, b_hh, h, None)
    loop = _gru_loop if kind == "gru" else _rnn_loop
    out, h = loop(xw, valid, w_hh, b_hh, h)
    return out, h, None


def run_within_lengths(rnn: nn.RNNBase, x: Tensor, lengths: Tensor, hx: Any = None,
                       batch_first: bool | None = None) -> tuple[Tensor, Tensor, Tensor | None]:
    """(output, h_n, c_n or None) of `rnn` over x within each row's length (module doc).

    x: (B, T, I) if `batch_first` (default: the layer's own) else (T, B, I); output in the
    same layout; h_n (layers x directions, B, P); hx: None (zeros), h_0, or an LSTM's
    (h_0, c_0)."""
    why = supported(rnn)
    if why is not None:
        raise ValueError(why)
    if batch_first is None:
        batch_first = bool(rnn.batch_first)
    if not batch_first:
        x = x.transpose(0, 1)  # (B, T, I)
    kind = "lstm" if isinstance(rnn, nn.LSTM) else "gru" if isinstance(rnn, nn.GRU) else "rnn"
    lengths = lengths.to(device=x.device, dtype=torch.int64)
    max_len = x.shape[1]
    valid = length_mask(lengths, max_len).unsqueeze(-1)  # (B, T, 1)
    dirs = 2 if rnn.bidirectional else 1
    rev = reverse_index(lengths, max_len) if dirs == 2 else None  # (B, T)
    out_size = getattr(rnn, "proj_size", 0) or rnn.hidden_size
    zeros = x[:, 0, :1] * 0.0  # (B, 1): follows the batch, dtype and device
    h0: Any = None
    c0: Any = None
    if hx is not None:
        h0, c0 = (hx[0], hx[1]) if kind == "lstm" else (hx, None)
    hs: list[Tensor] = []
    cs: list[Tensor] = []
    layer_in = x
    for layer in range(rnn.num_layers):
        outs = []
        for d in range(dirs):
            index = layer * dirs + d
            h = zeros.expand(-1, out_size) if h0 is None else h0[index]
            c = None
            if kind == "lstm":
                c = zeros.expand(-1, rnn.hidden_size) if c0 is None else c0[index]
            seq = gather_time(layer_in, rev) if rev is not None and d else layer_in
            out, h, c = _direction(rnn, kind, layer, "_reverse" if d else "", seq, valid, h, c)
            outs.append(gather_time(out, rev) if rev is not None and d else out)
            hs.append(h)
            if c is not None:
                cs.append(c)
        layer_in = (torch.cat(outs, dim=-1) if dirs == 2 else outs[0]) * valid.to(x.dtype)
        if layer + 1 < rnn.num_layers and rnn.dropout and rnn.training:
            layer_in = F.dropout(layer_in, rnn.dropout)
    output = layer_in if batch_first else layer_in.transpose(0, 1)
    return output, torch.stack(hs, dim=0), torch.stack(cs, dim=0) if cs else None
