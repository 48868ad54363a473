"""Classifier worker: texts -> token rows -> label probabilities (and attention) per text."""

from __future__ import annotations

import math
from typing import Any, ClassVar

import numpy as np

from seqserve.service.core.errors import BadRequest
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

Row = tuple[np.ndarray, np.ndarray]
"""One text's result from the scheduler: logits (C,) and attention weights (L,)."""


def softmax(logits: np.ndarray) -> np.ndarray:
    """float64 softmax of (C,) logits. The ufuncs' own reductions: `ndarray.max()` and
    `.sum()` reach the same ones through numpy's Python wrappers, which cost more than the
    arithmetic on a few labels."""
    z = logits.astype(np.float64)
    z -= np.maximum.reduce(z)
    e = np.exp(z)
    return e / np.add.reduce(e)  # (C,)


PYTHON_SOFTMAX_LABELS = 24
"""Up to this many labels `probabilities` computes in Python floats: four numpy calls on a
few labels cost more than the arithmetic (measured, best of 5 x 50k calls: 2.0 vs 6.1 us for
5 labels, 5.6 vs 7.6 for 16, 4.6 vs 7.2 for 24; even at 32, 6.4 vs 6.2)."""


def probabilities(logits: np.ndarray) -> list[float]:
    """`softmax(logits).tolist()`, in Python floats for a few labels (the same float64
    arithmetic: max-shifted exp over its sum; NaN logits give NaN everywhere as numpy does)."""
    if logits.shape[0] > PYTHON_SOFTMAX_LABELS:
        return softmax(logits).tolist()  # type: ignore[no-any-return]
    values = logits.tolist()
    top = max(values)
    if top != top:  # a NaN first: numpy's max is NaN, so is every probability
        return [math.nan] * len(values)
    e = [math.exp(v - top) for v in values]
    total = sum(e)
    return [x / total for x in e]


class ClassifierWorker:
    """Serves one classifier bundle version."""

    task: ClassVar[str] = "classifier"

    def __init__(self, ctx: WorkerContext[RowModel]) -> None:
        self.ctx = ctx
        self.labels = list(ctx.manifest.labels)

    async def rows(self, encoded: list[Encoded], call: RequestContext) -> list[Row]:
        futures = self.ctx.model.submit([e.ids for e in encoded], call.deadline)
        done: list[Timed[Row]] = await call.wait(futures)
        return [d.value for d in done]

    def begin_classify(self, texts: list[str], top_k: int, return_attention: bool,
                       call: RequestContext) -> Begun:
        """One classification per text (label, score, top-k, token count, and attention),
        submitted: its futures and what makes the results of them (`settle`)."""
        if return_attention and not self.ctx.manifest.has_attention:
            raise BadRequest(f"model {self.ctx.name!r} v{self.ctx.version} has no attention "
                             "output (its classifier graph returns logits only): drop "
                             "return_attention")
        encoded = encode_texts(self.ctx.tokenizer, texts, self.ctx.limits,
                               offsets=return_attention)
        futures = self.ctx.model.submit([e.ids for e in encoded], call.deadline)

        def finish(done: list[Timed[Row]]) -> list[dict[str, Any]]:
            return [self._result(e, d.value[0], d.value[1], top_k, return_attention)
                    for e, d in zip(encoded, done, strict=True)]

        return futures, finish

    async def classify(self, texts: list[str], top_k: int, return_attention: bool,
                       call: RequestContext) -> list[dict[str, Any]]:
        """`begin_classify`, awaited."""
        return await settle(self.begin_classify(texts, top_k, return_attention, call), call)

    async def probabilities(self, texts: list[str], call: RequestContext) -> np.ndarray:
        """(n, C) float32 label probabilities of each text (the OIP output)."""
        rows = await self.rows(encode_texts(self.ctx.tokenizer, texts, self.ctx.limits), call)
        return np.stack([softmax(logits) for logits, _ in rows]).astype(np.float32)  # (n, C)

    def _result(self, e: Encoded, logits: np.ndarray, att: np.ndarray, top_k: int,
                with_att: bool) -> dict[str, Any]:
        values = probabilities(logits)  # (C,) Python floats (not one numpy scalar per label)
        if top_k == 1:  # the first highest, as the stable sort below would give
            order = [values.index(max(values))]
        else:
            order = np.argsort(-np.asarray(values), kind="stable")[
                : min(top_k, len(self.labels))].tolist()
        top = [{"label": self.labels[j], "probability": values[j]} for j in order]
        out: dict[str, Any] = {
            "label": top[0]["label"], "score": top[0]["probability"], "top_k": top,
            "num_tokens": len(e.ids), "truncated": e.truncated,
            "unknown_fraction": e.unknown,
        }
        if with_att and e.pieces is not None:
            out["attention"] = [
                {"token": p.piece, "weight": float(w), "start": p.start, "end": p.end}
                for p, w in zip(e.pieces, att, strict=True)
            ]
        return out

    def describe(self) -> dict[str, Any]:
        return {"labels": self.labels, **describe_common(self.ctx)}
