"""Tagger worker: texts -> token rows -> one label per whitespace word, with character spans
(models/text/word_align.py: a word's label is read at its first piece)."""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from seqserve.models.text.word_align import align
from seqserve.service.scheduling.base import Timed
from seqserve.service.scheduling.models import RowModel
from seqserve.service.workers.base import (
    Encoded,
    RequestContext,
    WorkerContext,
    describe_common,
    encode_texts,
)

TagRow = tuple[np.ndarray, np.ndarray]
"""One text's result from the scheduler: best label index (L,) and its probability (L,)."""


class TaggerWorker:
    """Serves one tagger bundle version."""

    task: ClassVar[str] = "tagger"

    def __init__(self, ctx: WorkerContext[RowModel]) -> None:
        self.ctx = ctx
        self.labels = list(ctx.manifest.labels)

    async def tag(self, texts: list[str], call: RequestContext) -> list[dict[str, Any]]:
        """One tagging per text: its words with label, probability and [start, end)."""
        encoded = encode_texts(self.ctx.tokenizer, texts, self.ctx.limits, offsets=True)
        futures = self.ctx.model.submit([e.ids for e in encoded], call.deadline)
        done: list[Timed[TagRow]] = await call.wait(futures)
        return [self._tagging(t, e, d.value)
                for t, e, d in zip(texts, encoded, done, strict=True)]

    def _tagging(self, text: str, e: Encoded, row: TagRow) -> dict[str, Any]:
        best, prob = row  # (L,), (L,)
        tokens = []
        for word in align(text, e.pieces or []):
            hit = 0 <= word.piece < len(best)
            tokens.append({"token": word.text, "start": word.start, "end": word.end,
                           "label": self.labels[int(best[word.piece])] if hit else None,
                           "probability": float(prob[word.piece]) if hit else None})
        return {"tokens": tokens, "num_tokens": len(e.ids), "truncated": e.truncated,
                "unknown_fraction": e.unknown}

    def describe(self) -> dict[str, Any]:
        return {"labels": self.labels, **describe_common(self.ctx)}
