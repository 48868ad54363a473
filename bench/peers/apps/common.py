"""What every peer server shares: read the bundle, tokenize, pad, answer (numpy + sentencepiece).

The peers run in their own environments (mosec and TorchServe live in a separate venv), so
this file imports nothing from seqserve: it reads the bundle's manifest.json and
tokenizer.model directly. Each peer answers `{"results": [{"label": ..., "score": ...}]}`,
one result per text, the fields of seqserve's classify answer that the harness checks.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import sentencepiece as spm


class Bundle:
    """A classifier bundle folder: tokenizer, labels, token limit, graph files."""

    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder)
        manifest = json.loads((self.folder / "manifest.json").read_text())
        self.labels: list[str] = list(manifest["labels"])
        self.max_tokens = int(manifest.get("limits", {}).get("max_tokens", 256))
        self.pad_id = int(manifest["tokenizer"]["pad_id"])
        self.unk_id = int(manifest["tokenizer"]["unk_id"])
        self.sp = spm.SentencePieceProcessor(model_file=str(self.folder / "tokenizer.model"))
        self.onnx = self.folder / "classifier.onnx"
        self.torchscript = self.folder / "classifier.pt"

    def encode(self, text: str) -> list[int]:
        """Token ids cut at the bundle's limit (an empty text becomes one unk token)."""
        return list(self.sp.encode(text))[: self.max_tokens] or [self.unk_id]

    def pad(self, rows: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
        """Right-padded ids (B, T) and lengths (B,), both int64."""
        lengths = np.array([len(r) for r in rows], dtype=np.int64)  # (B,)
        ids = np.full((len(rows), int(lengths.max())), self.pad_id, dtype=np.int64)  # (B, T)
        for i, r in enumerate(rows):
            ids[i, : len(r)] = r
        return ids, lengths

    def results(self, logits: np.ndarray) -> list[dict[str, Any]]:
        """One {"label", "score"} per row of logits (B, C)."""
        z = logits.astype(np.float64) - logits.max(axis=1, keepdims=True)  # (B, C)
        probs = np.exp(z) / np.exp(z).sum(axis=1, keepdims=True)  # (B, C)
        best = probs.argmax(axis=1)  # (B,)
        return [{"label": self.labels[int(j)], "score": float(probs[i, j])}
                for i, j in enumerate(best)]


def texts_of(body: Any) -> list[str]:
    """The texts of a request body {"texts": [...]} (dict, or its JSON bytes)."""
    if isinstance(body, (bytes, bytearray, str)):
        body = json.loads(body)
    return [str(t) for t in body["texts"]]
