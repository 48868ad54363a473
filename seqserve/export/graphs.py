"""The exported graphs: one thin wrapper module per eager entry point (`EntryGraph`), their
signatures (names, dtypes, symbolic dims: `export.contract`, docs/bundle-format.md), example
inputs to trace them with, and which recurrent form each graph uses (`rnn_form`).

Each wrapper calls one entry point of the eager model (`ENTRY_POINTS`), so the ONNX graph,
its TorchScript twin and the eager reference all run the same code. The decoder step passes
`k` as an int64 (1,) tensor straight into `torch.topk`; the tracer records that argument as a
value (not a constant), so both the ONNX TopK and the TorchScript graph take k at run time.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from seqserve.export.contract import (
    CLASSIFIER_SPEC,
    DECODER_STEP_SPEC,
    ENCODER_SPEC,
    SPECS,
    TAGGER_SPEC,
    GraphSpec,
    expected_spec,
)

__all__ = ["CLASSIFIER_SPEC", "DECODER_STEP_SPEC", "ENCODER_SPEC", "SPECS", "TAGGER_SPEC",
           "ENTRY_POINTS", "EntryGraph", "GraphDef", "graph_defs", "rnn_form"]

# Dims that are fixed by the contract rather than symbolic: `k` is int64 [1].
FIXED_DIMS: dict[tuple[str, int], int] = {("k", 0): 1}

ENTRY_POINTS = {"classifier": "classify", "tagger": "tag", "encoder": "encode",
                "decoder_step": "decode_step", "prefill": "prefill", "lm_step": "lm_step"}
"""Graph -> the eager model's method it exports (signatures: `SPECS`):

- classifier `Classifier.classify`: input_ids (B, T), lengths (B,) -> logits (B, C),
  attention (B, T);
- tagger `Tagger.tag`: input_ids (B, T), lengths (B,) -> log_probs (B, T, C) (zero on padded
  positions, so the parity machinery's padded-tail check applies as for the attention);
- encoder `Translator.encode`: src_ids (B, S), src_lengths (B,) -> memory (B, S, D), src_mask
  (B, S) bool, state (B, state_dim); with projected attention keys (schema 3)
  `Translator.encode_keys`, which also returns keys (B, S, A);
- decoder_step `Translator.decode_step`, k an int64 (1,) tensor: prev_ids (R,), state
  (R, state_dim), memory (N, S, D), src_mask (N, S), memory_index (R,), k (1,) -> new_state
  (R, state_dim), topk_logprobs (R, k), topk_ids (R, k), attention (R, S); with keys
  `Translator.decode_step_keys`, which also takes keys (N, S, A);
- prefill `LanguageModel.prefill`: input_ids (B, T), lengths (B,), state (B, S) -> state (B, S),
  log_probs (B, T, V); lm_step `LanguageModel.lm_step`: prev_ids (R,), state (R, S) ->
  new_state (R, S), log_probs (R, V)."""


class EntryGraph(nn.Module):
    """One entry point of the eager model as a graph. Inputs: the graph's contract inputs,
    positionally. Outputs: the entry point's, always a tuple (a lone tensor becomes a
    1-tuple, as the TorchScript twin returns every graph's outputs)."""

    def __init__(self, model: nn.Module, graph: str, entry: str | None = None) -> None:
        super().__init__()
        self.model = model
        self.entry = entry or ENTRY_POINTS[graph]

    def forward(self, *inputs: Tensor) -> tuple[Tensor, ...]:
        out = getattr(self.model, self.entry)(*inputs)
        return tuple(out) if isinstance(out, tuple | list) else (out,)


@dataclass(frozen=True)
class GraphDef:
    """One graph to export: its name, wrapper module (eval mode) and example inputs."""

    name: str
    """Graph name: classifier | encoder | decoder_step (also the file stem)."""
    module: nn.Module
    """The wrapper module, in eval mode (the exporters restore the wrapper's own mode)."""
    example: tuple[Tensor, ...]
    """Example inputs for tracing, in the spec's input order."""
    keys: bool = False
    """A translator graph with the projected attention keys (the encoder's optional output,
    the decoder step's optional input)."""

    @property
    def spec(self) -> GraphSpec:
        if self.name not in ("encoder", "decoder_step"):
            return SPECS[self.name]
        given = ("keys",) if self.keys else ()
        return expected_spec(self.name, given, given)


def example_lengths(batch: int, seq: int) -> Tensor:
    """Distinct lengths <= seq with the longest equal to seq: (B,) int64."""
    return torch.tensor([max(1, seq - 2 * i) for i in range(batch)], dtype=torch.int64)


def graph_defs(task: str, model: nn.Module, vocab_size: int,
               with_keys: bool = True) -> list[GraphDef]:
    """The graphs of a task with example inputs whose sizes differ on every symbolic axis
    (batch 3, seq 11, rows 5, k 4), so that a size frozen into the graph is caught later.
    A translator whose attention projects the memory (`Translator.projects_keys`) exports
    its keys from the encoder into the decoder step unless `with_keys` is False (a bundle
    as schema 2 wrote it)."""
    model.eval()
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(4, vocab_size, (3, 11), generator=gen)  # (B, T)
    lengths = example_lengths(3, 11)  # (B,)
    ids = ids.masked_fill(torch.arange(11).unsqueeze(0) >= lengths.unsqueeze(1), 0)
    if task in ("classifier", "tagger"):
        return [GraphDef(task, EntryGraph(model, task).eval(), (ids, lengths))]
    if task == "lm":
        with torch.no_grad():
            state, _ = model.prefill(ids, lengths)  # type: ignore[operator]  # (B, S)
        index = torch.tensor([0, 0, 1, 2, 2], dtype=torch.int64)  # (R,) rows != batch
        prev = torch.randint(4, vocab_size, (5,), generator=torch.Generator().manual_seed(1))
        start = state[[2, 0, 1]]  # (B, S): the prefill from a state (a cached prefix's)
        return [GraphDef("prefill", EntryGraph(model, "prefill").eval(), (ids, lengths, start)),
                GraphDef("lm_step", EntryGraph(model, "lm_step").eval(),
                         (prev, state[index]))]  # (R,), (R, S)
    keys = bool(getattr(model, "projects_keys", False) and with_keys)
    encoder = EntryGraph(model, "encoder", "encode_keys" if keys else None).eval()
    with torch.no_grad():
        # (N, S, D), (N, S), (N, state_dim)[, (N, S, A)]
        memory, src_mask, state, *projected = encoder(ids, lengths)
    memory_index = torch.tensor([0, 0, 1, 2, 2], dtype=torch.int64)  # (R,)
    prev_ids = torch.randint(4, vocab_size, (5,), generator=gen)  # (R,)
    step_example = (prev_ids, state[memory_index], memory, src_mask, memory_index,
                    torch.tensor([4], dtype=torch.int64), *projected)
    step = EntryGraph(model, "decoder_step", "decode_step_keys" if keys else None).eval()
    return [GraphDef("encoder", encoder, (ids, lengths), keys),
            GraphDef("decoder_step", step, step_example, keys)]


def rnn_form(graph: str, model: nn.Module) -> str:
    """The form of a graph's recurrent layers for the manifest: "native" (ONNX LSTM/GRU/RNN
    operators; the translator's decoder step runs its native decoder cell only), "loop" (the
    LSTM variants of models/nn/lstm_variants.py and the language model's prefill: an ONNX
    Loop of standard operators; TorchScript keeps the scripted loop) or "cell" (the language
    model's lm_step: one step of the cell equations, models/nn/lm.py). Every other graph runs
    the model's padding-safe encoder, whose layers name their form."""
    if graph == "decoder_step":
        return "native"
    if graph == "lm_step":
        return "cell"
    for module in model.modules():
        form = getattr(module, "rnn_form", None)
        if isinstance(form, str):
            return form
    return "native"
