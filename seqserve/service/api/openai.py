"""OpenAI-compatible completions: POST /v1/completions, for the clients (and the evaluation
harnesses) users already have.

`model` is a bundle name (its default version); `prompt` a string, a list of strings, a list
of token ids (one prompt) or a list of lists of token ids (each id in the model's
vocabulary: a 400 names the index). The fields are OpenAI's: `max_tokens` (0 only with
`echo`: the prompt scored, nothing generated), `temperature`, `top_p`, `n`, `best_of` (>= n:
that many sequences per prompt, the n with the highest total log-prob returned, best first;
not with `stream`), `stop`, `seed`, `stream` and `stream_options.include_usage` (a last chunk
with `usage` and no choices), `logprobs` (an integer: that many alternatives per token),
`echo` (the text starts with the prompt; with `logprobs`, the prompt's tokens come first,
each with its log-prob given the text before it and its alternatives, the first one's
`null`: nothing before it; the bos the server puts first is never echoed; a prompt of ids
that starts with bos is echoed from its bos; a sequence that ends by drawing eos lists it
last, as OpenAI and vLLM do, though its text never holds it), `presence_penalty` and
`frequency_penalty` (-2 to 2, on the tokens a sequence already generated), `logit_bias`
(token id -> -100 to 100, added to the logits before each draw), `ignore_eos` (vLLM's: eos
is never drawn), `user` (accepted, unused). Any other field is a 400 naming it.

The prompt's log-probs come from the batched prefill of /score (`LMWorker.submit_scores`:
the prefill graph's log-probs at every position, the best tokens when asked), queued with
the generation, so both usually share one prefill. Log-probs are the model's own (before
temperature, cuts, penalties and biases). Answers, stream chunks (with `logprobs` when
asked) and errors have OpenAI's shapes (`{"error": {"message", "type", "param",
"code"}}`); the work goes through the same LM worker, limits and admission as
`/v1/models/{name}/generate`. finish_reason: "length", or "stop" (a stop string or the end
of a document: OpenAI has no "eos").
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictStr,
    ValidationError,
)

from seqserve.service.api.common import HARD_MAX_TEXTS, Text, WholeInt, standard_bounds
from seqserve.service.api.generate import (
    DEFAULTS,
    MAX_N,
    MAX_TOP_LOGPROBS,
    RETURN_STATE_DOC,
    STATE_DOC,
    EventStream,
    StateText,
    StopList,
    StopText,
    count_tokens,
    sse,
    state_args,
    token_timer,
)
from seqserve.service.api.lifecycle import Call, Route, admit, answer
from seqserve.service.api.translate import MAX_SEED, Number
from seqserve.service.core.errors import BadRequest
from seqserve.service.web.state import AppState
from seqserve.service.workers.base import RequestContext
from seqserve.service.workers.lm import (
    GenerateParams,
    Generation,
    LMWorker,
    Prompt,
    Scored,
    Seq,
)

MAX_LOGIT_BIAS = 300
"""Most entries of `logit_bias`."""
PromptList = Annotated[list[Text], Field(min_length=1, max_length=HARD_MAX_TEXTS)]
TokenIds = Annotated[list[WholeInt], Field(min_length=1)]
IdsList = Annotated[list[TokenIds], Field(min_length=1, max_length=HARD_MAX_TEXTS)]
Bias = Annotated[Number, Field(ge=-100, le=100)]
Penalty = Annotated[Number, Field(ge=-2, le=2)]
SERVED = ("model", "prompt", "max_tokens", "temperature", "top_p", "n", "best_of", "stop",
          "seed", "stream", "stream_options", "logprobs", "echo", "presence_penalty",
          "frequency_penalty", "logit_bias", "ignore_eos", "user", "return_state", "state")
PROMPT_SHAPES = ("prompt: a string, a list of strings, a list of token ids or a list of lists "
                 "of token ids (none empty)")


class StreamOptions(BaseModel):
    """OpenAI's stream options."""

    model_config = ConfigDict(extra="forbid")

    include_usage: StrictBool = Field(False, description="A last chunk with `usage` and no "
                                                         "choices.")
    continuous_usage_stats: StrictBool = Field(
        False, description="vLLM's: every chunk carries the usage so far (what guidellm "
                           "sends); with include_usage.")


class CompletionRequest(BaseModel):
    """OpenAI's completion request (the fields seqserve serves: module doc)."""

    model_config = ConfigDict(extra="forbid", json_schema_extra=standard_bounds)

    model: StrictStr = Field(description="Model name (a language-model bundle).")
    prompt: Text | PromptList | TokenIds | IdsList = Field(
        description="A prompt, a list of prompts, a prompt as token ids, or a list of them.")
    max_tokens: WholeInt = Field(16, ge=0, description="Most tokens generated per sequence "
                                 "(the server's max_new_tokens at most; 0 only with echo).")
    temperature: Number = Field(DEFAULTS.temperature, ge=0, le=2)
    top_p: Number = Field(DEFAULTS.top_p, gt=0, le=1)
    n: WholeInt = Field(DEFAULTS.n, ge=1, le=MAX_N)
    best_of: WholeInt | None = Field(None, ge=1, le=MAX_N)
    stop: StopText | StopList | None = None
    seed: WholeInt | None = Field(DEFAULTS.seed, ge=0, le=MAX_SEED)
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    logprobs: WholeInt | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    echo: StrictBool = False
    presence_penalty: Penalty = 0.0
    frequency_penalty: Penalty = 0.0
    logit_bias: dict[StrictStr, Bias] | None = Field(None, max_length=MAX_LOGIT_BIAS)
    ignore_eos: StrictBool = False
    user: StrictStr | None = Field(None, description="Accepted, unused.")
    split_special_tokens: StrictBool = Field(
        False, description="Read special-token strings in a text prompt (`<s>`, `</s>`, ...) "
        "as ordinary text; by default they are those tokens (Hugging Face's convention, as "
        "/tokenize reads them).")
    return_state: StrictBool = Field(False, description=RETURN_STATE_DOC)
    state: StateText | None = Field(None, description=STATE_DOC)

    def prompts(self) -> list[str] | list[list[int]]:
        p: Any = self.prompt
        if isinstance(p, str):
            return [p]
        if isinstance(p[0], int):
            return [list(p)]
        return list(p)

    def single(self) -> bool:
        """One prompt given (a string, or one list of ids)."""
        return isinstance(self.prompt, str) or isinstance(self.prompt[0], int)

    def sequences(self) -> int:
        """Sequences generated per prompt."""
        return self.best_of or self.n

    def scores(self) -> bool:
        """Whether the prompt is scored (echo with log-probs)."""
        return self.echo and self.logprobs is not None

    def bias(self) -> tuple[tuple[int, float], ...]:
        out = []
        for key, value in (self.logit_bias or {}).items():
            try:
                token = int(key)
            except ValueError:
                raise BadRequest(f"logit_bias: {key!r} is not a token id (an integer as a "
                                 "string)", param="logit_bias") from None
            out.append((token, float(value)))
        return tuple(out)

    def check(self) -> None:
        """What the schema cannot say: a 400 naming the field."""
        if self.max_tokens == 0 and not self.echo:
            raise BadRequest("max_tokens: 0 only with echo (score the prompt, generate "
                             "nothing); give at least 1", param="max_tokens")
        if self.best_of is not None and self.best_of < self.n:
            raise BadRequest(f"best_of {self.best_of} < n {self.n}: best_of must be at least "
                             "n", param="best_of")
        if self.best_of is not None and self.best_of > self.n and self.stream:
            raise BadRequest("best_of is not served with stream (the best sequences are known "
                             "only at the end)", param="best_of")
        # stream_options without stream: ignored (a whole answer carries its usage anyway)
        if self.state is not None and (self.echo or not self.single()):
            raise BadRequest("state continues one prompt (a string, possibly empty), without "
                             "echo", param="state")
        self.bias()

    def params(self) -> GenerateParams:
        stops = () if self.stop is None else (self.stop,) if isinstance(self.stop, str) \
            else tuple(self.stop)
        return GenerateParams(max_new_tokens=self.max_tokens,
                              temperature=float(self.temperature), top_p=float(self.top_p),
                              seed=self.seed, n=self.sequences(),
                              top_logprobs=self.logprobs or 0, stop=stops,
                              logprobs=self.logprobs is not None,
                              presence_penalty=float(self.presence_penalty),
                              frequency_penalty=float(self.frequency_penalty),
                              logit_bias=self.bias(), ignore_eos=self.ignore_eos,
                              with_eos=True, limit_name="max_tokens",
                              return_state=self.return_state)


def _validation_message(exc: ValidationError, served: tuple[str, ...] = SERVED
                        ) -> tuple[str, str | None]:
    errors = exc.errors()
    extra = [".".join(str(x) for x in e["loc"]) for e in errors if e["type"] == "extra_forbidden"]
    if extra:
        return (f"unsupported field(s): {', '.join(extra)} (seqserve serves "
                f"{', '.join(served)})", extra[0])
    if not errors:
        return "invalid request", None
    loc = ".".join(str(x) for x in errors[0]["loc"])
    if errors[0]["loc"][:1] == ("prompt",) and len(errors) > 1:  # none of its shapes
        return PROMPT_SHAPES, "prompt"
    top = str(errors[0]["loc"][0]) if errors[0]["loc"] else None
    return f"{loc}: {str(errors[0]['msg']).removeprefix('Value error, ')}", top


def _finish(reason: str | None) -> str | None:
    return None if reason is None else "length" if reason == "length" else "stop"


def _same(choice: dict[str, Any]) -> dict[str, Any]:
    return choice


@dataclass(frozen=True)
class Face:
    """How an answer is written: OpenAI's text completion (`TEXT`), or another OpenAI shape
    over the same generation (api/chat.py: chat completions)."""

    prefix: str
    """Its ids' prefix ("cmpl": "cmpl-...")."""
    whole: str
    """The `object` of a whole answer."""
    chunk: str
    """The `object` of a streamed chunk."""
    choice: Callable[[dict[str, Any]], dict[str, Any]] = _same
    """A text completion's choice in this shape (a whole answer's)."""
    delta: Callable[[dict[str, Any]], dict[str, Any]] = _same
    """A streamed chunk's choice in this shape."""
    opening: Callable[[int], dict[str, Any]] | None = None
    """Each streamed choice's first chunk (by its index), before any text, if any."""


TEXT = Face("cmpl", "text_completion", "text_completion")


def _head(name: str, face: Face = TEXT, streamed: bool = False) -> dict[str, Any]:
    return {"id": f"{face.prefix}-{uuid.uuid4().hex[:24]}",
            "object": face.chunk if streamed else face.whole,
            "created": int(time.time()), "model": name}


def _empty() -> dict[str, list[Any]]:
    return {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}


def _echoed(out: dict[str, list[Any]], worker: LMWorker, prompt: Prompt,
            scored: Scored) -> None:
    """The prompt's tokens in `out` (module doc): each one's log-prob and alternatives given
    the text before it, the first one's null."""
    skip = len(prompt.row) - len(prompt.ids)  # 1: the server's bos, never echoed
    piece = worker.piece
    starts = prompt.starts or [0] * len(prompt.ids)
    for j, token in enumerate(prompt.ids):
        out["tokens"].append(piece(token))
        out["text_offset"].append(starts[j])
        if j == 0:
            out["token_logprobs"].append(None)
            out["top_logprobs"].append(None)
            continue
        at = j - 1 + skip
        out["token_logprobs"].append(scored.logprobs[at])
        out["top_logprobs"].append({piece(i): lp for i, lp in scored.tops[at]}
                                   if scored.tops else {})


def _generated(out: dict[str, list[Any]], pieces: list[str], logprobs: list[float],
               tops: list[dict[str, float]] | None, start: int) -> int:
    """Generated tokens in `out`, their offsets from `start`; the offset after them."""
    at = start
    for p in pieces:
        out["text_offset"].append(at)
        at += len(p)
    out["tokens"] += pieces
    out["token_logprobs"] += logprobs
    out["top_logprobs"] += tops if tops is not None else [{} for _ in pieces]
    return at


def _choice(index: int, body: CompletionRequest, worker: LMWorker, prompt: Prompt,
            scored: Scored | None, seq: Seq | None) -> dict[str, Any]:
    head = prompt.text if body.echo else ""
    logprobs = None
    if body.logprobs is not None:
        logprobs = _empty()
        if scored is not None:
            _echoed(logprobs, worker, prompt, scored)
        if seq is not None:
            piece = worker.piece
            ids, lps, tops = list(seq.ids), list(seq.logprobs), list(seq.tops)
            if seq.eos is not None:  # the eos it drew: last, no text
                ids, lps, tops = [*ids, worker.eos_id], [*lps, seq.eos[0]], [*tops, seq.eos[1]]
            _generated(logprobs, [piece(i) for i in ids], lps,
                       [{piece(i): lp for i, lp in top} for top in tops], len(head))
    out = {"text": head + (seq.text if seq is not None else ""), "index": index,
           "logprobs": logprobs,
           "finish_reason": _finish(seq.finish or "length") if seq is not None else "length"}
    if seq is not None and seq.state is not None:
        out["state"] = seq.state
    return out


def _picked(body: CompletionRequest, generation: Generation | None, p: int
            ) -> list[Seq | None]:
    """Prompt p's returned sequences: its n, or the n best of its best_of (total log-prob)."""
    if generation is None:
        return [None] * body.n
    k = body.sequences()
    seqs = generation.seqs[p * k : (p + 1) * k]
    if body.best_of is not None:
        seqs = sorted(seqs, key=lambda s: -sum(s.logprobs) - (s.eos[0] if s.eos else 0.0)
                      )[: body.n]
    return list(seqs)


def _usage(prompts: list[Prompt], generation: Generation | None) -> dict[str, Any]:
    made = generation.usage()["completion_tokens"] if generation is not None else 0
    cached = generation.usage()["cached_tokens"] if generation is not None else 0
    given = sum(len(p.ids) for p in prompts)
    return {"prompt_tokens": given, "completion_tokens": made, "total_tokens": given + made,
            "prompt_tokens_details": {"cached_tokens": cached}}


def _prepare(state: AppState, name: str, body: CompletionRequest, worker: LMWorker,
             context: RequestContext, scope: str = ""
             ) -> tuple[list[Prompt], list[asyncio.Future[Any]], Generation | None]:
    """The prompts, their scoring (echo with log-probs) and the generation (max_tokens >
    0), both queued now (so that they usually share one prefill)."""
    params = dataclasses.replace(body.params(), cache_scope=scope)
    extra = state_args(state, params, body.state)
    if body.state is not None:  # one prompt after the state: the worker reads its text
        text = body.prompt if isinstance(body.prompt, str) else worker.detokenize(
            body.prompts()[0])  # type: ignore[arg-type]
        prompts = [Prompt([], [], str(text))]
        resumed: Generation = worker.start([str(text)], params, context, token_timer(state, name),
                                  **extra)
        return prompts, [], resumed
    prompts = worker.prompts(body.prompts(), starts=body.scores(), single=body.single(),
                             split_special_tokens=body.split_special_tokens)
    futures = worker.submit_scores(prompts, body.logprobs or 0, context.deadline) \
        if body.scores() else []
    try:
        generation = worker.start(prompts, params, context, token_timer(state, name),
                                  **extra) if body.max_tokens else None
    except BaseException:
        for f in futures:
            f.cancel()
        raise
    return prompts, futures, generation


async def complete(state: AppState, call: Call, body: CompletionRequest, face: Face = TEXT
                   ) -> dict[str, Any] | EventStream:
    """The completion of one body, as JSON or streamed, written as `face` says."""
    name = call.model = body.model
    body.check()
    if body.stream:
        return _streamed(state, call, body, face)

    async def work(worker: LMWorker, context: RequestContext) -> dict[str, Any]:
        prompts, futures, generation = _prepare(state, name, body, worker, context,
                                                call.scope)
        try:
            if generation is not None:
                try:
                    await generation.run()
                finally:
                    count_tokens(state, name, generation)
            scored = await worker.scored(futures, context) if futures else None
        finally:
            for f in futures:
                f.cancel()
        choices = [face.choice(_choice(p * body.n + j, body, worker, prompt,
                                       scored[p] if scored else None, seq))
                   for p, prompt in enumerate(prompts)
                   for j, seq in enumerate(_picked(body, generation, p))]
        return {**_head(name, face), "choices": choices, "usage": _usage(prompts, generation)}

    return (await answer(state, call, LMWorker, work))[1]


def _streamed(state: AppState, call: Call, body: CompletionRequest, face: Face = TEXT
              ) -> EventStream:
    """The chunks of a streamed completion: with echo first each choice's prompt (its
    log-probs once scored), then the face's opening chunks (chat: the role), then the
    generated text as it comes (with its log-probs when asked), with include_usage a last
    chunk of usage, then [DONE]. Refusals before the first chunk are statuses
    (`lifecycle.admit`, the worker's checks)."""
    name = call.model
    _, worker, timeout = admit(state, call, LMWorker)
    context = RequestContext(deadline=time.monotonic() + timeout)
    prompts, futures, generation = _prepare(state, name, body, worker, context, call.scope)
    head = _head(name, face, streamed=True)
    options = body.stream_options
    usage_too = options is not None and options.include_usage
    running = usage_too and options is not None and options.continuous_usage_stats
    extra: dict[str, Any] = {"usage": None} if usage_too else {}
    n = body.n
    at: dict[int, int] = {}  # each choice's text offset so far

    def chunk(choice: dict[str, Any], shaped: bool = False) -> bytes:
        choice = choice if shaped else face.delta(choice)
        if running:  # the usage so far on every chunk
            return sse({**head, "choices": [choice], "usage": _usage(prompts, generation)})
        return sse({**head, "choices": [choice], **extra})

    def told(ev: dict[str, Any]) -> dict[str, Any]:
        index = ev["prompt_index"] * n + ev["index"]
        logprobs = None
        if body.logprobs is not None and "tokens" in ev:
            logprobs = _empty()
            at[index] = _generated(logprobs, ev["tokens"], ev["logprobs"],
                                   ev.get("top_logprobs"), at.get(index, 0))
        out = {"text": ev.get("text", ""), "index": index, "logprobs": logprobs,
               "finish_reason": _finish(ev.get("finish_reason"))}
        if "state" in ev:
            out["state"] = ev["state"]
        return out

    async def events() -> AsyncIterator[bytes]:
        try:
            if body.echo:
                scored = await worker.scored(futures, context) if futures else None
                parts = []
                for p, prompt in enumerate(prompts):
                    for j in range(n):
                        choice = _choice(p * n + j, body, worker, prompt,
                                         scored[p] if scored else None, None)
                        at[p * n + j] = len(prompt.text)
                        if generation is not None:
                            choice["finish_reason"] = None
                        parts.append(chunk(choice))
                yield b"".join(parts)
            if face.opening is not None:
                yield b"".join(chunk(face.opening(i), shaped=True)
                               for i in range(len(prompts) * n))
            if generation is not None:
                async for batch in generation.batches():  # one write per group
                    yield b"".join(chunk(told(ev)) for ev in batch)
            if usage_too:
                yield sse({**head, "choices": [], "usage": _usage(prompts, generation)})
            yield sse("[DONE]")
        finally:
            for f in futures:
                f.cancel()
            if generation is not None:
                generation.stream.cancel()  # a no-op once it ended
                count_tokens(state, name, generation)

    return EventStream(state, call, context, events())


def refused(exc: ValidationError, served: tuple[str, ...] = SERVED) -> BadRequest:
    """A body that fails validation: OpenAI's 400, naming the field (`served`: the fields
    the route serves, named when the body has another)."""
    message, param = _validation_message(exc, served)
    return BadRequest(message, param=param)


class OpenAIError(BaseModel):
    """OpenAI's error object."""

    message: str
    type: str
    param: str | None = None
    code: str | None = None


class OpenAIErrorResponse(BaseModel):
    """Every error answer of the OpenAI-compatible routes (`core.answers`, OpenAI shape)."""

    error: OpenAIError
    request_id: str | None = Field(None, description="This request's X-Request-Id.")


def responses(what: str) -> dict[int | str, dict[str, Any]]:
    """An OpenAI route's documented answers: `what` (200), its errors in OpenAI's shape."""
    return {200: {"description": f"{what} (JSON, or server-sent events with stream: true)"},
            **{code: {"model": OpenAIErrorResponse,
                      "description": "OpenAI error: {error: {message, type, param, code}}"}
               for code in (400, 404, 413, 429, 500, 503, 504)}}


ROUTES = [Route(
    "/v1", "completions", "completions", CompletionRequest, answer=complete, by_model=False,
    reads="any", refused=refused, model_of=lambda body: body.model,
    tags=("openai",), responses=responses("OpenAI text_completion"),
    doc="OpenAI-compatible text completion with a language model (see the module doc).")]
"""POST /v1/completions (`lifecycle.Route`): its errors are OpenAI's shape (every error of
this path is: `web.responses.shape_of`)."""
