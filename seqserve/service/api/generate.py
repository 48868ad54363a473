"""Language models: POST /v1/models/{name}/generate and /score (and /versions/{v}/...).

generate: `{"prompt": "..."}` or `{"prompts": [...]}` with the sampling options below. The
answer is JSON, or with `"stream": true` a `text/event-stream`: one `data: {"prompt_index",
"index", "text"}` per token as soon as it exists (with `logprobs`, also the `tokens` and
`logprobs` of the tokens it carries), one `data: {"prompt_index", "index",
"finish_reason"}` per finished sequence, `data: {"usage": ...}`, then `data: [DONE]`. The 200
goes out with the first events, so a refusal (429 by expected wait, 503) is a status with
Retry-After; a failure after the 200 is an `event: error` whose data is the usual error JSON;
the stream then ends. A client that hangs up has its sequences dropped at the engine's next step.

score: `{"texts": [...]}` -> per text its tokens, their log-probabilities (each given the
text before it), the number of tokens and the perplexity, from one batched prefill.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from typing import Annotated, Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictStr,
    StringConstraints,
    model_validator,
)
from starlette.types import Receive, Scope, Send

from seqserve.service.api.common import (
    ERRORS,
    HARD_MAX_TEXTS,
    TEXT_RULES,
    Text,
    TextsRequest,
    WholeInt,
    standard_bounds,
)
from seqserve.service.api.lifecycle import (
    Call,
    RequestCall,
    Route,
    admit,
    answer,
)
from seqserve.service.api.translate import MAX_SEED, Number
from seqserve.service.core.answers import encode_json
from seqserve.service.core.errors import ServiceError
from seqserve.service.core.state_token import MAX_TOKEN_CHARS
from seqserve.service.scheduling.generation import GenerateOptions
from seqserve.service.web.responses import send_answer, service_error_for
from seqserve.service.web.state import AppState
from seqserve.service.workers.base import RequestContext
from seqserve.service.workers.lm import GenerateParams, Generation, LMWorker

HARD_MAX_NEW_TOKENS = 4096
"""Schema ceiling of max_new_tokens (settings.max_new_tokens is the live limit)."""
MAX_N = 16
MAX_STOPS = 4
MAX_TOP_LOGPROBS = 5
StopText = Annotated[StrictStr, StringConstraints(min_length=1, max_length=64)]
StopList = Annotated[list[StopText], Field(max_length=MAX_STOPS)]
RETURN_STATE_DOC = ("Return each sequence's recurrent state as a signed token (needs the "
                    "server's --state-secret-file): any replica with the same bundle "
                    "continues it.")
STATE_DOC = ("A state token (from return_state): continue that sequence with the one prompt "
             "(possibly empty: generation goes on) fed after it; n must be 1.")
StateText = Annotated[StrictStr, StringConstraints(min_length=1, max_length=MAX_TOKEN_CHARS)]
DEFAULTS = GenerateOptions()
"""The language-model request defaults (scheduling.generation.GenerateOptions, the one table
of them): the v1, OIP and OpenAI schemas take theirs from it."""


class SamplingOptions(BaseModel):
    """How tokens are drawn (shared by generate and the OpenAI-compatible completions)."""

    model_config = ConfigDict(extra="forbid", json_schema_extra=standard_bounds)

    temperature: Number = Field(DEFAULTS.temperature, ge=0, le=100,
                                description="Softmax temperature; 0 = greedy (argmax).")
    top_k: WholeInt = Field(DEFAULTS.top_k, ge=0, le=100_000,
                            description="Sample among the k most likely tokens; 0 = off.")
    top_p: Number = Field(DEFAULTS.top_p, gt=0, le=1, description="Nucleus mass; 1 = off.")
    seed: WholeInt | None = Field(DEFAULTS.seed, ge=0, le=MAX_SEED,
                                  description="Sampling seed: the same request with the same "
                                              "seed gives the same text; null = random.")
    n: WholeInt = Field(DEFAULTS.n, ge=1, le=MAX_N, description="Sequences per prompt.")


def _one_of_prompts(schema: dict[str, Any]) -> None:
    standard_bounds(schema)
    schema["anyOf"] = [
        {"required": ["prompt"], "properties": {"prompt": {"type": "string"},
                                                "prompts": {"type": "null"}}},
        {"required": ["prompts"], "properties": {"prompts": {"type": "array"},
                                                 "prompt": {"type": "null"}}}]


class GenerateRequest(SamplingOptions):
    """POST /v1/models/{name}/generate body: exactly one of `prompt` and `prompts`."""

    model_config = ConfigDict(extra="forbid", json_schema_extra=_one_of_prompts)

    prompt: Text | None = Field(None, description=f"One prompt. {TEXT_RULES}")
    prompts: list[Text] | None = Field(None, min_length=1, max_length=HARD_MAX_TEXTS,
                                       description="Several prompts (1 to max_texts).")
    max_new_tokens: WholeInt = Field(DEFAULTS.max_new_tokens, ge=1, le=HARD_MAX_NEW_TOKENS,
                                     description="Most tokens generated per sequence (also "
                                                 "bounded by the server's max_new_tokens).")
    stop: StopList | StopText | None = Field(
        None, description=f"Up to {MAX_STOPS} strings of 1 to 64 characters; a sequence ends "
                          "before the first one it produces (finish_reason stop).")
    logprobs: StrictBool = Field(False, description="Return each token and its log-prob.")
    stream: StrictBool = Field(False, description="Answer as server-sent events.")
    return_state: StrictBool = Field(False, description=RETURN_STATE_DOC)
    state: StateText | None = Field(None, description=STATE_DOC)

    @model_validator(mode="after")
    def _one_input(self) -> GenerateRequest:
        if (self.prompt is None) == (self.prompts is None):
            raise ValueError("give exactly one of prompt and prompts")
        return self

    def texts(self) -> list[str]:
        return [self.prompt] if self.prompt is not None else list(self.prompts or [])

    def stops(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)

    def params(self, top_logprobs: int = 0, scope: str = "") -> GenerateParams:
        return GenerateParams(max_new_tokens=self.max_new_tokens,
                              temperature=float(self.temperature), top_k=self.top_k,
                              top_p=float(self.top_p), seed=self.seed, n=self.n,
                              top_logprobs=top_logprobs, stop=self.stops(),
                              logprobs=self.logprobs or top_logprobs > 0,
                              return_state=self.return_state, cache_scope=scope)


class GeneratedText(BaseModel):
    prompt_index: int
    index: int = Field(description="Sample index within its prompt (0 to n-1).")
    text: str
    finish_reason: str = Field(description="length | stop | eos")
    tokens: list[str] | None = Field(None, description="With logprobs: generated tokens.")
    logprobs: list[float] | None = Field(None, description="With logprobs: their log-probs.")
    state: str | None = Field(None, description="With return_state: the sequence's state "
                                                "token (continue it with `state`).")


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = Field(0, description="Prompt tokens a cached prefix state saved.")


class GenerateResponse(BaseModel):
    model: str
    version: int
    results: list[GeneratedText]
    usage: Usage


class ScoreRequest(TextsRequest):
    """POST /v1/models/{name}/score body."""

    return_state: StrictBool = Field(False, description=RETURN_STATE_DOC)
    state: StateText | None = Field(None, description="A state token: the one text is "
                                                      "scored after that sequence.")


class ScoredText(BaseModel):
    tokens: list[str]
    logprobs: list[float] = Field(description="log P(token | bos and the tokens before it).")
    num_tokens: int
    perplexity: float = Field(description="exp(-mean log-prob) over the text's tokens.")
    truncated: bool = False
    state: str | None = Field(None, description="With return_state: the state token after "
                                                "the text.")


class ScoreResponse(BaseModel):
    model: str
    version: int
    results: list[ScoredText]


SSE_EVENT: dict[str, Any] = {
    "type": "object", "required": ["data"],
    "description": "One server-sent event (an `event: error` carries the error JSON).",
    "properties": {"event": {"type": "string"}, "data": {"type": "string"},
                   "id": {"type": "string"}, "retry": {"type": "integer"}}}
"""The schema of each event of a `text/event-stream` answer: in OpenAPI 3.1 a stream's
`schema` describes one event, as its fields (`event`, `data`, ...)."""
SSE_DOC: dict[int | str, dict[str, Any]] = {200: {
    "description": "JSON, or with `stream: true` server-sent events",
    "content": {"text/event-stream": {"schema": SSE_EVENT}}}}


def token_timer(state: AppState, name: str) -> Callable[[float, bool], None]:
    """Records time to first token and inter-token latency of one request."""
    ttft = state.metrics.time_to_first_token.labels(name)
    itl = state.metrics.inter_token_latency.labels(name)

    def observe(seconds: float, first: bool) -> None:
        (ttft if first else itl).observe(seconds)

    return observe


def count_tokens(state: AppState, name: str, generation: Generation) -> None:
    state.metrics.generated_tokens.labels(name).inc(generation.usage()["completion_tokens"])


def state_args(state: AppState, params: GenerateParams, token: str | None
               ) -> dict[str, Any]:
    """The worker's state arguments of a request (`LMWorker.start`): the signer when states
    are asked, the decoded token to continue (a 400 when it does not verify or the server
    has no secret)."""
    codec = state.states
    out: dict[str, Any] = {}
    if params.return_state:
        codec.require("return_state")
        out["issue"] = codec.encode
    if token is not None:
        out["resume"] = codec.decode(token)
    return out


async def generated(state: AppState, call: Call, texts: list[str], params: GenerateParams,
                    token: str | None = None) -> tuple[int, Generation]:
    """A generation answered whole (JSON): the one lifecycle (`lifecycle.answer`) around
    running it to its end; its version and the finished generation."""
    extra = state_args(state, params, token)

    async def work(worker: LMWorker, context: RequestContext) -> Generation:
        generation = worker.start(texts, params, context, token_timer(state, call.model),
                                  **extra)
        try:
            await generation.run()
        finally:
            count_tokens(state, call.model, generation)
        return generation

    entry, generation = await answer(state, call, LMWorker, work)
    return entry.version, generation


def streamed(state: AppState, call: Call, texts: list[str], params: GenerateParams,
             render: Callable[[Generation, int], AsyncIterator[bytes]],
             token: str | None = None) -> EventStream:
    """A streamed generation: the lookup, deadline and shedding of the one lifecycle now (a
    refusal is a status), the generation started; `render(generation, version)` makes its
    events, which the returned `EventStream` sends inside the request's one `RequestCall`."""
    extra = state_args(state, params, token)
    entry, worker, timeout = admit(state, call, LMWorker)
    context = RequestContext(deadline=time.monotonic() + timeout)
    generation = worker.start(texts, params, context, token_timer(state, call.model),
                              **extra)

    async def events() -> AsyncIterator[bytes]:
        try:
            async for chunk in render(generation, entry.version):
                yield chunk
        finally:
            count_tokens(state, call.model, generation)

    return EventStream(state, call, context, events())


def sse(data: Any, event: str | None = None) -> bytes:
    head = f"event: {event}\n" if event else ""
    text = data if isinstance(data, str) else encode_json(data).decode()
    return f"{head}data: {text}\n\n".encode()


class EventStream:
    """A `text/event-stream` answer (ASGI) fed by an async iterator of ready event bytes; the
    request's context (`context`: its deadline) lives as long as the stream, inside the one
    `RequestCall` of the lifecycle: counted in flight, and the generation stops as soon as
    the client hangs up."""

    HEADERS = [(b"cache-control", b"no-cache"), (b"x-accel-buffering", b"no"),
               (b"content-type", b"text/event-stream; charset=utf-8")]

    def __init__(self, state: AppState, call: Call, context: RequestContext,
                 events: AsyncIterator[bytes]) -> None:
        self.state, self.call, self.context, self.events = state, call, context, events
        self.scope: Scope = {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        self.scope = scope
        async with RequestCall(self.state, self.call, context=self.context) as context:
            gone = context.gone
            assert gone is not None
            # The 200 waits for the first events (or the failure): a refusal by the engine
            # (429 by expected wait, 503 engine gone) is then a status, not an error event.
            first = asyncio.ensure_future(anext(self.events, b""))
            done, _ = await asyncio.wait({first, gone}, return_when=asyncio.FIRST_COMPLETED)
            if first not in done:  # gone before anything: cancel it
                await self._hang_up(first)
                return
            try:
                head = first.result()
            except ServiceError as exc:
                await send_answer(send, service_error_for(scope, exc))
                return
            await send({"type": "http.response.start", "status": 200,
                        "headers": self.HEADERS})
            producer = asyncio.ensure_future(self._produce(send, head, self.events))
            done, _ = await asyncio.wait({producer, gone},
                                         return_when=asyncio.FIRST_COMPLETED)
            if producer not in done:  # the client left: the generation's finally cancels it
                await self._hang_up(producer)
                return
            producer.result()
        with contextlib.suppress(OSError):
            await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def _hang_up(self, task: asyncio.Future[Any]) -> None:
        self.context.disconnected.set()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task

    async def _produce(self, send: Send, head: bytes, events: AsyncIterator[bytes]) -> None:
        try:
            if head:
                await send({"type": "http.response.body", "body": head, "more_body": True})
            async for chunk in events:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
        except ServiceError as exc:  # after the 200: the usual error JSON as an error event
            _, _, body = service_error_for(self.scope, exc)
            await send({"type": "http.response.body", "body": sse(body.decode(), "error"),
                        "more_body": True})


async def generate_answer(state: AppState, call: Call, body: GenerateRequest
                          ) -> dict[str, Any] | EventStream:
    """The JSON answer, or with `stream` the events (module doc)."""
    params = body.params(scope=call.scope)
    if not body.stream:
        v, generation = await generated(state, call, body.texts(), params, body.state)
        return {"model": call.model, "version": v, "results": generation.results(),
                "usage": generation.usage()}

    async def render(generation: Generation, _: int) -> AsyncIterator[bytes]:
        async for batch in generation.batches():  # events that exist together: one write
            yield b"".join(sse(ev) for ev in batch)
        yield sse({"usage": generation.usage()}) + sse("[DONE]")

    return streamed(state, call, body.texts(), params, render, body.state)


async def score_answer(state: AppState, call: Call, body: ScoreRequest) -> dict[str, Any]:
    """Scores; with `state` one text continuing a state token, with `return_state` each
    text's state token."""
    codec = state.states
    if body.return_state:
        codec.require("return_state")
    resume = codec.decode(body.state) if body.state is not None else None

    async def work(worker: LMWorker, context: RequestContext) -> list[dict[str, Any]]:
        return await worker.score(body.texts, context, codec.encode, resume, body.return_state)

    entry, results = await answer(state, call, LMWorker, work)
    return {"model": call.model, "version": entry.version, "results": results}


ROUTES = [
    Route("/v1", "generate", "generate", GenerateRequest, answer=generate_answer,
          reads="fastapi", response_model=GenerateResponse, responses={**ERRORS, **SSE_DOC},
          doc="Generate text from prompts with the default version: sampling (temperature, "
              "top-k,\ntop-p, seed) or greedy, n samples per prompt, stop strings, optional "
              "log-probs, as JSON\nor streamed as server-sent events.",
          version_doc="Generate text with one version."),
    Route("/v1", "score", "score", ScoreRequest, answer=score_answer, reads="fastapi",
          response_model=ScoreResponse,
          doc="Score texts with the default version: each token's log-probability given the "
              "text\nbefore it, and each text's perplexity (one batched prefill, no decoding).",
          version_doc="Score texts with one version."),
]
"""POST /v1/models/{name}[/versions/{v}]/generate and /score (`lifecycle.Route`)."""
