"""Tagger worker: texts -> token rows -> one label per word, with character spans; a word's
label is read at its first piece. The word is the bundle's `words` unit (`Manifest.words`):
a whitespace word (models/text/word_align.py; the default, and every bundle packed before the
option) or a word of the tokenizer.json's own pre-tokenizer (`JsonTokenizer.words`: a BERT
pre-tokenizer makes "Hello," two words, "Hello" and ",")."""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from seqserve.models.text.tokenizer_files import JsonTokenizer
from seqserve.models.text.word_align import Word, align
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
        self.words = ctx.manifest.words or "whitespace"

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
        for word in self._words(text, e):
            hit = 0 <= word.piece < len(best)
            tokens.append({"token": word.text, "start": word.start, "end": word.end,
                           "label": self.labels[int(best[word.piece])] if hit else None,
                           "probability": float(prob[word.piece]) if hit else None})
        return {"tokens": tokens, "num_tokens": len(e.ids), "truncated": e.truncated,
                "unknown_fraction": e.unknown}

    def _words(self, text: str, e: Encoded) -> list[Word]:
        """The words of `text` that get a label, each with its first piece (-1: cut off)."""
        tok = self.ctx.tokenizer
        if self.words == "tokenizer" and isinstance(tok, JsonTokenizer):
            kept = len(e.ids)  # the first max_tokens pieces (truncation)
            return [Word(text[start:end], start, end, first if first < kept else -1)
                    for first, start, end in tok.words(text)]
        return align(text, e.pieces or [])

    def describe(self) -> dict[str, Any]:
        return {"labels": self.labels, "words": self.words, **describe_common(self.ctx)}
