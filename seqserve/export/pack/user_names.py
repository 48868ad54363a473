"""pack's refusals in the user's own terms: their files and their tensors, not the contract's.

The checks after composition (signatures, sizes, parity, batch invariance) run on the bundle's
graphs, whose files are the contract's (`tagger.onnx`, `encoder.onnx`) and whose tensors are
the contract's too once pack composed them (`log_probs`). A user packed `plain.onnx` with an
output `tag_scores`: `UserNames` (read from what pack was given, the manifest's `source`)
names those instead, in the messages written here and in any message a check raises.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from seqserve.export.contract import GRAPHS_BY_TASK

_IO = {"classifier": (["input_ids", "lengths"], ["logits", "attention"]),
       "tagger": (["input_ids", "lengths"], ["log_probs"]),
       "sequence_classifier": (["features", "lengths"], ["outputs"]),
       "sequence_tagger": (["features", "lengths"], ["outputs"])}
"""The contract's tensors that the user's names (`input_names`, `output_names`) stand for."""


@dataclass
class UserNames:
    """Per graph of the bundle: the user's file (or module) and their name of each tensor."""

    files: dict[str, str] = field(default_factory=dict)
    tensors: dict[str, dict[str, str]] = field(default_factory=dict)

    @classmethod
    def from_source(cls, task: str, source: dict[str, Any] | None) -> UserNames:
        """The user's names as `seqserve pack` / `seqserve.pack` recorded what it was given."""
        source = source or {}
        graphs = GRAPHS_BY_TASK.get(task, ())
        if "module" in source:  # the Python API: the module is all the user wrote
            return cls({g: f"{source['module']} (your module)" for g in graphs})
        names = cls()
        for graph in graphs:
            key = {"encoder": "encoder", "decoder_step": "decoder_step", "prefill": "prefill",
                   "lm_step": "step"}.get(graph, "onnx")
            if source.get(key):
                names.files[graph] = Path(str(source[key])).name
            if graph in _IO:
                ins, outs = _IO[graph]
                given = zip([*ins, *outs], [*source.get("input_names", [])[:2],
                                            *source.get("output_names", [])[:len(outs)]],
                            strict=False)
                names.tensors[graph] = {c: u for c, u in given if u}
        for graph, key, ours in (("prefill", "prefill_names", "input_ids"),
                                 ("lm_step", "step_names", "prev_ids")):
            recorded = source.get(key) or {}
            if recorded:
                names.tensors[graph] = {ours: str(recorded.get("ids") or ""),
                                        "log_probs": str(recorded.get("logits") or "")}
        return names

    def file(self, graph: str) -> str:
        return self.files.get(graph, f"{graph}.onnx")

    def tensor(self, key: str) -> str:
        """`graph.tensor` (a parity report's key) as the user knows it: "plain.onnx's output
        'tag_scores'"; the contract's name when the user's graph has no such tensor."""
        graph, _, tensor = key.partition(".")
        own = self.tensors.get(graph, {}).get(tensor)
        if own:
            return f"{self.file(graph)}'s {tensor_kind(graph, tensor)} {own!r}"
        return f"{self.file(graph)}'s {tensor}"

    def message(self, text: str) -> str:
        """`text` with the contract's files and composed tensors named as the user's."""
        for graph, file in self.files.items():
            names = self.tensors.get(graph, {})
            for ours, own in names.items():
                if own and own != ours:
                    text = re.sub(rf"\b{re.escape(graph)}\.{re.escape(ours)}\b",
                                  _literal(f"{file}'s {tensor_kind(graph, ours)} {own!r}"),
                                  text)
                    text = re.sub(rf"(\b{re.escape(graph)}\.onnx: (?:input|output) ){ours}\b",
                                  rf"\g<1>{_literal(repr(own))}", text)
            # a tensor the user's graph has under no name of theirs (pack composed it)
            text = re.sub(rf"(?<![\w/.-]){re.escape(graph)}\.(?!onnx\b)(\w+)\b",
                          rf"{_literal(file)}'s \1", text)
            text = re.sub(rf"(?<![\w/.-]){re.escape(graph)}\.onnx\b", _literal(file), text)
        return text


def tensor_kind(graph: str, tensor: str) -> str:
    ins = _IO.get(graph, ([], []))[0] + ["input_ids", "prev_ids", "src_ids", "src_lengths"]
    return "input" if tensor in ins else "output"


def _literal(text: str) -> str:
    """`text` as a literal in a `re.sub` replacement."""
    return text.replace("\\", "\\\\")
