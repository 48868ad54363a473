"""LSTM variants nn.LSTM lacks as an exportable op: peephole connections, a coupled
input-forget gate (CIFG) and a recurrent projection (proj_size; nn.LSTM has it, but the ONNX
exporter refuses LSTMs with projections).

`VariantLSTM` is one unidirectional batch-first layer with nn.LSTM's calling convention
(`(x, (h0, c0)) -> (out, (h, c))`). The input transform x W_ih^T + b runs for all steps at
once; the recurrence is a loop over time in a TorchScript function (`_recurrence`), so a
traced model keeps the loop: the legacy ONNX exporter turns it into an ONNX `Loop` over the
dynamic sequence length and `torch.jit.trace` keeps it as a scripted call. Manifests call this
form "loop" (versus "native" ONNX LSTM/GRU/RNN ops).

Cell (per step t, sigma = sigmoid, * elementwise; p_* are peephole vectors, zero when off):
    i = sigma(W_i x + U_i h + p_i * c_prev)          CIFG: i = 1 - f
    f = sigma(W_f x + U_f h + p_f * c_prev)
    g = tanh(W_g x + U_g h)
    c = f * c_prev + i * g
    o = sigma(W_o x + U_o h + p_o * c)
    h = W_hr (o * tanh(c))                           W_hr = identity without projection
"""

from __future__ import annotations

import math
import warnings

import torch
from torch import Tensor, nn


def _recurrence_eager(xw: Tensor, w_hh: Tensor, w_hr: Tensor, peep: Tensor, h: Tensor, c: Tensor,
                cifg: bool) -> tuple[Tensor, Tensor, Tensor]:
    """The time loop. Inputs: xw (B, T, G*H) input transforms with biases (G = 3 with CIFG,
    else 4), w_hh (G*H, P), w_hr (P, H), peep (3, H), h (B, P), c (B, H).
    Outputs: out (B, T, P), h (B, P), c (B, H)."""
    outs: list[Tensor] = []
    for t in range(xw.shape[1]):
        gates = xw[:, t] + torch.mm(h, w_hh.t())  # (B, G*H)
        if cifg:
            f_in, g_in, o_in = gates.chunk(3, 1)  # (B, H) each
            f = torch.sigmoid(f_in + peep[1] * c)
            i = 1.0 - f
        else:
            i_in, f_in, g_in, o_in = gates.chunk(4, 1)  # (B, H) each
            i = torch.sigmoid(i_in + peep[0] * c)
            f = torch.sigmoid(f_in + peep[1] * c)
        c = f * c + i * torch.tanh(g_in)  # (B, H)
        o = torch.sigmoid(o_in + peep[2] * c)
        h = torch.mm(o * torch.tanh(c), w_hr.t())  # (B, P)
        outs.append(h)
    return torch.stack(outs, 1), h, c  # (B, T, P), (B, P), (B, H)


with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)  # torch.jit.script is "deprecated"
    _recurrence = torch.jit.script(_recurrence_eager)


class VariantLSTM(nn.Module):
    """One unidirectional batch-first LSTM layer with optional peepholes, CIFG and projection.

    Inputs:  x (B, T, I), state (h0 (1, B, P), c0 (1, B, H)) or None (zeros).
    Outputs: out (B, T, P), (h (1, B, P), c (1, B, H)); P = proj_size or H.
    """

    def __init__(self, input_size: int, hidden_size: int, proj_size: int = 0,
                 peephole: bool = False, cifg: bool = False) -> None:
        super().__init__()
        self.hidden_size = hidden_size
        self.proj_size = proj_size
        self.output_size = proj_size or hidden_size
        self.cifg = cifg
        gates = (3 if cifg else 4) * hidden_size
        self.weight_ih_l0 = nn.Parameter(torch.empty(gates, input_size))
        self.weight_hh_l0 = nn.Parameter(torch.empty(gates, self.output_size))
        self.bias_ih_l0 = nn.Parameter(torch.empty(gates))
        self.bias_hh_l0 = nn.Parameter(torch.empty(gates))
        self.weight_hr_l0 = nn.Parameter(torch.empty(proj_size, hidden_size)) if proj_size else None
        self.peephole_l0 = nn.Parameter(torch.empty(3, hidden_size)) if peephole else None
        if not peephole:
            self.register_buffer("_no_peephole", torch.zeros(3, hidden_size), persistent=False)
        if not proj_size:
            self.register_buffer("_identity", torch.eye(hidden_size), persistent=False)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """nn.LSTM's init: every weight U(-1/sqrt(H), 1/sqrt(H))."""
        bound = 1.0 / math.sqrt(self.hidden_size)
        for p in self.parameters():
            nn.init.uniform_(p, -bound, bound)

    def forward(self, x: Tensor, state: tuple[Tensor, Tensor] | None = None
                ) -> tuple[Tensor, tuple[Tensor, Tensor]]:
        xw = torch.nn.functional.linear(x, self.weight_ih_l0,
                                        self.bias_ih_l0 + self.bias_hh_l0)  # (B, T, G*H)
        if state is None:
            zeros = xw[:, 0, :1] * 0.0  # (B, 1) built from x: no device or batch frozen
            h = zeros.expand(-1, self.output_size)  # (B, P)
            c = zeros.expand(-1, self.hidden_size)  # (B, H)
        else:
            h, c = state[0][0], state[1][0]  # (B, P), (B, H)
        w_hr = self.weight_hr_l0 if self.weight_hr_l0 is not None else self._identity
        peep = self.peephole_l0 if self.peephole_l0 is not None else self._no_peephole
        out, h, c = _recurrence(xw, self.weight_hh_l0, w_hr, peep, h, c, self.cifg)
        return out, (h.unsqueeze(0), c.unsqueeze(0))  # (B, T, P), ((1, B, P), (1, B, H))
