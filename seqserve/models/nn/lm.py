"""The language model: embedding -> 1-3 unidirectional RNN layers -> (tied) softmax over tokens.

P(x_t | x_<t) with an Elman RNN (tanh), GRU or LSTM (the LSTM variants of
models/nn/lstm_variants.py included: projection, peepholes, CIFG), dropout on the embeddings,
between layers and before the output, and optional weight tying (the output projection is the
embedding matrix; a linear bridge maps the top layer to the embedding width when they differ).

Three entry points share one set of weights:

- `forward(ids, state)` trains: native nn.LSTM/GRU/RNN layers (or `VariantLSTM`) over a chunk,
  the recurrent state passed in and out, so truncated BPTT carries it across chunks;
- `prefill(input_ids, lengths)` serves prompts and scores texts: a right-padded batch ->
  the flat state after each row's own last token (B, S) and log-probs of the next token at
  every position (B, T, V), zero on padding. The state must be taken at each row's length,
  which the native layers cannot do for an LSTM's cell state (nn.LSTM returns the last
  position's state only, and packed sequences do not export), so prefill runs the same cell
  equations as a scripted loop over time that keeps a row's state once the row has ended
  (`torch.where` on the length mask): exported as an ONNX Loop with a dynamic trip count,
  kept as a scripted call by TorchScript;
- `lm_step(prev_ids, state)` advances every live sequence by one token: (R,) ids and the flat
  state (R, S) -> new state (R, S) and log-probs (R, V), the cell equations once (no loop).

The flat state of a row concatenates, layer by layer, h (P = proj_size or H) and, for LSTMs,
c (H). The cell equations are PyTorch's (gate orders: LSTM i, f, g, o; GRU r, z, n), so the
native training layers and the serving graphs agree to float rounding (tested).
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from seqserve.models.config import RecurrentConfig, check_ids, check_recurrent, check_variant
from seqserve.models.nn.lstm_variants import VariantLSTM
from seqserve.models.nn.rnn import RNNState, detach_state, init_forget_bias, length_mask, make_layer

CELLS = ("rnn", "gru", "lstm")


@dataclass(frozen=True)
class LMConfig(RecurrentConfig):
    """Embedding -> stacked unidirectional RNN -> softmax over the vocabulary."""

    vocab_size: int = 1024
    hidden_size: int = 256
    max_length: int = 256
    tie_weights: bool = False
    """Share the embedding matrix with the output projection (a bridge maps the top layer's
    width to E when it differs)."""
    bos_id: int = 2
    """Start token: every prompt and scored text is read after it."""
    eos_id: int = 3
    """End of a document: generation stops there (finish_reason "eos")."""

    def __post_init__(self) -> None:
        check_recurrent(self, CELLS, ("vocab_size", "embed_size", "hidden_size", "max_length"))
        check_variant(self)
        check_ids(self, ("pad_id", "bos_id", "eos_id"))

    @property
    def output_size(self) -> int:
        """Width of h: P with a projection, else H."""
        return self.proj_size or self.hidden_size

    @property
    def layer_state(self) -> int:
        """Flat state width of one layer: h, plus c for an LSTM."""
        return self.output_size + (self.hidden_size if self.cell == "lstm" else 0)

    @property
    def state_dim(self) -> int:
        """Flat state width per row (S)."""
        return self.num_layers * self.layer_state


# -- the cell equations (PyTorch's), once per step, and as masked loops over time ----------

def _lstm_cell(gates_x: Tensor, w_hh: Tensor, w_hr: Tensor, peep: Tensor, h: Tensor, c: Tensor,
               cifg: bool) -> tuple[Tensor, Tensor]:
    """One LSTM step. gates_x (B, G*H) = x W_ih^T + b_ih + b_hh; h (B, P), c (B, H)."""
    gates = gates_x + torch.mm(h, w_hh.t())  # (B, G*H)
    if cifg:
        f_in, g_in, o_in = gates.chunk(3, 1)
        f = torch.sigmoid(f_in + peep[1] * c)
        i = 1.0 - f
    else:
        i_in, f_in, g_in, o_in = gates.chunk(4, 1)
        i = torch.sigmoid(i_in + peep[0] * c)
        f = torch.sigmoid(f_in + peep[1] * c)
    c = f * c + i * torch.tanh(g_in)  # (B, H)
    o = torch.sigmoid(o_in + peep[2] * c)
    return torch.mm(o * torch.tanh(c), w_hr.t()), c  # (B, P), (B, H)


def _gru_cell(gates_x: Tensor, w_hh: Tensor, b_hh: Tensor, h: Tensor) -> Tensor:
    """One GRU step. gates_x (B, 3H) = x W_ih^T + b_ih; h (B, H)."""
    gates_h = torch.mm(h, w_hh.t()) + b_hh  # (B, 3H)
    xr, xz, xn = gates_x.chunk(3, 1)
    hr, hz, hn = gates_h.chunk(3, 1)
    r = torch.sigmoid(xr + hr)
    z = torch.sigmoid(xz + hz)
    n = torch.tanh(xn + r * hn)
    return (1.0 - z) * n + z * h


def _rnn_cell(gates_x: Tensor, w_hh: Tensor, b_hh: Tensor, h: Tensor) -> Tensor:
    """One Elman step. gates_x (B, H) = x W_ih^T + b_ih; h (B, H)."""
    return torch.tanh(gates_x + torch.mm(h, w_hh.t()) + b_hh)


def _lstm_loop_eager(xw: Tensor, valid: Tensor, w_hh: Tensor, w_hr: Tensor, peep: Tensor,
                     h: Tensor, c: Tensor, cifg: bool) -> tuple[Tensor, Tensor, Tensor]:
    """xw (B, T, G*H), valid (B, T, 1) bool -> out (B, T, P), h and c after each row's end."""
    outs: list[Tensor] = []
    for t in range(xw.shape[1]):
        h_new, c_new = _lstm_cell(xw[:, t], w_hh, w_hr, peep, h, c, cifg)
        keep = valid[:, t]  # (B, 1)
        h = torch.where(keep, h_new, h)
        c = torch.where(keep, c_new, c)
        outs.append(h_new)
    return torch.stack(outs, 1), h, c


def _gru_loop_eager(xw: Tensor, valid: Tensor, w_hh: Tensor, b_hh: Tensor,
                    h: Tensor) -> tuple[Tensor, Tensor]:
    outs: list[Tensor] = []
    for t in range(xw.shape[1]):
        h_new = _gru_cell(xw[:, t], w_hh, b_hh, h)
        h = torch.where(valid[:, t], h_new, h)
        outs.append(h_new)
    return torch.stack(outs, 1), h


def _rnn_loop_eager(xw: Tensor, valid: Tensor, w_hh: Tensor, b_hh: Tensor,
                    h: Tensor) -> tuple[Tensor, Tensor]:
    outs: list[Tensor] = []
    for t in range(xw.shape[1]):
        h_new = _rnn_cell(xw[:, t], w_hh, b_hh, h)
        h = torch.where(valid[:, t], h_new, h)
        outs.append(h_new)
    return torch.stack(outs, 1), h


with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)  # torch.jit.script is "deprecated"
    _lstm_loop = torch.jit.script(_lstm_loop_eager)
    _gru_loop = torch.jit.script(_gru_loop_eager)
    _rnn_loop = torch.jit.script(_rnn_loop_eager)


class LanguageModel(nn.Module):
    """See module doc."""

    def __init__(self, config: LMConfig) -> None:
        super().__init__()
        self.config = cfg = config
        self.tbptt = 0
        """Chunk length the trainer uses (informational; chunking happens in the trainer)."""
        self.embedding = nn.Embedding(cfg.vocab_size, cfg.embed_size, padding_idx=cfg.pad_id)
        self.dropout = nn.Dropout(cfg.dropout)
        self.layers = nn.ModuleList(
            make_layer(cfg.cell, cfg.embed_size if i == 0 else cfg.output_size, cfg.hidden_size,
                       cfg.proj_size, cfg.peephole, cfg.cifg)
            for i in range(cfg.num_layers))
        self.rnn_form = "loop"  # prefill always runs the scripted loop (module doc)
        out = cfg.output_size
        self.bridge = nn.Linear(out, cfg.embed_size) if cfg.tie_weights and \
            out != cfg.embed_size else None
        self.output = nn.Linear(cfg.embed_size if cfg.tie_weights else out, cfg.vocab_size)
        if cfg.tie_weights:
            self.output.weight = self.embedding.weight
        init_forget_bias(self, cfg.forget_bias)

    # -- training ---------------------------------------------------------------------------

    def forward(self, ids: Tensor, state: list[RNNState] | None = None
                ) -> tuple[Tensor, list[RNNState]]:
        """ids (B, T) -> logits (B, T, V) and each layer's state after the chunk (pass it,
        detached, into the next chunk: truncated BPTT)."""
        x = self.dropout(self.embedding(ids))  # (B, T, E)
        new: list[RNNState] = []
        for i, layer in enumerate(self.layers):
            if i > 0:
                x = self.dropout(x)
            x, s = layer(x, None if state is None else state[i])  # (B, T, P)
            new.append(s)
        return self._logits(self.dropout(x)), new

    def _logits(self, x: Tensor) -> Tensor:
        if self.bridge is not None:
            x = self.bridge(x)
        return self.output(x)  # type: ignore[no-any-return]

    @staticmethod
    def detach(state: list[RNNState]) -> list[RNNState]:
        return [detach_state(s) for s in state]

    # -- serving ----------------------------------------------------------------------------

    def _weights(self, layer: nn.Module) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        return (layer.weight_ih_l0, layer.weight_hh_l0, layer.bias_ih_l0,  # type: ignore[return-value]
                layer.bias_hh_l0)

    def _lstm_extras(self, layer: nn.Module, like: Tensor) -> tuple[Tensor, Tensor]:
        """w_hr (P, H) and peepholes (3, H): identity and zeros for a plain LSTM."""
        h = self.config.hidden_size
        if isinstance(layer, VariantLSTM):
            w_hr = layer.weight_hr_l0 if layer.weight_hr_l0 is not None else layer._identity
            peep = layer.peephole_l0 if layer.peephole_l0 is not None else layer._no_peephole
            return w_hr, peep  # type: ignore[return-value]
        eye = torch.eye(h, dtype=like.dtype, device=like.device)
        return eye, torch.zeros(3, h, dtype=like.dtype, device=like.device)

    def _split(self, state: Tensor) -> list[tuple[Tensor, Tensor | None]]:
        """Flat (R, S) -> per layer (h (R, P), c (R, H) or None)."""
        cfg, out = self.config, []
        for i in range(cfg.num_layers):
            at = i * cfg.layer_state
            h = state[:, at : at + cfg.output_size]
            c = state[:, at + cfg.output_size : at + cfg.layer_state] if cfg.cell == "lstm" \
                else None
            out.append((h, c))
        return out

    def prefill(self, input_ids: Tensor, lengths: Tensor, state: Tensor | None = None
                ) -> tuple[Tensor, Tensor]:
        """input_ids (B, T), lengths (B,)[, state (B, S): the flat state to start from, zeros
        when not given] -> state (B, S) after each row's last token, log_probs (B, T, V) of the
        next token at every position (0 on padding). From a state, the prefill continues a
        sequence (a cached prefix's, a client's state token) exactly as `lm_step` would, one
        token at a time, with the same cell equations."""
        cfg = self.config
        valid = length_mask(lengths, input_ids.shape[1]).unsqueeze(-1)  # (B, T, 1) bool
        x = self.embedding(input_ids)  # (B, T, E)
        if state is None:
            state = (x[:, 0, :1] * 0.0).expand(-1, cfg.state_dim)  # follows batch and device
        finals: list[Tensor] = []
        for layer, (h0, c0) in zip(self.layers, self._split(state), strict=True):
            w_ih, w_hh, b_ih, b_hh = self._weights(layer)
            if cfg.cell == "lstm":
                assert c0 is not None
                xw = F.linear(x, w_ih, b_ih + b_hh)
                w_hr, peep = self._lstm_extras(layer, x)
                x, h, c = _lstm_loop(xw, valid, w_hh, w_hr, peep, h0, c0, cfg.cifg)
                finals += [h, c]
            else:
                loop = _gru_loop if cfg.cell == "gru" else _rnn_loop
                x, h = loop(F.linear(x, w_ih, b_ih), valid, w_hh, b_hh, h0)
                finals.append(h)
        log_probs = torch.log_softmax(self._logits(x), dim=-1)  # (B, T, V)
        log_probs = log_probs.masked_fill(~valid, 0.0)
        return torch.cat(finals, dim=-1), log_probs

    def lm_step(self, prev_ids: Tensor, state: Tensor) -> tuple[Tensor, Tensor]:
        """prev_ids (R,), state (R, S) -> new_state (R, S), log_probs (R, V)."""
        cfg = self.config
        x = self.embedding(prev_ids)  # (R, E)
        new: list[Tensor] = []
        for layer, (h, c) in zip(self.layers, self._split(state), strict=True):
            w_ih, w_hh, b_ih, b_hh = self._weights(layer)
            if cfg.cell == "lstm":
                assert c is not None
                w_hr, peep = self._lstm_extras(layer, x)
                h, c = _lstm_cell(F.linear(x, w_ih, b_ih + b_hh), w_hh, w_hr, peep, h, c,
                                  cfg.cifg)
                new += [h, c]
            elif cfg.cell == "gru":
                h = _gru_cell(F.linear(x, w_ih, b_ih), w_hh, b_hh, h)
                new.append(h)
            else:
                h = _rnn_cell(F.linear(x, w_ih, b_ih), w_hh, b_hh, h)
                new.append(h)
            x = h
        return torch.cat(new, dim=-1), torch.log_softmax(self._logits(x), dim=-1)


def perplexity(nll_sum: float, tokens: int) -> float:
    """exp(mean negative log-likelihood per token), inf when the mean overflows."""
    if tokens <= 0:
        return float("nan")
    mean = nll_sum / tokens
    return math.exp(mean) if mean < 700 else float("inf")
