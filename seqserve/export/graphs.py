"""The exported graphs: thin wrapper modules around the eager entry points, their signatures
(names, dtypes, symbolic dims: `export.contract`, docs/bundle-format.md) and example
inputs to trace them with.

Each wrapper calls one entry point of the eager model, so the ONNX graph, its TorchScript
twin and the eager reference all run the same code. The decoder step passes `k` as an int64
(1,) tensor straight into `torch.topk`; the tracer records that argument as a value (not a
constant), so both the ONNX TopK and the TorchScript graph take k at run time.
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
)
from seqserve.export.lm_graphs import LMStepGraph, PrefillGraph, lm_examples
from seqserve.export.tagger_graphs import TaggerGraph

__all__ = ["CLASSIFIER_SPEC", "DECODER_STEP_SPEC", "ENCODER_SPEC", "SPECS", "TAGGER_SPEC",
           "ClassifierGraph", "DecoderStepGraph", "EncoderGraph", "GraphDef", "graph_defs"]

# Dims that are fixed by the contract rather than symbolic: `k` is int64 [1].
FIXED_DIMS: dict[tuple[str, int], int] = {("k", 0): 1}


class ClassifierGraph(nn.Module):
    """`Classifier.classify`. Inputs: input_ids (B, T), lengths (B,).
    Outputs: logits (B, C), attention (B, T)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: Tensor, lengths: Tensor) -> tuple[Tensor, Tensor]:
        return self.model.classify(input_ids, lengths)  # type: ignore[operator,no-any-return]


class EncoderGraph(nn.Module):
    """`Translator.encode`. Inputs: src_ids (B, S), src_lengths (B,).
    Outputs: memory (B, S, D), src_mask (B, S) bool, state (B, state_dim)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, src_ids: Tensor, src_lengths: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        return self.model.encode(src_ids, src_lengths)  # type: ignore[operator,no-any-return]


class DecoderStepGraph(nn.Module):
    """`Translator.decode_step` with k as an int64 (1,) tensor.

    Inputs:  prev_ids (R,), state (R, state_dim), memory (N, S, D), src_mask (N, S),
             memory_index (R,), k (1,).
    Outputs: new_state (R, state_dim), topk_logprobs (R, k), topk_ids (R, k), attention (R, S).
    """

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, prev_ids: Tensor, state: Tensor, memory: Tensor, src_mask: Tensor,
                memory_index: Tensor, k: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        return self.model.decode_step(  # type: ignore[operator,no-any-return]
            prev_ids, state, memory, src_mask, memory_index, k
        )


@dataclass(frozen=True)
class GraphDef:
    """One graph to export: its name, wrapper module (eval mode) and example inputs."""

    name: str
    """Graph name: classifier | encoder | decoder_step (also the file stem)."""
    module: nn.Module
    """The wrapper module, in eval mode (the exporters restore the wrapper's own mode)."""
    example: tuple[Tensor, ...]
    """Example inputs for tracing, in the spec's input order."""

    @property
    def spec(self) -> GraphSpec:
        return SPECS[self.name]


def _example_lengths(batch: int, seq: int) -> Tensor:
    """Distinct lengths <= seq with the longest equal to seq: (B,) int64."""
    return torch.tensor([max(1, seq - 2 * i) for i in range(batch)], dtype=torch.int64)


def graph_defs(task: str, model: nn.Module, vocab_size: int) -> list[GraphDef]:
    """The graphs of a task with example inputs whose sizes differ on every symbolic axis
    (batch 3, seq 11, rows 5, k 4), so that a size frozen into the graph is caught later."""
    model.eval()
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(4, vocab_size, (3, 11), generator=gen)  # (B, T)
    lengths = _example_lengths(3, 11)  # (B,)
    ids = ids.masked_fill(torch.arange(11).unsqueeze(0) >= lengths.unsqueeze(1), 0)
    if task == "classifier":
        return [GraphDef("classifier", ClassifierGraph(model).eval(), (ids, lengths))]
    if task == "tagger":
        return [GraphDef("tagger", TaggerGraph(model).eval(), (ids, lengths))]
    if task == "lm":
        prefill, step = lm_examples(model, ids, lengths, vocab_size)
        return [GraphDef("prefill", PrefillGraph(model).eval(), prefill),
                GraphDef("lm_step", LMStepGraph(model).eval(), step)]
    encoder = EncoderGraph(model).eval()
    with torch.no_grad():
        memory, src_mask, state = encoder(ids, lengths)  # (N, S, D), (N, S), (N, state_dim)
    memory_index = torch.tensor([0, 0, 1, 2, 2], dtype=torch.int64)  # (R,)
    prev_ids = torch.randint(4, vocab_size, (5,), generator=gen)  # (R,)
    step_example = (prev_ids, state[memory_index], memory, src_mask, memory_index,
                    torch.tensor([4], dtype=torch.int64))
    return [
        GraphDef("encoder", encoder, (ids, lengths)),
        GraphDef("decoder_step", DecoderStepGraph(model).eval(), step_example),
    ]
