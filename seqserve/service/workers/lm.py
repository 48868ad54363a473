"""Language-model worker: prompts -> token rows -> the LM scheduler -> text as it is generated.

`LMWorker.start(prompts, params, call)` checks the prompts with the one input contract
(`encode_texts`; prompts given as token ids: `LMWorker.prompts`, each id in the vocabulary)
and the generation limits, submits every prompt (bos first, once: a prompt of ids that
starts with bos keeps its own) as one request and returns a `Generation`: `async for event
in generation.events()` yields one `{"prompt_index", "index", "text"}` per token as soon as
it exists (with log-probs asked, also the `tokens`, `logprobs` and, with alternatives,
`top_logprobs` of the tokens it carries; tokens whose text is not sent, a stop string's,
come with the finish event) and one `{"prompt_index", "index", "finish_reason"}` per
finished sequence; afterwards `generation.results()` and `generation.usage()` hold the whole
answer.

Text is decoded from the sequence's pieces after the prompt's last piece (so a piece's
leading space survives). Stop strings are found in that text: the sequence ends before the
stop string (finish_reason "stop") and the scheduler is told to drop its row; text that might
be the start of a stop string is held back until it is not.

`score(texts, call)`: one batched prefill; the log-probability of every token of each text
after bos, and the text's perplexity. `submit_scores` / `scored`: the same for prompts, with
the best tokens at every position when asked (OpenAI's `echo` with `logprobs`). The
tokenizer's own operations (token ids <-> text, special tokens by their strings):
`workers.lm_text`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import math
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

import numpy as np

from seqserve.models.text.tokenizer_files import TokenizerFailed
from seqserve.service.core.errors import (
    BadRequest,
    ClientGone,
    DeadlineExceeded,
    TextNotTokenizable,
)
from seqserve.service.core.state_token import (
    KIND_LM,
    LMResume,
    StateValue,
    bundle_identity,
    check_identity,
)
from seqserve.service.scheduling.base import Timed
from seqserve.service.scheduling.generation import (
    FINISH_STOP,
    GenerateOptions,
    TokenEvent,
    TokenStream,
)
from seqserve.service.scheduling.sampling import sequence_keys
from seqserve.service.workers import lm_text
from seqserve.service.workers.base import (
    RequestContext,
    WorkerContext,
    check_characters,
    describe_common,
    encode_texts,
)


class LMServed(Protocol):
    """What an LM worker needs of its model (in this process or in the engine)."""

    def generate(self, prompts: Sequence[list[int]], options: GenerateOptions,
                 deadline: float) -> TokenStream: ...

    def score(self, rows: Sequence[list[int]], deadline: float, top: int = 0,
              start: tuple[bytes, int] | None = None, return_state: bool = False
              ) -> list[asyncio.Future[Timed[Any]]]: ...

    def expected_wait(self) -> float | None: ...

    def describe(self) -> dict[str, Any]: ...


@dataclass(frozen=True)
class GenerateParams(GenerateOptions):
    """One generate request's options (the HTTP schema checked types and ranges): how it
    samples (`GenerateOptions`, whose defaults are the one table of them) and what only the
    worker reads (stop strings, whether to return log-probs)."""

    stop: tuple[str, ...] = ()
    logprobs: bool = False
    with_eos: bool = False
    """Log-probs list the eos a sequence drew, last (OpenAI's and vLLM's way; what lm-eval
    reads); its text never holds it."""
    limit_name: str = "max_new_tokens"
    """The request's name of `max_new_tokens` (OpenAI's and OIP's: max_tokens): the error
    over the server's limit names it."""

    def sampling(self) -> GenerateOptions:
        """The options the scheduler needs (what travels to the engine)."""
        return GenerateOptions(**{f.name: getattr(self, f.name) for f in SAMPLING_FIELDS})


SAMPLING_FIELDS = dataclasses.fields(GenerateOptions)


@dataclass(frozen=True)
class Prompt:
    """One prompt as the model reads it."""

    ids: list[int]
    """Its tokens, as given or encoded (never the bos the server puts first)."""
    row: list[int]
    """What the model reads: bos first (once)."""
    text: str
    """Its text: as given, or its ids' (special tokens by their strings)."""
    starts: list[int] | None = None
    """Where each of `ids` starts in `text` (when asked for)."""
    truncated: bool = False


@dataclass(frozen=True)
class Scored:
    """A prompt's log-probs from one prefill: `logprobs[j]` = log P(row[j+1] | row[:j+1]),
    `tops[j]` the best (token, log-prob) there (when asked for)."""

    logprobs: list[float]
    tops: list[tuple[tuple[int, float], ...]]
    state: tuple[bytes, int] | None = None
    """With return_state: the flat state before the text's last token, and that token."""


@dataclass
class Seq:
    """One generated sequence as it grows (what a `Generation` holds for each)."""

    prompt_index: int
    index: int
    context: int
    ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    tops: list[tuple[tuple[int, float], ...]] = field(default_factory=list)
    text: str = ""
    sent: int = 0
    """Characters of `text` already sent."""
    told: int = 0
    """Tokens whose log-probs were already sent (streams with log-probs)."""
    eos: tuple[float, tuple[tuple[int, float], ...]] | None = None
    """The eos it drew, if it did: its log-prob and alternatives."""
    finish: str | None = None
    drawn: int = 0
    """Tokens it drew (eos included)."""
    cached: int = 0
    """Its prompt's tokens a cached prefix saved."""
    state: str | None = None
    """With return_state: its state token, once finished."""


class LMWorker:
    """Serves one language-model bundle version."""

    task: ClassVar[str] = "lm"

    def __init__(self, ctx: WorkerContext[Any]) -> None:
        self.ctx = ctx
        self.max_new_tokens = ctx.max_new_tokens
        tok = ctx.tokenizer
        self._bos, self._eos = tok.bos_id, tok.eos_id
        self.specials = lm_text.Specials.of(tok)
        self.identity = bundle_identity(ctx.name, ctx.version, ctx.manifest.to_dict())
        """What its state tokens name (`core.state_token`)."""

    @property
    def eos_id(self) -> int:
        return self._eos

    def prompts(self, prompts: Sequence[str] | Sequence[list[int]], starts: bool = False,
                single: bool = False, split_special_tokens: bool = False) -> list[Prompt]:
        """Texts (the one input contract; special-token strings read as those tokens unless
        `split_special_tokens`: `lm_text.encode`) or token-id lists (each id in the
        vocabulary, the same count and token limits) as prompts; `starts`: where each token
        starts in its text too; `single`: the request gave one prompt (a 400 names `prompt`,
        not `prompt[i]`). A prompt that starts with bos gets no second one."""
        tok, limits = self.ctx.tokenizer, self.ctx.limits
        if not prompts or isinstance(prompts[0], str):
            texts = [str(p) for p in prompts]
            specials = None if split_special_tokens or self.specials.pattern is None else \
                functools.partial(lm_text.encode, tok, self.specials)
            encoded = encode_texts(tok, texts, limits, offsets=starts, encode=specials)
            return [Prompt(e.ids, self._row(e.ids), t,
                           [p.start for p in e.pieces] if e.pieces is not None else None,
                           e.truncated) for t, e in zip(texts, encoded, strict=True)]
        if len(prompts) > limits.max_texts:
            raise BadRequest(f"too many prompts: {len(prompts)} > max_texts "
                             f"{limits.max_texts}", param="prompt")
        out = []
        for i, given in enumerate(prompts):
            where = "prompt" if single else f"prompt[{i}]"
            ids = [int(x) for x in given]  # type: ignore[call-overload]  # ids here
            if not ids:
                raise BadRequest(f"{where} is empty (no tokens)", param="prompt")
            lm_text.check_ids(ids, tok.vocab_size, where)
            truncated = len(ids) > limits.max_tokens
            if truncated and not limits.truncate:
                raise BadRequest(f"{where} has {len(ids)} tokens > max_tokens "
                                 f"{limits.max_tokens} (the server is set to reject, not "
                                 "truncate)", param="prompt")
            ids = ids[: limits.max_tokens]
            text = self.detokenize(ids)
            out.append(Prompt(ids, self._row(ids), text,
                              lm_text.offsets(tok, self.specials, ids, text) if starts
                              else None, truncated))
        return out

    def _row(self, ids: list[int]) -> list[int]:
        """What the model reads of a prompt's ids: bos first (once)."""
        return ids if ids and ids[0] == self._bos else [self._bos, *ids]

    def resumed(self, value: StateValue, text: str, params: GenerateParams
                ) -> tuple[Prompt, GenerateParams, int]:
        """A prompt that continues a state token's sequence (`text` after it, possibly
        empty: generation goes on), the params that carry the state, and the position the
        generation starts at. The token's random stream continues unless the request gives
        another seed. A 400 / 409 names what does not fit."""
        check_identity(value, self.identity, KIND_LM, self.ctx.manifest.state_dim or
                       value.floats)
        lm = value.lm
        assert lm is not None  # a language-model token always carries it
        if params.n != 1:
            raise BadRequest("state continues one sequence: n must be 1", param="state")
        if params.seed is None or params.seed == lm.seed:
            key, drawn, seed = lm.key, lm.drawn, lm.seed
        else:  # another seed: a new stream of that seed
            key = int(sequence_keys(params.seed, np.zeros(1, np.int64))[0])
            drawn, seed = 0, params.seed
        ids = self.prompts([text])[0].ids if text else []
        prompt = Prompt(ids, ids, text)
        params = dataclasses.replace(params, seed=seed,
                                     resume=(value.state, lm.pending, key, drawn))
        return prompt, params, value.position + 1

    def start(self, prompts: Sequence[str] | Sequence[Prompt], params: GenerateParams,
              call: RequestContext,
              on_token: Callable[[float, bool], None] | None = None,
              issue: Callable[[StateValue], str] | None = None,
              resume: StateValue | None = None) -> Generation:
        """Check and submit; BadRequest / QueueFull / ShuttingDown refuse at once. `issue`
        signs a finished sequence's state (with `return_state`); `resume` continues a state
        token's sequence (one prompt, possibly empty)."""
        if params.return_state and issue is None:
            raise BadRequest("return_state: this server issues no state tokens",
                             param="return_state")
        if params.return_state and params.stop:
            raise BadRequest("return_state cannot be combined with stop strings (the state "
                             "after a stop string is not kept)", param="return_state")
        start_at = None
        if resume is not None:
            if len(prompts) != 1:
                raise BadRequest("state continues one prompt, not several", param="state")
            first = prompts[0]
            prompt, params, at = self.resumed(resume, first.text if isinstance(
                first, Prompt) else str(first), params)
            prompts, start_at = [prompt], at
        if params.max_new_tokens > self.max_new_tokens:
            name = params.limit_name
            raise BadRequest(f"{name} {params.max_new_tokens} > the server's limit "
                             f"{self.max_new_tokens}", param=name)
        if len(prompts) * params.n > self.ctx.limits.max_texts:
            raise BadRequest(f"{len(prompts)} prompts x n={params.n} sequences > max_texts "
                             f"{self.ctx.limits.max_texts}")
        given = [p for p in prompts if isinstance(p, Prompt)]
        if len(given) != len(prompts):
            given = self.prompts([str(p) for p in prompts])
        self.check_bias(params.logit_bias)
        options = params.sampling()
        stream = self.ctx.model.generate([p.row for p in given], options, call.deadline)
        positions = [start_at + len(p.row) if start_at is not None else len(p.row)
                     for p in given]
        contexts = [p.row[-1] if p.row else params.resume[1] for p in given  # type: ignore[index]
                    ]
        return Generation(self, [p.ids for p in given], params, stream, call, on_token,
                          issue, positions, contexts)

    def check_bias(self, bias: Sequence[tuple[int, float]]) -> None:
        """A 400 naming a biased token id outside the vocabulary."""
        size = self.ctx.tokenizer.vocab_size
        for token, _ in bias:
            if not 0 <= token < size:
                raise BadRequest(f"logit_bias: token id {token} is not in the vocabulary (0 "
                                 f"to {size - 1})", param="logit_bias")

    def submit_scores(self, prompts: Sequence[Prompt], top: int, deadline: float,
                      resume: StateValue | None = None, return_state: bool = False
                      ) -> list[asyncio.Future[Timed[Any]]]:
        """Queue the prompts' scoring (one batched prefill, like `score`), with `top` the
        best tokens at every position; `scored` waits for them. `resume`: one text scored
        after a state token's sequence; `return_state`: each text's state comes back."""
        if resume is None and not return_state:
            if top:
                return self.ctx.model.score([p.row for p in prompts], deadline, top)
            return self.ctx.model.score([p.row for p in prompts], deadline)
        start = None
        rows = [p.row for p in prompts]
        if resume is not None:
            check_identity(resume, self.identity, KIND_LM, self.ctx.manifest.state_dim or
                           resume.floats)
            if len(prompts) != 1:
                raise BadRequest("state continues one text, not several", param="state")
            assert resume.lm is not None
            start, rows = (resume.state, resume.lm.pending), [prompts[0].ids]
        return self.ctx.model.score(rows, deadline, top, start, return_state)

    async def scored(self, futures: list[asyncio.Future[Timed[Any]]], call: RequestContext,
                     with_state: bool = False) -> list[Scored]:
        """The scores `submit_scores` queued (`with_state`: asked with return_state)."""
        done: list[Timed[Any]] = await call.wait(futures)
        out = []
        for t in done:
            value = list(t.value)
            state = None
            if with_state:  # (state before the last token (S,), that token (1,)) last
                state = (value[-2].astype("float32").tobytes(), int(value[-1][0]))
                value = value[:-2]
            tops: list[tuple[tuple[int, float], ...]] = []
            if len(value) > 2:
                tops = [tuple(zip(i.tolist(), v.tolist(), strict=True))
                        for i, v in zip(value[1], value[2], strict=True)]
            out.append(Scored(value[0].tolist(), tops, state))
        return out

    async def score(self, texts: list[str], call: RequestContext,
                    issue: Callable[[StateValue], str] | None = None,
                    resume: StateValue | None = None, return_state: bool = False
                    ) -> list[dict[str, Any]]:
        """Each text's tokens, log-probs and perplexity; `resume`: one text scored after a
        state token's sequence; `return_state` (with `issue`): each text's state token."""
        if return_state and issue is None:
            raise BadRequest("return_state: this server issues no state tokens",
                             param="return_state")
        prompts = self.prompts(texts)
        futures = self.submit_scores(prompts, 0, call.deadline, resume, return_state)
        done = await self.scored(futures, call, return_state)
        base = 0 if resume is None else resume.position + 1
        out = []
        for p, scored in zip(prompts, done, strict=True):
            lps = scored.logprobs
            mean = -sum(lps) / len(lps)
            item = {"tokens": [self.piece(i) for i in p.ids], "logprobs": lps,
                    "num_tokens": len(lps), "perplexity": math.exp(min(mean, 700.0)),
                    "truncated": p.truncated}
            if scored.state is not None and issue is not None:
                fed = base + (len(p.ids) if resume is not None else len(p.row)) - 1
                seed_of = resume.lm if resume is not None else None
                item["state"] = issue(StateValue(
                    KIND_LM, self.identity, fed, scored.state[0],
                    LMResume(scored.state[1], seed_of.key if seed_of else 0,
                             seed_of.drawn if seed_of else 0,
                             seed_of.seed if seed_of else None)))
            out.append(item)
        return out

    def tokenize(self, text: str, add_special_tokens: bool = True,
                 split_special_tokens: bool = False) -> list[int]:
        """The ids of `text`, special tokens by their strings (`lm_text.tokenize`; with
        `split_special_tokens` such strings are ordinary text), once `check_characters`
        passed (an empty text is bos alone)."""
        check_characters(text, "prompt", self.ctx.limits.max_chars, param="prompt")
        tok = self.ctx.tokenizer
        try:
            if split_special_tokens:
                return [tok.bos_id] * add_special_tokens + tok.encode(text)
            return lm_text.tokenize(tok, self.specials, text, add_special_tokens)
        except TokenizerFailed as exc:
            raise TextNotTokenizable(f"this model's tokenizer could not process the text "
                                     f"({exc})") from exc

    def detokenize(self, ids: Sequence[int]) -> str:
        """The text of `ids`, special tokens by their strings (`lm_text.detokenize`)."""
        lm_text.check_ids(ids, self.ctx.tokenizer.vocab_size, "tokens", "tokens")
        return lm_text.detokenize(self.ctx.tokenizer, self.specials, ids)

    def tokenizer_info(self) -> dict[str, Any]:
        return lm_text.info(self.ctx.tokenizer, self.specials, self.ctx.name,
                            self.ctx.limits.max_tokens)

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
                 on_token: Callable[[float, bool], None] | None,
                 issue: Callable[[StateValue], str] | None = None,
                 positions: list[int] | None = None, contexts: list[int] | None = None
                 ) -> None:
        self.worker, self.params, self.stream, self.call = worker, params, stream, call
        self.issue = issue
        self.positions = positions or [len(p) for p in prompts]  # tokens each state read
        self.prompt_tokens = sum(len(p) for p in prompts)
        contexts = contexts or [p[-1] for p in prompts]
        self.seqs = [Seq(i // params.n, i % params.n, contexts[i // params.n])
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
        where: dict[str, Any] = {"prompt_index": seq.prompt_index, "index": seq.index}
        if ev.token is not None:
            seq.drawn += 1
        if ev.cached:
            seq.cached = ev.cached
        if ev.queued > self.call.queue_s:  # its Server-Timing queue (a JSON answer's)
            self.call.queue_s = ev.queued
        if ev.state is not None and self.issue is not None and ev.token is not None:
            seq.state = self._state_token(seq, ev)
        if ev.token is not None and ev.token != self.worker._eos:
            self._timing()
            seq.ids.append(ev.token)
            seq.logprobs.append(ev.logprob)
            seq.tops.append(ev.top)
            checked = len(seq.text)  # text before this piece held no stop string
            seq.text = self._decode(seq)
            stops = self.params.stop
            cut = lm_text.find_stop(seq.text, stops, checked) if stops else None
            if cut is not None:
                seq.text = seq.text[:cut]
                seq.finish = FINISH_STOP
                if ev.finish is None:
                    self.stream.stop(ev.index)
            else:
                seq.finish = ev.finish
            end = len(seq.text) if seq.finish or not stops else len(seq.text) - lm_text.held(
                seq.text, stops)
            if end > seq.sent:
                out.append(self._told(seq, {**where, "text": seq.text[seq.sent : end]}))
                seq.sent = end
        else:
            if ev.token is not None:  # eos: never text; its log-prob when asked
                seq.eos = (ev.logprob, ev.top)
            seq.finish = ev.finish or seq.finish
            if seq.finish and seq.sent < len(seq.text):
                out.append(self._told(seq, {**where, "text": seq.text[seq.sent :]}))
                seq.sent = len(seq.text)
        if seq.finish is not None:
            last: dict[str, Any] = {**where, "finish_reason": seq.finish}
            if seq.state is not None:
                last["state"] = seq.state
            out.append(self._told(seq, last))
        return out

    def _state_token(self, seq: Seq, ev: TokenEvent) -> str:
        """The finished sequence's state token: its state before its last token (pending)."""
        assert ev.state is not None and ev.token is not None and self.issue is not None
        state, key, drawn = ev.state
        seed = self.params.seed
        return self.issue(StateValue(
            KIND_LM, self.worker.identity, self.positions[seq.prompt_index] + seq.drawn - 1,
            state, LMResume(ev.token, key, drawn, seed)))

    def _told(self, seq: Seq, event: dict[str, Any]) -> dict[str, Any]:
        """`event` with the log-probs of the tokens not told yet, when asked (module doc);
        with `with_eos`, the finish event's has the eos drawn last."""
        params = self.params
        if not params.logprobs:
            return event
        ids, lps, tops = seq.ids[seq.told:], seq.logprobs[seq.told:], seq.tops[seq.told:]
        if params.with_eos and seq.eos is not None and "finish_reason" in event:
            ids, lps, tops = [*ids, self.worker.eos_id], [*lps, seq.eos[0]], [*tops, seq.eos[1]]
        if not ids:
            return event
        piece = self.worker.piece
        event["tokens"] = [piece(i) for i in ids]
        event["logprobs"] = lps
        if params.top_logprobs:
            event["top_logprobs"] = [{piece(i): lp for i, lp in top} for top in tops]
        seq.told = len(seq.ids)
        return event

    def _timing(self) -> None:
        now = time.monotonic()
        if self.on_token is not None:
            first = self._last is None
            self.on_token(now - (self.started if self._last is None else self._last), first)
        self._last = now

    def _decode(self, seq: Seq) -> str:
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
            if s.state is not None:
                r["state"] = s.state
            if self.params.logprobs:
                r["tokens"] = [self.worker.piece(i) for i in s.ids]
                r["logprobs"] = list(s.logprobs)
                if self.params.top_logprobs:
                    r["top_logprobs"] = [{self.worker.piece(i): lp for i, lp in top}
                                         for top in s.tops]
            out.append(r)
        return out

    def usage(self) -> dict[str, int]:
        cached = {s.prompt_index: s.cached for s in self.seqs}
        eos = self.params.with_eos  # OpenAI's and vLLM's count: a drawn eos is a token
        return {"prompt_tokens": self.prompt_tokens,
                "completion_tokens": sum(len(s.ids) + (eos and s.eos is not None)
                                         for s in self.seqs),
                "cached_tokens": sum(cached.values())}

