"""Tagger worker: the classifier worker's tokenization, limits and batcher over the `tagger`
graph, with per-word results (models/word_align.py: a word's label is read at its first piece).

OIP v2: input `text` BYTES [n] -> output `tags` BYTES [n], each element the JSON string of that
text's token list (the same objects as the v1 `tokens`).
"""

from __future__ import annotations

import json
from typing import Any, ClassVar

import numpy as np

from models.word_align import align
from service.workers.base import Call, V2Tensor, v2_texts
from service.workers.classifier import ClassifierWorker, Encoded

TagRow = tuple[np.ndarray, np.ndarray]
"""One text's result: best label index (T,) and its probability (T,) per piece."""


class TaggerWorker(ClassifierWorker):
    """Serves one tagger bundle version."""

    task: ClassVar[str] = "tagger"

    def compute(self, rows: list[list[int]]) -> list[TagRow]:  # type: ignore[override]
        """Right-pad `rows`, run the graph, return each row's best label and probability."""
        lengths = np.array([len(r) for r in rows], dtype=np.int64)  # (B,)
        ids = np.full((len(rows), int(lengths.max())), self.pad_id, dtype=np.int64)  # (B, T)
        for i, r in enumerate(rows):
            ids[i, : len(r)] = r
        out = self.ctx.runtime.run("tagger", {"input_ids": ids, "lengths": lengths})
        log_probs = out["log_probs"]  # (B, T, C)
        best = log_probs.argmax(-1)  # (B, T)
        prob = np.exp(np.take_along_axis(log_probs, best[..., None], -1)[..., 0])  # (B, T)
        return [(best[i, : lengths[i]], prob[i, : lengths[i]]) for i in range(len(rows))]

    async def tag(self, texts: list[str], call: Call) -> list[dict[str, Any]]:
        """One `Tagging` (as plain data) per text."""
        encoded = self.encode(texts, offsets=True)
        rows = await self.run_rows(encoded, call)
        return [self._tagging(t, e, row) for t, e, row in zip(texts, encoded, rows, strict=True)]

    def _tagging(self, text: str, e: Encoded, row: Any) -> dict[str, Any]:
        best, prob = row  # (T,), (T,)
        tokens = []
        for word in align(text, e.pieces or []):
            hit = 0 <= word.piece < len(best)
            tokens.append({"token": word.text, "start": word.start, "end": word.end,
                           "label": self.labels[int(best[word.piece])] if hit else None,
                           "probability": float(prob[word.piece]) if hit else None})
        return {"tokens": tokens, "num_tokens": len(e.ids), "truncated": e.truncated}

    def v2_signature(self) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        inputs = [{"name": "text", "datatype": "BYTES", "shape": [-1]}]
        outputs = [{"name": "tags", "datatype": "BYTES", "shape": [-1]}]
        return inputs, outputs

    async def v2_infer(self, inputs: dict[str, V2Tensor], call: Call) -> list[V2Tensor]:
        texts = v2_texts(inputs)
        results = await self.tag(texts, call)
        data = [json.dumps(r["tokens"], ensure_ascii=False) for r in results]
        return [V2Tensor("tags", "BYTES", [len(data)], data)]
