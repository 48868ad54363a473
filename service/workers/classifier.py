"""Classifier worker: tokenizer + limits + a dynamic batcher over the `classifier` graph."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from models.tokenizer import Piece
from service.batcher import Batcher, BatcherConfig
from service.errors import BadRequest
from service.workers.base import Call, V2Tensor, WorkerContext, v2_texts

Row = tuple[np.ndarray, np.ndarray]
"""One text's result: logits (C,) and attention weights (length,)."""


@dataclass(frozen=True)
class Encoded:
    """One text after tokenization and the token limit."""

    ids: list[int]
    pieces: list[Piece] | None
    """Pieces with character offsets (only when attention was asked for: 10x slower)."""
    truncated: bool


def length_buckets(max_tokens: int) -> list[int]:
    """Warm-up lengths: powers of two up to, and including, `max_tokens`."""
    out, n = [], 1
    while n < max_tokens:
        out.append(n)
        n *= 2
    return [*out, max_tokens]


def check_unicode(text: str, i: int) -> None:
    """JSON may carry lone surrogates ("\\ud800") that no tokenizer can take: a 400."""
    if text.isascii():
        return
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise BadRequest(f"texts[{i}] is not valid Unicode ({exc.reason})") from exc


def softmax(logits: np.ndarray) -> np.ndarray:
    z = logits.astype(np.float64) - logits.max()
    e = np.exp(z)
    return e / e.sum()  # (C,)


class ClassifierWorker:
    """Serves one classifier bundle version."""

    task: ClassVar[str] = "classifier"

    def __init__(self, ctx: WorkerContext) -> None:
        self.ctx = ctx
        s = ctx.settings
        self.labels = list(ctx.manifest.labels)
        bundle_max = ctx.manifest.limits.get("max_tokens", s.max_tokens)
        self.max_tokens = min(s.max_tokens, bundle_max)
        self.pad_id = ctx.manifest.tokenizer.pad_id
        config = BatcherConfig(
            max_batch_size=s.max_batch_size,
            max_batch_tokens=max(s.max_batch_tokens, self.max_tokens),
            max_wait_s=s.max_wait_ms / 1000.0,
            queue_size=s.queue_size,
            retry_after_s=s.retry_after_s,
            overhead_tokens=s.batch_overhead_tokens,
        )
        self.batcher: Batcher[list[int], Row] = Batcher(
            self.compute, config, name=ctx.name, observer=ctx.metrics.batch_observer(ctx.name)
        )

    # -- lifecycle ---------------------------------------------------------------------

    async def start(self) -> None:
        if self.ctx.settings.warmup:
            await asyncio.to_thread(self.warmup)
        self.batcher.start()

    def warmup(self) -> None:
        """Run every length bucket at batch 1 and at the largest batch the budget allows."""
        unk = self.ctx.manifest.tokenizer.unk_id
        cfg = self.batcher.config
        for length in length_buckets(self.max_tokens):
            rows = max(1, min(cfg.max_batch_size, cfg.max_batch_tokens // length))
            for n in sorted({1, rows}):
                self.compute([[unk] * length] * n)

    async def stop(self, timeout: float) -> bool:
        return await self.batcher.close(timeout)

    # -- compute (runs in the batcher's thread) ----------------------------------------

    def compute(self, rows: list[list[int]]) -> list[Row]:
        """Right-pad `rows`, run the graph, return each row's logits and attention."""
        lengths = np.array([len(r) for r in rows], dtype=np.int64)  # (B,)
        ids = np.full((len(rows), int(lengths.max())), self.pad_id, dtype=np.int64)  # (B, T)
        for i, r in enumerate(rows):
            ids[i, : len(r)] = r
        out = self.ctx.runtime.run("classifier", {"input_ids": ids, "lengths": lengths})
        logits, attention = out["logits"], out["attention"]  # (B, C), (B, T)
        return [(logits[i], attention[i, : lengths[i]]) for i in range(len(rows))]

    # -- requests ----------------------------------------------------------------------

    def encode(self, texts: list[str], offsets: bool = False) -> list[Encoded]:
        """Tokenize with the settings' limits; BadRequest names the text and the limit."""
        s = self.ctx.settings
        if len(texts) > s.max_texts:
            raise BadRequest(f"too many texts: {len(texts)} > max_texts {s.max_texts}")
        out = []
        for i, text in enumerate(texts):
            if len(text) > s.max_chars:
                raise BadRequest(f"texts[{i}] has {len(text)} characters > max_chars {s.max_chars}")
            check_unicode(text, i)
            pieces = self.ctx.tokenizer.encode_with_offsets(text) if offsets else None
            ids = [p.id for p in pieces] if pieces is not None else self.ctx.tokenizer.encode(text)
            if not ids:
                raise BadRequest(f"texts[{i}] is empty (no tokens)")
            truncated = len(ids) > self.max_tokens
            if truncated and not s.truncate:
                raise BadRequest(
                    f"texts[{i}] has {len(ids)} tokens > max_tokens {self.max_tokens} "
                    "(the server is set to reject, not truncate)"
                )
            kept = pieces[: self.max_tokens] if pieces is not None else None
            out.append(Encoded(ids[: self.max_tokens], kept, truncated))
        return out

    async def run_rows(self, encoded: list[Encoded], call: Call) -> list[Row]:
        deadline = time.monotonic() + max(call.remaining(), 0.0)
        futures = self.batcher.submit([(e.ids, len(e.ids)) for e in encoded], deadline)
        return await call.wait_all(futures)

    async def classify(
        self, texts: list[str], top_k: int, return_attention: bool, call: Call
    ) -> list[dict[str, Any]]:
        """One `Classification` (as plain data) per text."""
        encoded = self.encode(texts, offsets=return_attention)
        rows = await self.run_rows(encoded, call)
        return [
            self._result(e, logits, att, top_k, return_attention)
            for e, (logits, att) in zip(encoded, rows, strict=True)
        ]

    def _result(
        self, e: Encoded, logits: np.ndarray, att: np.ndarray, top_k: int, with_att: bool
    ) -> dict[str, Any]:
        probs = softmax(logits)  # (C,)
        order = np.argsort(-probs, kind="stable")[: min(top_k, len(self.labels))]
        top = [{"label": self.labels[j], "probability": float(probs[j])} for j in order]
        out: dict[str, Any] = {
            "label": top[0]["label"], "score": top[0]["probability"], "top_k": top,
            "num_tokens": len(e.ids), "truncated": e.truncated,
        }
        if with_att and e.pieces is not None:
            out["attention"] = [
                {"token": p.piece, "weight": float(w), "start": p.start, "end": p.end}
                for p, w in zip(e.pieces, att, strict=True)
            ]
        return out

    # -- description and OIP -----------------------------------------------------------

    def describe(self) -> dict[str, Any]:
        m = self.ctx.manifest
        return {
            "labels": self.labels,
            "limits": {"max_tokens": self.max_tokens, "bundle": dict(m.limits)},
            "runtime": self.ctx.runtime.name,
            "providers": list(self.ctx.runtime.providers),
            "metrics": dict(m.source_run.get("test_metrics") or {}),
            "created": m.created,
        }

    def v2_signature(self) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        inputs = [{"name": "text", "datatype": "BYTES", "shape": [-1]}]
        outputs = [
            {"name": "label", "datatype": "BYTES", "shape": [-1]},
            {"name": "probabilities", "datatype": "FP32", "shape": [-1, len(self.labels)]},
        ]
        return inputs, outputs

    async def v2_infer(self, inputs: dict[str, V2Tensor], call: Call) -> list[V2Tensor]:
        texts = v2_texts(inputs)
        rows = await self.run_rows(self.encode(texts), call)
        probs = np.stack([softmax(logits) for logits, _ in rows]).astype(np.float32)  # (n, C)
        labels = [self.labels[int(j)] for j in probs.argmax(axis=1)]
        n, c = probs.shape
        return [
            V2Tensor("label", "BYTES", [n], labels),
            V2Tensor("probabilities", "FP32", [n, c], [float(x) for x in probs.reshape(-1)]),
        ]
