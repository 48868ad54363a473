"""The tagger's export graph, and which recurrent form each exported graph uses.

Graph `tagger`: `Tagger.tag` (docs/contracts.md): input_ids int64 [batch, seq], lengths int64
[batch] -> log_probs float32 [batch, seq, labels] (zero on padded positions, so the parity
machinery's padded-tail check applies as for the classifier's attention).

`rnn_form(graph, model)` names the form of a graph's recurrent layers for the manifest:
"native" (ONNX LSTM/GRU/RNN operators), "loop" (the LSTM variants of models/nn/lstm_variants.py
and the language model's prefill: an ONNX Loop of standard operators; TorchScript keeps the
scripted loop) or "cell" (the language model's lm_step: one step of the cell equations).
"""

from __future__ import annotations

from torch import Tensor, nn

from seqserve.export.contract import TAGGER_SPEC

__all__ = ["TAGGER_SPEC", "TaggerGraph", "rnn_form"]


class TaggerGraph(nn.Module):
    """`Tagger.tag`. Inputs: input_ids (B, T), lengths (B,). Outputs: (log_probs (B, T, C),),
    a 1-tuple like every graph's outputs (the TorchScript twin returns a tuple)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: Tensor, lengths: Tensor) -> tuple[Tensor]:
        return (self.model.tag(input_ids, lengths),)  # type: ignore[operator]


def rnn_form(graph: str, model: nn.Module) -> str:
    """"native" or "loop" for one graph of `model` (the translator's decoder step runs its
    native decoder cell only; every other graph runs the model's padding-safe encoder)."""
    if graph == "decoder_step":
        return "native"
    if graph == "lm_step":  # the LM's cell equations once, as standard ops (models/nn/lm.py)
        return "cell"
    for module in model.modules():
        form = getattr(module, "rnn_form", None)
        if isinstance(form, str):
            return form
    return "native"
