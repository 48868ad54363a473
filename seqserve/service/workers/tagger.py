"""Tagger worker: texts -> token rows -> one label per word, with character spans; a word's
label is read at its first piece. The word is the bundle's `words` unit (`Manifest.words`):
a whitespace word (models/text/word_align.py; the default, and every bundle packed before the
option) or a word of the tokenizer.json's own pre-tokenizer (`JsonTokenizer.words`: a BERT
pre-tokenizer makes "Hello," two words, "Hello" and ",").

A tagger with a CRF (`Manifest.crf`) is decoded by the scheduler with Viterbi over each
text's tokens: its labels are the CRF's best labelling, each label's probability its marginal
under the CRF; `return_score` adds the best labelling's score (the CRF's: emissions plus
transitions, start and end; without a CRF the sum of the chosen labels' log-probs)."""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from seqserve.models.text.tokenizer_files import JsonTokenizer
from seqserve.models.text.word_align import Word, align
from seqserve.service.scheduling.base import Timed
from seqserve.service.scheduling.models import RowModel
from seqserve.service.workers.base import (
    Begun,
    Encoded,
    RequestContext,
    WorkerContext,
    describe_common,
    encode_texts,
    settle,
)

TagRow = tuple[np.ndarray, np.ndarray, np.ndarray]
"""One text's result from the scheduler: label index (L,), its probability (L,) and the
labelling's score (1,) (`scheduling.models.tagger_rows`)."""


class TaggerWorker:
    """Serves one tagger bundle version."""

    task: ClassVar[str] = "tagger"

    def __init__(self, ctx: WorkerContext[RowModel]) -> None:
        self.ctx = ctx
        self.labels = list(ctx.manifest.labels)
        self.words = ctx.manifest.words or "whitespace"
        self.crf = ctx.manifest.crf

    def begin_tag(self, texts: list[str], call: RequestContext,
                  return_score: bool = False) -> Begun:
        """One tagging per text (its words with label, probability and [start, end), and,
        with `return_score`, its labelling's score), submitted: its futures and what makes
        the results of them (`settle`)."""
        encoded = encode_texts(self.ctx.tokenizer, texts, self.ctx.limits, offsets=True)
        futures = self.ctx.model.submit([e.ids for e in encoded], call.deadline)

        def finish(done: list[Timed[TagRow]]) -> list[dict[str, Any]]:
            out = [self._tagging(t, e, d.value)
                   for t, e, d in zip(texts, encoded, done, strict=True)]
            if return_score:
                for result, d in zip(out, done, strict=True):
                    result["score"] = float(d.value[2][0])
            return out

        return futures, finish

    async def tag(self, texts: list[str], call: RequestContext,
                  return_score: bool = False) -> list[dict[str, Any]]:
        """`begin_tag`, awaited."""
        return await settle(self.begin_tag(texts, call, return_score), call)

    def _tagging(self, text: str, e: Encoded, row: TagRow) -> dict[str, Any]:
        best, prob = row[0], row[1]  # (L,), (L,)
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
        crf = {} if self.crf is None else {"crf": {"unit": self.crf.unit}}
        return {"labels": self.labels, "words": self.words, **crf, **describe_common(self.ctx)}
