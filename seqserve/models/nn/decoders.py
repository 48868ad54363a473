"""The translator's three decoders: one step, and a whole teacher-forced target.

Per target step t, with y the (dropped-out) embedding of the previous target token y_{t-1},
m the encoder memory (S rows) and `score` the configured attention score:

    none      c   = the encoder's final states (fixed per request, Cho et al. 2014)
    (fixed)   s_t = RNN([y; c], s_{t-1})               o_t = tanh(W_o [s_t; c; y])

    bahdanau  a_t = softmax(score(s_{t-1}, m))         c_t = a_t m
              s_t = RNN([y; c_t], s_{t-1})             o_t = tanh(W_o [s_t; c_t; y])

    luong     h_t = RNN(y, h_{t-1})  or, with input feeding, RNN([y; o_{t-1}], h_{t-1}), o_0 = 0
              a_t = softmax(score(h_t, m))             c_t = a_t m
              o_t = tanh(W_c [h_t; c_t])

and logits_t = W_out dropout(o_t). s_{t-1} / h_t is the top layer's hidden state (h for
LSTM); the context enters the first layer. The attention row of step t is a_t: for Bahdanau
the alignment computed from s_{t-1}, for none all zeros (there is no attention).

The state carried between steps is the RNN state plus `extra`: the fixed context c (none),
o_{t-1} (luong with input feeding) or nothing; the translator packs both into its one flat
per-row state tensor. `run` is the teacher-forced target: one RNN call over the whole target
where nothing computed feeds the next step (luong without input feeding, none), else `step`
in a loop that steps the same `nn.GRU/LSTM/RNN` module `decode_step` does: a TorchScript-
scripted loop measured about 6% faster at the demo's size and no faster at H 64
(bench/bench_decoder_loop.py, docs/decoders.md), not worth a second implementation per cell.
"""

from __future__ import annotations

from typing import NamedTuple, Protocol

import torch
from torch import Tensor, nn

from seqserve.models.config import TranslatorConfig
from seqserve.models.nn.attention import DecoderAttention
from seqserve.models.nn.rnn import RNNState


class Memory(NamedTuple):
    """Encoder memory as the decoder reads it, rows aligned with the decoder's rows."""

    memory: Tensor
    """(B, S, D) zero on padding."""
    keys: Tensor | None
    """`attention.keys(memory)` (B, S, A), computed once per request; None without attention."""
    mask: Tensor
    """(B, S) bool, True on valid positions."""


class StepOut(NamedTuple):
    """What one step (or a teacher-forced run, with a time axis) produces."""

    out: Tensor
    """o_t, the vector the output layer reads: (B, H), or (B, T, H) from `run`."""
    hidden: RNNState
    """The RNN state after the step: h (L, B, H) or (h, c) for LSTM."""
    extra: Tensor | None
    """The extra recurrent input for the next step (see module doc) or None."""
    attention: Tensor
    """a_t: (B, S), or (B, T, S) from `run`; zeros for the fixed-context decoder."""


class DecoderParts(Protocol):
    """The translator modules a decoder step uses (the `Translator` has them)."""

    @property
    def config(self) -> TranslatorConfig: ...

    @property
    def decoder(self) -> nn.RNNBase: ...

    @property
    def attention(self) -> DecoderAttention | None: ...

    @property
    def combine(self) -> nn.Linear: ...


def top_hidden(hidden: RNNState) -> Tensor:
    """The top layer's hidden state (B, H) of h (L, B, H) or (h, c)."""
    h = hidden[0] if isinstance(hidden, tuple) else hidden
    return h[-1]  # (B, H)


def _attend(parts: DecoderParts, query: Tensor, mem: Memory) -> tuple[Tensor, Tensor]:
    """Context (B, Tq, D) and weights (B, Tq, S) of queries (B, Tq, H)."""
    assert parts.attention is not None
    return parts.attention(query, mem.memory, mem.mask, mem.keys)  # type: ignore[no-any-return]


def _no_attention(mem: Memory) -> Tensor:
    """All-zero attention (B, S) for the fixed-context decoder. Built from the memory and the
    mask, so the exported step graph keeps those inputs (the contract) although it needs
    neither (an unused input would be dropped from the ONNX graph)."""
    return torch.zeros_like(mem.memory[:, :, 0]).masked_fill(~mem.mask, 0.0)  # (B, S)


def fixed_step(parts: DecoderParts, y: Tensor, hidden: RNNState, context: Tensor,
               mem: Memory) -> StepOut:
    """Inputs: y (B, E), hidden, context c (B, D). Outputs: StepOut with extra = c."""
    out, hidden = parts.decoder(torch.cat([y, context], -1).unsqueeze(1), hidden)  # (B, 1, H)
    s = out[:, 0]  # (B, H)
    o = torch.tanh(parts.combine(torch.cat([s, context, y], -1)))  # (B, H)
    return StepOut(o, hidden, context, _no_attention(mem))


def bahdanau_step(parts: DecoderParts, y: Tensor, hidden: RNNState, mem: Memory) -> StepOut:
    """Inputs: y (B, E), hidden = s_{t-1}. Align from s_{t-1}, then step the RNN."""
    context, weights = _attend(parts, top_hidden(hidden).unsqueeze(1), mem)  # (B,1,D), (B,1,S)
    c = context[:, 0]  # (B, D)
    out, hidden = parts.decoder(torch.cat([y, c], -1).unsqueeze(1), hidden)  # (B, 1, H)
    o = torch.tanh(parts.combine(torch.cat([out[:, 0], c, y], -1)))  # (B, H)
    return StepOut(o, hidden, None, weights[:, 0])


def luong_step(parts: DecoderParts, y: Tensor, hidden: RNNState, feed: Tensor | None,
               mem: Memory) -> StepOut:
    """Inputs: y (B, E), hidden = h_{t-1}, feed = o_{t-1} (B, H) with input feeding, else
    None. Step the RNN, then align from h_t."""
    x = y if feed is None else torch.cat([y, feed], -1)  # (B, E [+ H])
    out, hidden = parts.decoder(x.unsqueeze(1), hidden)  # (B, 1, H)
    context, weights = _attend(parts, out, mem)  # (B, 1, D), (B, 1, S)
    o = torch.tanh(parts.combine(torch.cat([out, context], -1)))[:, 0]  # (B, H)
    return StepOut(o, hidden, o if feed is not None else None, weights[:, 0])


def step(parts: DecoderParts, y: Tensor, hidden: RNNState, extra: Tensor | None,
         mem: Memory) -> StepOut:
    """One step of the configured decoder. Inputs: y (B, E), hidden, extra (B, X) or None.
    Outputs: StepOut (out (B, H), hidden, extra, attention (B, S))."""
    kind = parts.config.decoder
    if kind == "none":
        assert extra is not None
        return fixed_step(parts, y, hidden, extra, mem)
    if kind == "bahdanau":
        return bahdanau_step(parts, y, hidden, mem)
    return luong_step(parts, y, hidden, extra, mem)


def run(parts: DecoderParts, y: Tensor, hidden: RNNState, extra: Tensor | None,
        mem: Memory) -> StepOut:
    """The decoder over a whole teacher-forced target (see module doc).

    Inputs:  y (B, T, E) embedded inputs, hidden, extra (B, X) or None, mem (B rows).
    Outputs: StepOut with out (B, T, H), attention (B, T, S).
    """
    cfg = parts.config
    if cfg.decoder == "luong" and not cfg.input_feeding:
        out, hidden = parts.decoder(y, hidden)  # (B, T, H)
        context, weights = _attend(parts, out, mem)  # (B, T, D), (B, T, S)
        o = torch.tanh(parts.combine(torch.cat([out, context], -1)))  # (B, T, H)
        return StepOut(o, hidden, None, weights)
    if cfg.decoder == "none":
        assert extra is not None
        context = extra.unsqueeze(1).expand(-1, y.shape[1], -1)  # (B, T, D)
        out, hidden = parts.decoder(torch.cat([y, context], -1), hidden)  # (B, T, H)
        o = torch.tanh(parts.combine(torch.cat([out, context, y], -1)))  # (B, T, H)
        zeros = _no_attention(mem).unsqueeze(1).expand(-1, y.shape[1], -1)  # (B, T, S)
        return StepOut(o, hidden, extra, zeros)
    outs: list[Tensor] = []
    rows: list[Tensor] = []
    for t in range(y.shape[1]):
        result = step(parts, y[:, t], hidden, extra, mem)
        hidden, extra = result.hidden, result.extra
        outs.append(result.out)  # (B, H)
        rows.append(result.attention)  # (B, S)
    return StepOut(torch.stack(outs, 1), hidden, extra, torch.stack(rows, 1))
