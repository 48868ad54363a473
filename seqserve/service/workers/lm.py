"""Language-model worker: prompts -> token rows -> the LM scheduler -> text as it is generated.

`LMWorker.start(prompts, params, call)` checks the prompts with the one input contract
(`encode_texts`) and the generation limits, submits every prompt (bos first) as one request
and returns a `Generation`: `async for event in generation.events()` yields one
`{"prompt_index", "index", "text"}` per token as soon as it exists and one
`{"prompt_index", "index", "finish_reason"}` per finished sequence; afterwards
`generation.results()` and `generation.usage()` hold the whole answer.

Text is decoded from the sequence's pieces after the prompt's last piece (so a piece's
leading space survives). Stop strings are found in that text: the sequence ends before the
stop string (finish_reason "stop") and the scheduler is told to drop its row; text that might
be the start of a stop string is held back until it is not.

`score(texts, call)`: one batched prefill; the log-probability of every token of each text
after bos, and the text's perplexity.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

from seqserve.service.core.errors import BadRequest, ClientGone, DeadlineExceeded
from seqserve.service.scheduling.base import Timed
from seqserve.service.scheduling.generation import (
    FINISH_STOP,
    GenerateOptions,
    TokenEvent,
    TokenStream,
)
from seqserve.service.workers.base import (
    RequestContext,
    WorkerContext,
    describe_common,
    encode_texts,
)


class LMServed(Protocol):
    """What an LM worker needs of its model (in this process or in the engine)."""

    def generate(self, prompts: Sequence[list[int]], options: GenerateOptions,
                 deadline: float) -> TokenStream: ...

    def score(self, rows: Sequence[list[int]],
              deadline: float) -> list[asyncio.Future[Timed[Any]]]: ...

    def expected_wait(self) -> float | None: ...

    def describe(self) -> dict[str, Any]: ...


@dataclass(frozen=True)
class GenerateParams(GenerateOptions):
    """One generate request's options (the HTTP schema checked types and ranges): how it
    samples (`GenerateOptions`, whose defaults are the one table of them) and what only the
    worker reads (stop strings, whether to return log-probs)."""

    stop: tuple[str, ...] = ()
    logprobs: bool = False

    def sampling(self) -> GenerateOptions:
        """The options the scheduler needs (what travels to the engine)."""
        return GenerateOptions(**{f.name: getattr(self, f.name) for f in SAMPLING_FIELDS})


SAMPLING_FIELDS = dataclasses.fields(GenerateOptions)


@dataclass
class _Seq:
    prompt_index: int
    index: int
    context: int
    ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    tops: list[tuple[tuple[int, float], ...]] = field(default_factory=list)
    text: str = ""
    sent: int = 0
    """Characters of `text` already sent."""
    finish: str | None = None


class LMWorker:
    """Serves one language-model bundle version."""

    task: ClassVar[str] = "lm"

    def __init__(self, ctx: WorkerContext[Any], max_new_tokens: int) -> None:
        self.ctx = ctx
        self.max_new_tokens = max_new_tokens
        tok = ctx.tokenizer
        self._bos, self._eos = tok.bos_id, tok.eos_id

    def start(self, prompts: list[str], params: GenerateParams, call: RequestContext,
              on_token: Callable[[float, bool], None] | None = None) -> Generation:
        """Check and submit; BadRequest / QueueFull / ShuttingDown refuse at once."""
        if params.max_new_tokens > self.max_new_tokens:
            raise BadRequest(f"max_new_tokens {params.max_new_tokens} > the server's limit "
                             f"{self.max_new_tokens}")
        if len(prompts) * params.n > self.ctx.limits.max_texts:
            raise BadRequest(f"{len(prompts)} prompts x n={params.n} sequences > max_texts "
                             f"{self.ctx.limits.max_texts}")
        encoded = encode_texts(self.ctx.tokenizer, prompts, self.ctx.limits)
        options = params.sampling()
        rows = [[self._bos, *e.ids] for e in encoded]
        stream = self.ctx.model.generate(rows, options, call.deadline)
        return Generation(self, [e.ids for e in encoded], params, stream, call, on_token)

    async def score(self, texts: list[str], call: RequestContext) -> list[dict[str, Any]]:
        encoded = encode_texts(self.ctx.tokenizer, texts, self.ctx.limits)
        futures = self.ctx.model.score([[self._bos, *e.ids] for e in encoded], call.deadline)
        done: list[Timed[Any]] = await call.wait(futures)
        out = []
        for e, t in zip(encoded, done, strict=True):
            lps = [float(x) for x in t.value[0]]
            mean = -sum(lps) / len(lps)
            out.append({"tokens": [self.piece(i) for i in e.ids], "logprobs": lps,
                        "num_tokens": len(lps), "perplexity": math.exp(min(mean, 700.0)),
                        "truncated": e.truncated})
        return out

    def piece(self, token: int) -> str:
        """A token as text (SentencePiece's visible space as a space)."""
        return self.ctx.tokenizer.id_to_piece(token).replace("\u2581", " ")

    def describe(self) -> dict[str, Any]:
        d = describe_common(self.ctx)
        d["limits"]["max_new_tokens"] = self.max_new_tokens
        return d


class Generation:
    """One generate request in flight (see module doc)."""

    def __init__(self, worker: LMWorker, prompts: list[list[int]], params: GenerateParams,
                 stream: TokenStream, call: RequestContext,
                 on_token: Callable[[float, bool], None] | None) -> None:
        self.worker, self.params, self.stream, self.call = worker, params, stream, call
        self.prompt_tokens = sum(len(p) for p in prompts)
        self.seqs = [_Seq(i // params.n, i % params.n, prompts[i // params.n][-1])
                     for i in range(len(prompts) * params.n)]
        self.on_token = on_token
        self.started = time.monotonic()
        self._last: float | None = None
        tok = worker.ctx.tokenizer
        self._prefix = {s.context: tok.decode([s.context]) for s in self.seqs}

    async def events(self) -> AsyncIterator[dict[str, Any]]:
        """Token and finish events (module doc), one by one (see `batches`)."""
        async for batch in self.batches():
            for ev in batch:
                yield ev

    async def batches(self) -> AsyncIterator[list[dict[str, Any]]]:
        """Token and finish events (module doc), in the groups that arrived together (one
        step's, or several steps' when the reader was behind): a stream writes each group
        at once. Cancels the request if left early, on deadline (DeadlineExceeded) or when
        the client left (ClientGone).

        The deadline is one timer and the hang-up one callback for the whole generation,
        each interrupting the stream (not a race of futures per token)."""
        stream, call = self.stream, self.call
        timer = asyncio.get_running_loop().call_later(
            max(call.remaining(), 0.0), lambda: stream.interrupt(DeadlineExceeded(
                "request deadline passed; its generation was stopped")))

        def on_gone(f: asyncio.Future[Any]) -> None:
            if not f.cancelled():
                stream.interrupt(ClientGone("client disconnected"))

        gone = call.gone
        own_gone = gone is None
        if gone is None:
            gone = asyncio.ensure_future(call.disconnected.wait())
        gone.add_done_callback(on_gone)
        try:
            if gone.done() and not gone.cancelled():
                raise ClientGone("client disconnected")
            async for batch in stream:
                out = [x for ev in batch for x in self._apply(ev)]
                if out:
                    yield out
        finally:
            timer.cancel()
            gone.remove_done_callback(on_gone)
            if own_gone:
                gone.cancel()
            if any(s.finish is None for s in self.seqs):
                stream.cancel()

    async def run(self) -> None:
        """Consume every event (the JSON answer)."""
        async for _ in self.events():
            pass

    def _apply(self, ev: TokenEvent) -> list[dict[str, Any]]:
        seq = self.seqs[ev.index]
        if seq.finish is not None:
            return []
        out: list[dict[str, Any]] = []
        where = {"prompt_index": seq.prompt_index, "index": seq.index}
        if ev.token is not None and ev.token != self.worker._eos:
            self._timing()
            seq.ids.append(ev.token)
            seq.logprobs.append(ev.logprob)
            seq.tops.append(ev.top)
            checked = len(seq.text)  # text before this piece held no stop string
            seq.text = self._decode(seq)
            stops = self.params.stop
            cut = _find_stop(seq.text, stops, checked) if stops else None
            if cut is not None:
                seq.text = seq.text[:cut]
                seq.finish = FINISH_STOP
                if ev.finish is None:
                    self.stream.stop(ev.index)
            else:
                seq.finish = ev.finish
            end = len(seq.text) if seq.finish or not stops else len(seq.text) - _held(
                seq.text, stops)
            if end > seq.sent:
                out.append({**where, "text": seq.text[seq.sent : end]})
                seq.sent = end
        else:
            seq.finish = ev.finish or seq.finish
            if seq.finish and seq.sent < len(seq.text):
                out.append({**where, "text": seq.text[seq.sent :]})
                seq.sent = len(seq.text)
        if seq.finish is not None:
            out.append({**where, "finish_reason": seq.finish})
        return out

    def _timing(self) -> None:
        now = time.monotonic()
        if self.on_token is not None:
            first = self._last is None
            self.on_token(now - (self.started if self._last is None else self._last), first)
        self._last = now

    def _decode(self, seq: _Seq) -> str:
        """The sequence's text with its newest piece: the text of (previous piece, newest)
        after the previous piece's own, appended (a piece's leading space survives; O(1) a
        token, not a decode of the whole sequence each time). When the pair's text does not
        extend the previous piece's (bytes of one character split across pieces), the whole
        sequence is decoded after the prompt's last piece."""
        tok = self.worker.ctx.tokenizer
        ids = seq.ids
        prev = ids[-2] if len(ids) > 1 else seq.context
        prefix = self._prefix.get(prev)
        if prefix is None:
            prefix = self._prefix[prev] = tok.decode([prev])
        pair = tok.decode([prev, ids[-1]])
        if pair.startswith(prefix) and "\ufffd" not in pair:
            return seq.text + pair[len(prefix):]
        prefix = self._prefix[seq.context]
        full = tok.decode([seq.context, *ids])
        return full[len(prefix):] if full.startswith(prefix) else tok.decode(ids)

    def results(self) -> list[dict[str, Any]]:
        out = []
        for s in self.seqs:
            r: dict[str, Any] = {"prompt_index": s.prompt_index, "index": s.index,
                                 "text": s.text, "finish_reason": s.finish or "length"}
            if self.params.logprobs:
                r["tokens"] = [self.worker.piece(i) for i in s.ids]
                r["logprobs"] = list(s.logprobs)
                if self.params.top_logprobs:
                    r["top_logprobs"] = [{self.worker.piece(i): lp for i, lp in top}
                                         for top in s.tops]
            out.append(r)
        return out

    def usage(self) -> dict[str, int]:
        return {"prompt_tokens": self.prompt_tokens,
                "completion_tokens": sum(len(s.ids) for s in self.seqs)}


def _find_stop(text: str, stops: tuple[str, ...], checked: int = 0) -> int | None:
    """Where the earliest stop string starts in `text`, or None; `text[:checked]` is known to
    hold none (only a stop string that ends after it is looked for)."""
    found = [i for i in (text.find(s, max(checked - len(s) + 1, 0)) for s in stops if s)
             if i >= 0]
    return min(found) if found else None


def _held(text: str, stops: tuple[str, ...]) -> int:
    """Characters at the end of `text` that could begin a stop string (not sent yet)."""
    best = 0
    for s in stops:
        for k in range(min(len(s) - 1, len(text)), best, -1):
            if text.endswith(s[:k]):
                best = k
                break
    return best
