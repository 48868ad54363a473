"""Translator worker: tokenizer + limits + the decoding engine over a translator bundle.

Registered for task "translator" in `service.workers.WORKERS`; the v1 translate route
(`service.routes.translate`) and the OIP v2 infer route call it.
"""

from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass
from typing import Any, ClassVar

from models.tokenizer import Piece, Tokenizer
from service.engine.engine import Decoded, DecodingEngine, EngineConfig
from service.engine.search import DecodeLimits, Hypothesis, SearchOptions
from service.errors import BadRequest, ClientGone, DeadlineExceeded, ShuttingDown
from service.metrics import Metrics
from service.schemas_translate import (
    AttentionMatrix,
    TranslateOptions,
    Translation,
    TranslationHypothesis,
)
from service.workers.base import Call, V2Tensor, WorkerContext, v2_texts

"""Live-hypothesis cap when the settings have no `max_live_hypotheses`."""


@dataclass(frozen=True)
class Source:
    """One text after tokenization and the token limit."""

    ids: list[int]
    pieces: list[str]
    truncated: bool


class PrometheusObserver:
    """Records the engine's work into the app's metrics (labels bound to one model)."""

    def __init__(self, metrics: Metrics, model: str) -> None:
        self.encoder_time = metrics.encoder_time.labels(model)
        self.step_time = metrics.decoder_step_time.labels(model)
        self.batch_size = metrics.batch_size.labels(model)
        self.steps = metrics.decode_steps.labels(model)
        self.tokens = metrics.generated_tokens.labels(model)
        self.per_token = metrics.time_per_token.labels(model)
        self.live = metrics.live_hypotheses.labels(model)
        self.depth = metrics.queue_depth.labels(model)

    def on_encode(self, seconds: float, batch: int) -> None:
        self.encoder_time.observe(seconds)

    def on_step(self, seconds: float, rows: int) -> None:
        self.step_time.observe(seconds)
        self.batch_size.observe(rows)
        self.steps.inc()

    def on_finish(self, tokens: int, seconds: float) -> None:
        self.tokens.inc(tokens)
        if tokens:
            self.per_token.observe(seconds / tokens)

    def on_depth(self, waiting: int, live_rows: int) -> None:
        self.depth.set(waiting)
        self.live.set(live_rows)


def decode_limits(ctx: WorkerContext) -> DecodeLimits:
    t, limits = ctx.manifest.tokenizer, ctx.manifest.limits
    return DecodeLimits(bos_id=t.bos_id, eos_id=t.eos_id, vocab_size=t.vocab_size,
                        max_decode_length=int(limits.get("max_decode_length", 128)))


class TranslatorWorker:
    """Serves one translator bundle version through a `DecodingEngine`."""

    task: ClassVar[str] = "translator"

    def __init__(self, ctx: WorkerContext) -> None:
        self.ctx = ctx
        s = ctx.settings
        self.max_tokens = min(s.max_tokens, ctx.manifest.limits.get("max_tokens", s.max_tokens))
        config = EngineConfig(
            max_live_hypotheses=s.max_live_hypotheses,
            max_queue=s.queue_size, max_admit=s.max_batch_size,
            groups=s.decode_groups, pad_id=ctx.manifest.tokenizer.pad_id)
        self.engine = DecodingEngine(ctx.runtime, decode_limits(ctx), config,
                                     PrometheusObserver(ctx.metrics, ctx.name))

    @property
    def providers(self) -> list[str]:
        return list(self.ctx.runtime.providers)

    # -- lifecycle ----------------------------------------------------------------------

    async def start(self) -> None:
        self.engine.start()
        if self.ctx.settings.warmup:  # one short decode per source length bucket
            unk = self.ctx.manifest.tokenizer.unk_id
            lengths = sorted({1, min(8, self.max_tokens), self.max_tokens})
            await self.engine.translate([[unk] * n for n in lengths],
                                        SearchOptions(beam_size=4, max_length=3))

    async def stop(self, timeout: float) -> bool:
        """Finish admitted and queued translations within `timeout`; then fail the rest."""
        stopping = asyncio.ensure_future(self.engine.stop())
        done, _ = await asyncio.wait({stopping}, timeout=timeout)
        if done:
            return True
        self.engine.abort(ShuttingDown("the server stopped before this translation finished"))
        await asyncio.wait({stopping}, timeout=5.0)
        return False

    # -- requests -----------------------------------------------------------------------

    def encode(self, texts: list[str]) -> list[Source]:
        """Tokenize with the settings' limits; BadRequest names the text and the limit."""
        s = self.ctx.settings
        if len(texts) > s.max_texts:
            raise BadRequest(f"too many texts: {len(texts)} > max_texts {s.max_texts}")
        return [encode_text(self.ctx.tokenizer, text, i, self.max_tokens, s.max_chars,
                            s.truncate) for i, text in enumerate(texts)]

    async def decode(self, sources: list[Source], options: SearchOptions,
                     call: Call) -> list[Decoded]:
        """Run the engine; on deadline or disconnect the sources are cancelled (rows freed)."""
        task = asyncio.ensure_future(self.engine.translate([s.ids for s in sources], options))
        gone = asyncio.ensure_future(call.disconnected.wait())
        try:
            done, _ = await asyncio.wait({task, gone}, timeout=max(call.remaining(), 0.0),
                                         return_when=asyncio.FIRST_COMPLETED)
            if task in done:
                decoded = task.result()
                call.queue_s = max(d.queue_s for d in decoded)
                call.compute_s = max(d.decode_s for d in decoded)
                call.batch_sizes.append(len(decoded))  # the middleware then records both
                return decoded
            if gone in done:
                raise ClientGone("client disconnected")
            raise DeadlineExceeded("request deadline passed; its decoding was stopped")
        finally:
            gone.cancel()
            task.cancel()  # no-op when done; else its sources' rows are freed at the next step

    def check_options(self, options: TranslateOptions) -> None:
        """Options that read the attention are refused for a decoder without one."""
        m = self.ctx.manifest
        if m.has_attention:
            return
        asked = [name for name, on in (("return_attention", options.return_attention),
                                       ("coverage_penalty", options.coverage_penalty > 0)) if on]
        if asked:
            raise BadRequest(f"model {self.ctx.name!r} v{self.ctx.version} has no attention "
                             f"(decoder {m.decoder!r}: fixed context, no alignment): "
                             f"drop {' and '.join(asked)}")

    async def translate(self, texts: list[str], options: TranslateOptions,
                        call: Call) -> list[Translation]:
        self.check_options(options)
        sources = self.encode(texts)
        decoded = await self.decode(sources, options.search_options(), call)
        return [self.result(s, d.hypotheses, options.return_attention)
                for s, d in zip(sources, decoded, strict=True)]

    def result(self, source: Source, hyps: list[Hypothesis], with_attention: bool) -> Translation:
        tok = self.ctx.tokenizer
        out = [self._hypothesis(h) for h in hyps]
        attention = None
        matrix = hyps[0].attention_matrix() if with_attention and hyps else None
        if matrix is not None:
            attention = AttentionMatrix(
                source_tokens=source.pieces,
                target_tokens=[tok.id_to_piece(i) for i in hyps[0].token_ids],
                weights=[[float(w) for w in row] for row in matrix])
        best = out[0] if out else TranslationHypothesis(translation="", score=0.0, tokens=[],
                                                       token_ids=[])
        return Translation(translation=best.translation, score=best.score, tokens=best.tokens,
                           hypotheses=out, attention=attention, truncated=source.truncated)

    def _hypothesis(self, h: Hypothesis) -> TranslationHypothesis:
        tok = self.ctx.tokenizer
        ids = list(h.token_ids[:-1] if h.ended else h.token_ids)
        score = h.score if math.isfinite(h.score) else -1e30  # JSON has no -inf
        return TranslationHypothesis(translation=tok.decode(ids), score=score,
                                     tokens=[tok.id_to_piece(i) for i in ids], token_ids=ids)

    # -- description and OIP ------------------------------------------------------------

    def describe(self) -> dict[str, Any]:
        m, cfg = self.ctx.manifest, self.engine.config
        return {
            "limits": {"max_tokens": self.max_tokens,
                       "max_decode_length": self.engine.limits.max_decode_length,
                       "max_live_hypotheses": cfg.max_live_hypotheses,
                       "queue_size": cfg.max_queue, "bundle": dict(m.limits)},
            "runtime": self.ctx.runtime.name,
            "providers": self.providers,
            "decoder": m.decoder or "luong",
            "metrics": dict(m.source_run.get("test_metrics") or {}),
            "created": m.created,
        }

    def v2_signature(self) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        inputs = [{"name": "text", "datatype": "BYTES", "shape": [-1]}]
        outputs = [{"name": "translation", "datatype": "BYTES", "shape": [-1]},
                   {"name": "score", "datatype": "FP32", "shape": [-1]}]
        return inputs, outputs

    async def v2_infer(self, inputs: dict[str, V2Tensor], call: Call,
                       parameters: dict[str, Any] | None = None) -> list[V2Tensor]:
        """OIP infer: `text` BYTES [n] -> `translation` BYTES [n], `score` FP32 [n].

        Search options come from the request's `parameters` (same names as v1).
        """
        if parameters is None:
            parameters = call.parameters
        options = TranslateOptions.from_parameters(parameters)
        texts = v2_texts(inputs)
        results = await self.translate(texts, options, call)
        n = len(results)
        return [V2Tensor("translation", "BYTES", [n], [r.translation for r in results]),
                V2Tensor("score", "FP32", [n], [float(r.score) for r in results])]


def encode_text(tok: Tokenizer, text: str, i: int, max_tokens: int, max_chars: int,
                truncate: bool) -> Source:
    """One text's source ids and pieces under the limits (BadRequest names the text)."""
    if len(text) > max_chars:
        raise BadRequest(f"texts[{i}] has {len(text)} characters > max_chars {max_chars}")
    pieces: list[Piece] = tok.encode_with_offsets(text)
    if not pieces:
        raise BadRequest(f"texts[{i}] is empty (no tokens)")
    truncated = len(pieces) > max_tokens
    if truncated and not truncate:
        raise BadRequest(f"texts[{i}] has {len(pieces)} tokens > max_tokens {max_tokens} "
                         "(the server is set to reject, not truncate)")
    pieces = pieces[:max_tokens]
    return Source([p.id for p in pieces], [p.piece for p in pieces], truncated)
