"""Attention encoder-decoder translator with a flat, beam-friendly decoder state.

Encoder: shared embedding -> padding-safe (bi)RNN (each direction H/2 when bidirectional) ->
memory (B, S, H) zeroed on padding. Bridge: tanh(Linear) from the encoder's per-layer final
states to the decoder's initial h (and c for LSTM). Decoder: a unidirectional RNN over the
target embeddings, global attention of its top output over the memory (additive, dot or
general score), attentional vector tanh(W [h; context]) -> vocabulary logits.

LSTM variants (proj_size, peephole, cifg) apply to the encoder; the decoder stays a native
cell, because its state layout is the decode_step contract. With a projection the memory is
`memory_size` wide (the directions' projections) instead of H.

Teacher forcing runs the whole target at once; `decode_step` runs one step for R hypothesis
rows with the same code, so training, eager decoding and the exported step graph agree.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from models.attention import DecoderAttention
from models.config import TranslatorConfig
from models.rnn import PaddingSafeRNN, length_mask, make_rnn


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
        self.decoder = make_rnn(c.cell, c.embed_size, size, c.num_layers, c.dropout)
        self.attention = DecoderAttention(c.attention, size, mem, size)
        self.combine = nn.Linear(size + mem, size)
        self.output = nn.Linear(size, c.vocab_size)

    # ---------------------------------------------------------------- state packing
    def _unpack(self, state: Tensor) -> Tensor | tuple[Tensor, Tensor]:
        """(R, state_dim) -> h0 (L, R, H) or (h0, c0) for LSTM."""
        c = self.config
        blocks = state.reshape(-1, c.state_layers, c.hidden_size).transpose(0, 1)  # (SL, R, H)
        if c.cell == "lstm":
            return blocks[: c.num_layers].contiguous(), blocks[c.num_layers :].contiguous()
        return blocks.contiguous()  # (L, R, H)

    def _pack(self, hidden: Tensor | tuple[Tensor, Tensor]) -> Tensor:
        """h (L, R, H) or (h, c) -> (R, state_dim)."""
        blocks = torch.cat(hidden, dim=0) if isinstance(hidden, tuple) else hidden  # (SL, R, H)
        return blocks.transpose(0, 1).reshape(blocks.shape[1], -1)  # (R, SL*H)

    # ---------------------------------------------------------------- graphs
    def encode(self, src_ids: Tensor, src_lengths: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Inputs:  src_ids (B, S) int64 right-padded, src_lengths (B,) int64 >= 1.
        Outputs: memory (B, S, H) zero on padding, src_mask (B, S) bool,
                 state (B, state_dim) float: the decoder's initial state.
        """
        src_mask = length_mask(src_lengths, src_ids.shape[1])  # (B, S)
        x = self.dropout(self.embedding(src_ids))  # (B, S, E)
        memory, finals = self.encoder(x, src_lengths)  # (B, S, H), (L, B, H)
        flat = finals.transpose(0, 1).reshape(src_ids.shape[0], -1)  # (B, L*H)
        state = torch.tanh(self.bridge_h(flat))  # (B, L*H)
        if self.bridge_c is not None:
            state = torch.cat([state, torch.tanh(self.bridge_c(flat))], dim=-1)  # (B, 2L*H)
        return memory, src_mask, state

    def _decode(self, tgt_in: Tensor, state: Tensor, memory: Tensor, src_mask: Tensor,
                keys: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor]:
        """Run the decoder over given inputs.

        Inputs:  tgt_in (B, T) int64, state (B, state_dim), memory (B, S, H), src_mask (B, S),
                 keys: `attention.keys(memory)` row-aligned with memory, or None.
        Outputs: logits (B, T, V), attention (B, T, S), new_state (B, state_dim).
        """
        y = self.dropout(self.embedding(tgt_in))  # (B, T, E)
        out, hidden = self.decoder(y, self._unpack(state))  # (B, T, H)
        context, attention = self.attention(out, memory, src_mask, keys)  # (B,T,H), (B,T,S)
        vec = torch.tanh(self.combine(torch.cat([out, context], dim=-1)))  # (B, T, H)
        logits = self.output(self.dropout(vec))  # (B, T, V)
        return logits, attention, self._pack(hidden)

    def decode_step(self, prev_ids: Tensor, state: Tensor, memory: Tensor, src_mask: Tensor,
                    memory_index: Tensor, k: int | Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """One decoder step for R hypothesis rows over N encoded requests.

        Inputs:  prev_ids (R,) int64, state (R, state_dim), memory (N, S, H),
                 src_mask (N, S) bool, memory_index (R,) int64 (row -> request), k int or
                 0-d / 1-element int64 tensor.
        Outputs: new_state (R, state_dim), topk_logprobs (R, k), topk_ids (R, k) int64,
                 attention (R, S).
        """
        keys = self.attention.keys(memory).index_select(0, memory_index)  # (R, S, A)
        mem = memory.index_select(0, memory_index)  # (R, S, H)
        mask = src_mask.index_select(0, memory_index)  # (R, S)
        # keys are projected once per request (N rows), then shared by its R/N hypotheses
        logits, attention, new_state = self._decode(prev_ids.unsqueeze(1), state, mem, mask,
                                                    keys)
        logprobs = F.log_softmax(logits[:, 0], dim=-1)  # (R, V)
        kk = k.reshape(()) if isinstance(k, Tensor) else k
        top_lp, top_ids = torch.topk(logprobs, kk, dim=-1)  # type: ignore[arg-type]  # (R, k)
        return new_state, top_lp, top_ids, attention[:, 0]

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
        if self.training and sampling_prob > 0.0:
            logits = self._scheduled_sampling(tgt_in, state, memory, src_mask, sampling_prob)
        else:
            logits, _, _ = self._decode(tgt_in, state, memory, src_mask)  # (B, T, V)
        if tgt_out is None:
            return logits, None
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tgt_out.reshape(-1),
                               ignore_index=self.config.pad_id, label_smoothing=label_smoothing)
        return logits, loss

    def _scheduled_sampling(self, tgt_in: Tensor, state: Tensor, memory: Tensor,
                            src_mask: Tensor, prob: float) -> Tensor:
        """Step-by-step decoding; each position after the first takes the model's previous
        argmax with probability `prob`, else the gold token. Returns logits (B, T, V)."""
        steps: list[Tensor] = []
        prev = tgt_in[:, 0]  # (B,)
        keys = self.attention.keys(memory)  # (B, S, A) once for all steps
        for t in range(tgt_in.shape[1]):
            logits, _, state = self._decode(prev.unsqueeze(1), state, memory, src_mask, keys)
            steps.append(logits)  # (B, 1, V)
            if t + 1 < tgt_in.shape[1]:
                use_model = torch.rand(prev.shape, device=prev.device) < prob  # (B,)
                guess = logits[:, 0].detach().argmax(dim=-1)  # (B,)
                prev = torch.where(use_model, guess, tgt_in[:, t + 1])
        return torch.cat(steps, dim=1)  # (B, T, V)
