"""A padding-safe stacked (bi)directional RNN that exports to ONNX with dynamic axes.

`nn.LSTM(bidirectional=True)` over a right-padded batch starts the backward direction on pad
tokens, so a short row's outputs depend on how long its neighbours are. `pack_padded_sequence`
fixes that but does not survive ONNX export. Here every layer runs two unidirectional modules:
the forward one over the padded batch as is (causal, so padding after a row cannot reach its
valid positions) and the backward one over each row reversed *within its own length*
(index[b, t] = len_b - 1 - t for t < len_b, else t), gathered back afterwards. Padded output
positions are zeroed. Both directions export as native ONNX LSTM/GRU/RNN ops, or, for the
LSTM variants (projection, peepholes, CIFG: models/nn/lstm_variants.py), as an ONNX Loop of
standard ops; `rnn_form` says which ("native" | "loop").

Truncated BPTT (`tbptt = K > 0`, training only): each direction of each layer runs in chunks of
K steps, carrying its recurrent state into the next chunk detached, so no gradient crosses a
chunk boundary through the recurrence. The forward direction chunks left to right from t = 0;
the backward direction runs over each row reversed within its length, so its chunks go right
to left from each row's own last token. The values are those of full BPTT; only gradients are
cut. Layers above still see every position of the layer below at the same time step.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from seqserve.models.config import EncoderConfig
from seqserve.models.nn.lstm_variants import VariantLSTM

RNNState = Tensor | tuple[Tensor, Tensor]
_CELL_MODULES: dict[str, type[nn.RNN] | type[nn.LSTM] | type[nn.GRU]] = {
    "rnn": nn.RNN, "lstm": nn.LSTM, "gru": nn.GRU}


def make_rnn(cell: str, input_size: int, hidden_size: int, num_layers: int = 1,
             dropout: float = 0.0) -> nn.RNN | nn.LSTM | nn.GRU:
    """A batch-first unidirectional RNN module of the given cell type (tanh for rnn)."""
    module = _CELL_MODULES[cell]
    return module(input_size, hidden_size, num_layers=num_layers, batch_first=True,
                  dropout=dropout if num_layers > 1 else 0.0)


def make_layer(cell: str, input_size: int, hidden_size: int, proj_size: int = 0,
               peephole: bool = False, cifg: bool = False) -> nn.Module:
    """One batch-first unidirectional layer: native nn.RNN/LSTM/GRU, or `VariantLSTM` when an
    LSTM variant is asked for. Both take `(x, state)` and return `(out, state)`."""
    if proj_size or peephole or cifg:
        if cell != "lstm":
            raise ValueError(f"proj_size/peephole/cifg need cell='lstm', not {cell!r}")
        return VariantLSTM(input_size, hidden_size, proj_size, peephole, cifg)
    return make_rnn(cell, input_size, hidden_size)


def init_forget_bias(model: nn.Module, bias: float | None) -> int:
    """Set the forget-gate bias of every LSTM layer in `model` to `bias` at initialisation:
    b_ih[f] = bias and b_hh[f] = 0, so the gate starts at sigmoid(bias) (None: leave PyTorch's
    uniform init). Covers nn.LSTM (all layers and directions) and VariantLSTM (gate order
    i, f, g, o, or f, g, o with CIFG). Returns the number of LSTM layers changed."""
    if bias is None:
        return 0
    changed = 0
    for module in model.modules():
        if isinstance(module, nn.LSTM | VariantLSTM):
            gate = 0 if getattr(module, "cifg", False) else 1  # the forget gate's block
            size = module.hidden_size
            with torch.no_grad():
                for name, param in module.named_parameters():
                    if name.startswith("bias_ih"):
                        param[gate * size : (gate + 1) * size] = bias
                    elif name.startswith("bias_hh"):
                        param[gate * size : (gate + 1) * size] = 0.0
            changed += 1
    return changed


def detach_state(state: RNNState) -> RNNState:
    """The recurrent state cut from the graph (h, or (h, c) for LSTMs)."""
    if isinstance(state, tuple):
        return state[0].detach(), state[1].detach()
    return state.detach()


def run_chunked(layer: nn.Module, x: Tensor, chunk: int) -> Tensor:
    """Truncated BPTT: run `layer` over x (B, T, I) in chunks of `chunk` steps, passing the
    final state of each chunk detached into the next. Returns out (B, T, P)."""
    outs: list[Tensor] = []
    state: RNNState | None = None
    for start in range(0, x.shape[1], chunk):
        out, state = layer(x[:, start : start + chunk], state)  # (B, K, P)
        assert state is not None
        state = detach_state(state)
        outs.append(out)
    return torch.cat(outs, dim=1)  # (B, T, P)


def time_positions(lengths: Tensor, max_len: int) -> Tensor:
    """(1, T) int64 positions 0..T-1 on the device of `lengths`.

    Built from `lengths` by tensor ops rather than `torch.arange(..., device=...)`, because
    `torch.jit.trace` freezes an explicit device into the graph: a TorchScript twin traced on
    the CPU would then mix CPU and CUDA tensors when run on a GPU.
    """
    ones = torch.ones_like(lengths[:1]).expand(max_len)  # (T,)
    return (ones.cumsum(0) - 1).unsqueeze(0)  # (1, T)


def length_mask(lengths: Tensor, max_len: int) -> Tensor:
    """(B,) lengths -> (B, T) bool, True on valid positions."""
    return time_positions(lengths, max_len) < lengths.unsqueeze(1)  # (B, T)


def reverse_index(lengths: Tensor, max_len: int) -> Tensor:
    """(B, T) int64 index that reverses each row within its length and leaves padding in place.

    index[b, t] = lengths[b] - 1 - t for t < lengths[b], else t. It is its own inverse.
    """
    positions = time_positions(lengths, max_len)  # (1, T)
    reversed_pos = lengths.unsqueeze(1) - 1 - positions  # (B, T)
    return torch.where(positions < lengths.unsqueeze(1), reversed_pos, positions)  # (B, T)


def gather_time(x: Tensor, index: Tensor) -> Tensor:
    """Reorder the time axis of x (B, T, D) per row with index (B, T)."""
    return x.gather(1, index.unsqueeze(-1).expand_as(x))  # (B, T, D)


def zero_state(layer: nn.RNNBase, x: Tensor) -> Tensor | tuple[Tensor, Tensor]:
    """The zero initial state of a native unidirectional layer for x (B, T, I), built from x.

    Passed explicitly because a layer called without one makes its zeros in Python, and
    `torch.jit.trace` then bakes a CPU constant into the TorchScript twin (it fails on CUDA
    with "hidden tensor at cpu"); this way the state follows the input's device and batch.
    """
    base = torch.zeros_like(x[:, 0, :1]).unsqueeze(0)  # (1, B, 1)
    out_size = getattr(layer, "proj_size", 0) or layer.hidden_size
    h0 = base.expand(layer.num_layers, -1, out_size).contiguous()  # (L, B, P)
    if isinstance(layer, nn.LSTM):
        c0 = base.expand(layer.num_layers, -1, layer.hidden_size).contiguous()  # (L, B, H)
        return h0, c0
    return h0


class PaddingSafeRNN(nn.Module):
    """Stacked RNN/LSTM/GRU, optionally bidirectional, whose rows ignore batch padding.

    Inputs:  x (B, T, I) float, lengths (B,) int64 with 1 <= lengths <= T.
    Outputs: outputs (B, T, D*H) with zeros on padded positions (D = 2 if bidirectional),
             final (L, B, D*H): each layer's last hidden state per direction, taken at the
             row's own last token (forward) and first token (backward), directions concatenated.
    """

    def __init__(self, cell: str, input_size: int, hidden_size: int, num_layers: int = 1,
                 bidirectional: bool = True, dropout: float = 0.0, proj_size: int = 0,
                 peephole: bool = False, cifg: bool = False) -> None:
        super().__init__()
        self.cell = cell
        self.hidden_size = hidden_size
        self.num_layers = num_layers
        self.bidirectional = bidirectional
        self.num_directions = 2 if bidirectional else 1
        self.output_size = (proj_size or hidden_size) * self.num_directions
        self.rnn_form = "loop" if (proj_size or peephole or cifg) else "native"
        self.tbptt = 0
        """Truncated-BPTT chunk length while training (0 = full BPTT); see module doc."""
        self.dropout = nn.Dropout(dropout)
        self.forward_layers = nn.ModuleList()
        self.backward_layers = nn.ModuleList()
        for layer in range(num_layers):
            size_in = input_size if layer == 0 else self.output_size
            for direction in range(self.num_directions):
                layers = self.backward_layers if direction else self.forward_layers
                layers.append(make_layer(cell, size_in, hidden_size, proj_size, peephole, cifg))

    def _run(self, layer: nn.Module, x: Tensor) -> Tensor:
        """One direction of one layer over x (B, T, I) -> (B, T, P), chunked under TBPTT."""
        if self.training and self.tbptt > 0:
            return run_chunked(layer, x, self.tbptt)
        if isinstance(layer, nn.RNNBase):
            out, _ = layer(x, zero_state(layer, x))
        else:
            out, _ = layer(x)
        return out  # type: ignore[no-any-return]

    def forward(self, x: Tensor, lengths: Tensor) -> tuple[Tensor, Tensor]:
        max_len = x.shape[1]
        mask = length_mask(lengths, max_len).unsqueeze(-1).to(x.dtype)  # (B, T, 1)
        last = (lengths - 1).clamp(min=0)  # (B,)
        rev = reverse_index(lengths, max_len) if self.bidirectional else None  # (B, T)
        finals: list[Tensor] = []
        layer_in = x  # (B, T, I)
        for layer in range(self.num_layers):
            if layer > 0:
                layer_in = self.dropout(layer_in)
            fwd = self._run(self.forward_layers[layer], layer_in)  # (B, T, H)
            index = last.view(-1, 1, 1).expand(-1, 1, fwd.shape[2])  # (B, 1, H)
            fwd_final = fwd.gather(1, index).squeeze(1)  # (B, H) at each row's last token
            if rev is None:
                out, final = fwd, fwd_final
            else:
                bwd_in = gather_time(layer_in, rev)  # (B, T, I) each row reversed in its length
                bwd_rev = self._run(self.backward_layers[layer], bwd_in)  # (B, T, H)
                bwd = gather_time(bwd_rev, rev)  # (B, T, H) back in original order
                out = torch.cat([fwd, bwd], dim=-1)  # (B, T, 2H)
                final = torch.cat([fwd_final, bwd[:, 0]], dim=-1)  # (B, 2H)
            layer_in = out * mask  # (B, T, D*H) zero padded positions
            finals.append(final)
        return layer_in, torch.stack(finals, dim=0)  # (B, T, D*H), (L, B, D*H)


def token_encoder(c: EncoderConfig) -> tuple[nn.Embedding, PaddingSafeRNN]:
    """The start of every model over token ids with one (bi)RNN stack (classifier, tagger:
    their configs' embedding and recurrent fields): the embedding (its pad row kept at zero)
    and the padding-safe RNN over it, made in that order."""
    return (nn.Embedding(c.vocab_size, c.embed_size, padding_idx=c.pad_id),
            PaddingSafeRNN(c.cell, c.embed_size, c.hidden_size, c.num_layers, c.bidirectional,
                           c.dropout, c.proj_size, c.peephole, c.cifg))
