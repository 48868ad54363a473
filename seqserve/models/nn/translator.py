"""Encoder-decoder translator with a flat, beam-friendly decoder state.

Encoder: shared embedding -> padding-safe (bi)RNN (each direction H/2 when bidirectional) ->
memory (B, S, D) zeroed on padding. Bridge: tanh(Linear) from the encoder's per-layer final
states to the decoder's initial h (and c for LSTM). Decoder (`config.decoder`, the order of
operations in models/nn/decoders.py): `none`, the fixed-context decoder conditioned on the
encoder's final states at every step; `bahdanau`, which aligns from the previous state and
feeds the context into the RNN step; `luong`, which steps the RNN and then aligns from the new
state (additive, dot or general score; optional input feeding). Then o_t -> vocabulary logits.

LSTM variants (proj_size, peephole, cifg) apply to the encoder; the decoder stays a native
cell. With a projection the memory is `memory_size` wide (the directions' projections)
instead of H.

The decoder state is one flat float tensor per row: the RNN state blocks (h, and c for LSTM,
per layer), then `config.extra_state` columns: the fixed context (none) or the previous
attentional vector (luong with input feeding). `decode_step` runs one step for R hypothesis
rows with the same step code the teacher-forced `forward` runs, so training, eager decoding
and the exported step graph agree. A `luong` config without input feeding (every config
written before the decoder option existed) is exactly the former translator.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from seqserve.models.config import TranslatorConfig
from seqserve.models.nn import decoders
from seqserve.models.nn.attention import DecoderAttention
from seqserve.models.nn.decoders import Memory
from seqserve.models.nn.rnn import PaddingSafeRNN, RNNState, init_forget_bias, length_mask, make_rnn


class Translator(nn.Module):
    """See module doc. Entry points: `encode`, `decode_step` (export graphs), `forward`."""

    def __init__(self, config: TranslatorConfig) -> None:
        super().__init__()
        self.config = config
        c = config
        size, flat = c.hidden_size, c.num_layers * c.hidden_size
        self.embedding = nn.Embedding(c.vocab_size, c.embed_size, padding_idx=c.pad_id)
        self.dropout = nn.Dropout(c.dropout)
        self.encoder = PaddingSafeRNN(c.cell, c.embed_size, c.encoder_hidden, c.num_layers,
                                      c.bidirectional, c.dropout, c.proj_size, c.peephole,
                                      c.cifg)
        mem, finals = c.memory_size, c.num_layers * c.memory_size
        self.bridge_h = nn.Linear(finals, flat)
        self.bridge_c = nn.Linear(finals, flat) if c.cell == "lstm" else None
        feed = {"none": mem, "bahdanau": mem, "luong": size if c.input_feeding else 0}
        self.decoder = make_rnn(c.cell, c.embed_size + feed[c.decoder], size, c.num_layers,
                                c.dropout)
        self.attention = (DecoderAttention(c.attention, size, mem, size) if c.has_attention
                          else None)
        # o_t = tanh(W [s_t; c_t; y_{t-1}]) for none and bahdanau, tanh(W [h_t; c_t]) for luong
        out_in = size + mem + (c.embed_size if c.decoder != "luong" else 0)
        self.combine = nn.Linear(out_in, size)
        self.output = nn.Linear(size, c.vocab_size)
        init_forget_bias(self, c.forget_bias)

    # ---------------------------------------------------------------- state packing
    def _unpack(self, state: Tensor) -> tuple[RNNState, Tensor | None]:
        """(R, state_dim) -> (h0 (L, R, H) or (h0, c0) for LSTM, extra (R, X) or None)."""
        c = self.config
        width = c.state_layers * c.hidden_size
        extra = state[:, width:] if c.extra_state else None  # (R, X)
        blocks = state[:, :width].reshape(-1, c.state_layers, c.hidden_size)  # (R, SL, H)
        blocks = blocks.transpose(0, 1)  # (SL, R, H)
        if c.cell == "lstm":
            hc = blocks[: c.num_layers].contiguous(), blocks[c.num_layers :].contiguous()
            return hc, extra
        return blocks.contiguous(), extra  # (L, R, H)

    def _pack(self, hidden: RNNState, extra: Tensor | None) -> Tensor:
        """h (L, R, H) or (h, c), extra (R, X) or None -> (R, state_dim)."""
        blocks = torch.cat(hidden, dim=0) if isinstance(hidden, tuple) else hidden  # (SL, R, H)
        flat = blocks.transpose(0, 1).reshape(blocks.shape[1], -1)  # (R, SL*H)
        return flat if extra is None else torch.cat([flat, extra], dim=-1)  # (R, state_dim)

    @property
    def projects_keys(self) -> bool:
        """Whether attention scores against the memory projected by a learned matrix
        (additive, general): then the exported encoder returns those keys once per request
        (`encode_keys`) and the decoder step takes them (`decode_step_keys`) instead of
        projecting the memory again at every step. Dot attention scores the memory itself."""
        return self.attention is not None and self.attention.kind != "dot"

    def _memory(self, memory: Tensor, src_mask: Tensor,
                memory_index: Tensor | None = None, keys: Tensor | None = None) -> Memory:
        """The decoder's view of the memory; attention keys are projected once per request
        (N rows; `keys` when the caller has them), then gathered for its hypothesis rows with
        `memory_index`."""
        if keys is None and self.attention is not None:
            keys = self.attention.keys(memory)  # (N, S, A)
        if memory_index is None:
            return Memory(memory, keys, src_mask)
        return Memory(memory.index_select(0, memory_index),  # (R, S, D)
                      None if keys is None else keys.index_select(0, memory_index),
                      src_mask.index_select(0, memory_index))  # (R, S)

    # ---------------------------------------------------------------- graphs
    def encode(self, src_ids: Tensor, src_lengths: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Inputs:  src_ids (B, S) int64 right-padded, src_lengths (B,) int64 >= 1.
        Outputs: memory (B, S, D) zero on padding, src_mask (B, S) bool,
                 state (B, state_dim) float: the decoder's initial state.
        """
        c = self.config
        src_mask = length_mask(src_lengths, src_ids.shape[1])  # (B, S)
        x = self.dropout(self.embedding(src_ids))  # (B, S, E)
        memory, finals = self.encoder(x, src_lengths)  # (B, S, D), (L, B, D)
        flat = finals.transpose(0, 1).reshape(src_ids.shape[0], -1)  # (B, L*D)
        state = torch.tanh(self.bridge_h(flat))  # (B, L*H)
        if self.bridge_c is not None:
            state = torch.cat([state, torch.tanh(self.bridge_c(flat))], dim=-1)  # (B, 2L*H)
        if c.decoder == "none":  # the fixed context: top layer's final states
            state = torch.cat([state, finals[-1]], dim=-1)  # (B, SL*H + D)
        elif c.input_feeding:  # o_0 = 0
            state = torch.cat([state, torch.zeros_like(state[:, : c.hidden_size])], dim=-1)
        return memory, src_mask, state

    def encode_keys(self, src_ids: Tensor, src_lengths: Tensor
                    ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """`encode` and the attention keys of its memory (`projects_keys` models).

        Outputs: memory, src_mask, state as `encode`; keys (B, S, A) = the memory projected
        for scoring, zero on padding (scores there are masked; zeros keep a padded tail
        checkable).
        """
        memory, src_mask, state = self.encode(src_ids, src_lengths)
        keys = self.attention.keys(memory) * src_mask.unsqueeze(-1).to(memory.dtype)  # type: ignore[union-attr]
        return memory, src_mask, state, keys

    def _decode(self, tgt_in: Tensor, state: Tensor, mem: Memory
                ) -> tuple[Tensor, Tensor, Tensor]:
        """Run the decoder over given inputs (teacher forcing: `decoders.run`).

        Inputs:  tgt_in (B, T) int64, state (B, state_dim), mem (B rows).
        Outputs: logits (B, T, V), attention (B, T, S), new_state (B, state_dim).
        """
        y = self.dropout(self.embedding(tgt_in))  # (B, T, E)
        hidden, extra = self._unpack(state)
        result = decoders.run(self, y, hidden, extra, mem)  # out (B, T, H)
        logits = self.output(self.dropout(result.out))  # (B, T, V)
        return logits, result.attention, self._pack(result.hidden, result.extra)

    def _step(self, prev_ids: Tensor, state: Tensor, mem: Memory
              ) -> tuple[Tensor, Tensor, Tensor]:
        """One decoder step. Inputs: prev_ids (R,), state (R, state_dim), mem (R rows).
        Outputs: logits (R, V), attention (R, S), new_state (R, state_dim)."""
        y = self.dropout(self.embedding(prev_ids))  # (R, E)
        hidden, extra = self._unpack(state)
        result = decoders.step(self, y, hidden, extra, mem)  # out (R, H)
        logits = self.output(self.dropout(result.out))  # (R, V)
        return logits, result.attention, self._pack(result.hidden, result.extra)

    def decode_step(self, prev_ids: Tensor, state: Tensor, memory: Tensor, src_mask: Tensor,
                    memory_index: Tensor, k: int | Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """One decoder step for R hypothesis rows over N encoded requests.

        Inputs:  prev_ids (R,) int64, state (R, state_dim), memory (N, S, D),
                 src_mask (N, S) bool, memory_index (R,) int64 (row -> request), k int or
                 0-d / 1-element int64 tensor.
        Outputs: new_state (R, state_dim), topk_logprobs (R, k), topk_ids (R, k) int64,
                 attention (R, S): a_t of models/nn/decoders.py (zeros for decoder 'none').
        """
        return self._top_k(prev_ids, state, self._memory(memory, src_mask, memory_index), k)

    def decode_step_keys(self, prev_ids: Tensor, state: Tensor, memory: Tensor,
                         src_mask: Tensor, memory_index: Tensor, k: int | Tensor,
                         keys: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """`decode_step` with the requests' attention keys (N, S, A) from `encode_keys`:
        the same outputs, without projecting the memory at every step."""
        return self._top_k(prev_ids, state,
                           self._memory(memory, src_mask, memory_index, keys), k)

    def _top_k(self, prev_ids: Tensor, state: Tensor, mem: Memory, k: int | Tensor
               ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        logits, attention, new_state = self._step(prev_ids, state, mem)
        logprobs = F.log_softmax(logits, dim=-1)  # (R, V)
        kk = k.reshape(()) if isinstance(k, Tensor) else k
        top_lp, top_ids = torch.topk(logprobs, kk, dim=-1)  # type: ignore[arg-type]  # (R, k)
        return new_state, top_lp, top_ids, attention

    # ---------------------------------------------------------------- training
    def forward(self, src_ids: Tensor, src_lengths: Tensor, tgt_in: Tensor,
                tgt_out: Tensor | None = None, sampling_prob: float = 0.0,
                label_smoothing: float = 0.0) -> tuple[Tensor, Tensor | None]:
        """Teacher-forced (optionally scheduled-sampling) logits and loss.

        Inputs:  src_ids (B, S), src_lengths (B,), tgt_in (B, T) = [bos, y...] padded,
                 tgt_out (B, T) = [y..., eos] padded with pad_id (or None: no loss),
                 sampling_prob: chance per position (training only) of feeding the model's
                 own previous argmax instead of the gold token.
        Outputs: logits (B, T, V), loss (mean token cross-entropy over non-pad) or None.
        """
        memory, src_mask, state = self.encode(src_ids, src_lengths)
        mem = self._memory(memory, src_mask)
        if self.training and sampling_prob > 0.0:
            logits = self._scheduled_sampling(tgt_in, state, mem, sampling_prob)
        else:
            logits, _, _ = self._decode(tgt_in, state, mem)  # (B, T, V)
        if tgt_out is None:
            return logits, None
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tgt_out.reshape(-1),
                               ignore_index=self.config.pad_id, label_smoothing=label_smoothing)
        return logits, loss

    def _scheduled_sampling(self, tgt_in: Tensor, state: Tensor, mem: Memory,
                            prob: float) -> Tensor:
        """Step-by-step decoding; each position after the first takes the model's previous
        argmax with probability `prob`, else the gold token. Returns logits (B, T, V)."""
        steps: list[Tensor] = []
        prev = tgt_in[:, 0]  # (B,)
        for t in range(tgt_in.shape[1]):
            logits, _, state = self._step(prev, state, mem)  # (B, V)
            steps.append(logits)
            if t + 1 < tgt_in.shape[1]:
                use_model = torch.rand(prev.shape, device=prev.device) < prob  # (B,)
                guess = logits.detach().argmax(dim=-1)  # (B,)
                prev = torch.where(use_model, guess, tgt_in[:, t + 1])
        return torch.stack(steps, dim=1)  # (B, T, V)
