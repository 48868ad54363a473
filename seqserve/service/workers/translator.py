"""Translator worker: texts -> source token rows -> the decode scheduler -> n-best translations."""

from __future__ import annotations

import math
from typing import Any, ClassVar

from seqserve.service.core.errors import BadRequest
from seqserve.service.scheduling.decoding import Decoded
from seqserve.service.scheduling.models import DecodeModel
from seqserve.service.scheduling.search import Hypothesis, SearchOptions
from seqserve.service.workers.base import (
    Begun,
    Encoded,
    RequestContext,
    WorkerContext,
    describe_common,
    encode_texts,
    settle,
)


class TranslatorWorker:
    """Serves one translator bundle version."""

    task: ClassVar[str] = "translator"

    def __init__(self, ctx: WorkerContext[DecodeModel]) -> None:
        self.ctx = ctx

    def begin_translate(self, texts: list[str], options: SearchOptions,
                        call: RequestContext) -> Begun:
        """One translation per text (the best hypothesis, the n-best list and, when
        `options.return_attention`, the attention matrix of the best one), submitted: its
        futures and what makes the results of them (`settle`)."""
        self.check_options(options)
        encoded = encode_texts(self.ctx.tokenizer, texts, self.ctx.limits,
                               offsets=options.return_attention)
        futures = self.ctx.model.submit([e.ids for e in encoded], options, call.deadline)

        def finish(decoded: list[Decoded]) -> list[dict[str, Any]]:
            return [self._translation(e, d.hypotheses, options.return_attention)
                    for e, d in zip(encoded, decoded, strict=True)]

        return futures, finish

    async def translate(self, texts: list[str], options: SearchOptions,
                        call: RequestContext) -> list[dict[str, Any]]:
        """`begin_translate`, awaited."""
        return await settle(self.begin_translate(texts, options, call), call)

    def check_options(self, options: SearchOptions) -> None:
        """Options that read the attention are refused for a decoder without one."""
        m = self.ctx.manifest
        if m.has_attention:
            return
        asked = [name for name, on in (("return_attention", options.return_attention),
                                       ("coverage_penalty", options.coverage_penalty > 0)) if on]
        if asked:
            why = (f"decoder {m.decoder!r}: fixed context, no alignment" if m.decoder == "none"
                   else "its decoder step returns no attention")
            raise BadRequest(f"model {self.ctx.name!r} v{self.ctx.version} has no attention "
                             f"({why}): drop {' and '.join(asked)}")

    def _translation(self, source: Encoded, hyps: list[Hypothesis],
                     with_attention: bool) -> dict[str, Any]:
        out = [self._hypothesis(h) for h in hyps]
        best = out[0] if out else {"translation": "", "score": 0.0, "tokens": [], "token_ids": []}
        result: dict[str, Any] = {"translation": best["translation"], "score": best["score"],
                                  "tokens": best["tokens"], "hypotheses": out,
                                  "truncated": source.truncated,
                                  "unknown_fraction": source.unknown}
        matrix = hyps[0].attention_matrix() if with_attention and hyps else None
        if matrix is not None:
            tok = self.ctx.target
            result["attention"] = {
                "source_tokens": [p.piece for p in source.pieces or []],
                "target_tokens": [tok.id_to_piece(i) for i in hyps[0].token_ids],
                "weights": matrix.astype(float).tolist(),  # (L, S)
            }
        return result

    def _hypothesis(self, h: Hypothesis) -> dict[str, Any]:
        tok = self.ctx.target
        ids = list(h.token_ids[:-1] if h.ended else h.token_ids)
        score = h.score if math.isfinite(h.score) else -1e30  # JSON has no -inf
        return {"translation": tok.decode(ids), "score": score,
                "tokens": [tok.id_to_piece(i) for i in ids], "token_ids": ids}

    def describe(self) -> dict[str, Any]:
        m = self.ctx.manifest
        decoder = m.decoder or ("luong" if not m.source else "packed")
        return {**describe_common(self.ctx), "decoder": decoder}
