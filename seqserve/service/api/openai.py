"""OpenAI-compatible completions: POST /v1/completions, for the clients users already have.

`model` is a bundle name (its default version), `prompt` a string or a list of strings; the
fields are OpenAI's (`max_tokens`, `temperature`, `top_p`, `n`, `stop`, `seed`, `stream`,
`logprobs` as an integer: that many alternatives per token); any other field is a 400 naming
it. Answers, stream chunks and errors have OpenAI's shapes (`{"error": {"message", "type",
"param", "code"}}`); the work goes through the same LM worker, limits and admission as
`/v1/models/{name}/generate`. finish_reason: "length", or "stop" (a stop string or the end
of a document: OpenAI has no "eos").
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictStr, ValidationError

from seqserve.service.api.common import (
    HARD_MAX_TEXTS,
    Text,
    WholeInt,
    standard_bounds,
)
from seqserve.service.api.generate import (
    DEFAULTS,
    HARD_MAX_NEW_TOKENS,
    MAX_N,
    MAX_TOP_LOGPROBS,
    EventStream,
    StopList,
    StopText,
    generated,
    sse,
    streamed,
)
from seqserve.service.api.lifecycle import Call, Route
from seqserve.service.api.translate import MAX_SEED, Number
from seqserve.service.core.errors import BadRequest
from seqserve.service.web.state import AppState
from seqserve.service.workers.lm import GenerateParams, Generation

PromptList = Annotated[list[Text], Field(min_length=1, max_length=HARD_MAX_TEXTS)]

class CompletionRequest(BaseModel):
    """OpenAI's completion request (the fields seqserve serves)."""

    model_config = ConfigDict(extra="forbid", json_schema_extra=standard_bounds)

    model: StrictStr = Field(description="Model name (a language-model bundle).")
    prompt: Text | PromptList = Field(description="A prompt, or a list of prompts.")
    max_tokens: WholeInt = Field(16, ge=1, le=HARD_MAX_NEW_TOKENS)
    temperature: Number = Field(DEFAULTS.temperature, ge=0, le=2)
    top_p: Number = Field(DEFAULTS.top_p, gt=0, le=1)
    n: WholeInt = Field(DEFAULTS.n, ge=1, le=MAX_N)
    stop: StopText | StopList | None = None
    seed: WholeInt | None = Field(DEFAULTS.seed, ge=0, le=MAX_SEED)
    stream: StrictBool = False
    logprobs: WholeInt | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)

    def prompts(self) -> list[str]:
        return [self.prompt] if isinstance(self.prompt, str) else list(self.prompt)

    def params(self) -> GenerateParams:
        stops = () if self.stop is None else (self.stop,) if isinstance(self.stop, str) \
            else tuple(self.stop)
        top = self.logprobs or 0
        return GenerateParams(max_new_tokens=self.max_tokens,
                              temperature=float(self.temperature), top_p=float(self.top_p),
                              seed=self.seed, n=self.n, top_logprobs=top, stop=stops,
                              logprobs=self.logprobs is not None)


def _validation_message(exc: ValidationError) -> tuple[str, str | None]:
    errors = exc.errors()
    extra = [".".join(str(x) for x in e["loc"]) for e in errors if e["type"] == "extra_forbidden"]
    if extra:
        return (f"unsupported field(s): {', '.join(extra)} (seqserve serves model, prompt, "
                "max_tokens, temperature, top_p, n, stop, seed, stream, logprobs)", extra[0])
    if not errors:
        return "invalid request", None
    loc = ".".join(str(x) for x in errors[0]["loc"])
    return f"{loc}: {str(errors[0]['msg']).removeprefix('Value error, ')}", loc or None


def _finish(reason: str | None) -> str | None:
    return None if reason is None else "length" if reason == "length" else "stop"


def _logprobs(generation: Generation, seq: int) -> dict[str, Any] | None:
    if generation.params.top_logprobs == 0 and not generation.params.logprobs:
        return None
    s = generation.seqs[seq]
    worker = generation.worker
    tokens = [worker.piece(i) for i in s.ids]
    offsets, at = [], 0
    for t in tokens:
        offsets.append(at)
        at += len(t)
    return {"tokens": tokens, "token_logprobs": list(s.logprobs),
            "top_logprobs": [{worker.piece(i): lp for i, lp in top} for top in s.tops],
            "text_offset": offsets}


def _head(name: str) -> dict[str, Any]:
    return {"id": f"cmpl-{uuid.uuid4().hex[:24]}", "object": "text_completion",
            "created": int(time.time()), "model": name}


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


def refused(exc: ValidationError) -> BadRequest:
    """A body that fails validation: OpenAI's 400, naming the field."""
    message, param = _validation_message(exc)
    return BadRequest(message, param=param)


async def complete(state: AppState, call: Call, body: CompletionRequest
                   ) -> dict[str, Any] | EventStream:
    """The completion of one body, as JSON or streamed."""
    name = call.model = body.model
    head = _head(name)
    n = body.n
    if body.stream:
        async def render(generation: Generation, _: int) -> AsyncIterator[bytes]:
            async for batch in generation.batches():  # one write per group
                yield b"".join(sse({**head, "choices": [{
                    "text": ev.get("text", ""), "index": ev["prompt_index"] * n + ev["index"],
                    "logprobs": None, "finish_reason": _finish(ev.get("finish_reason"))}]})
                    for ev in batch)
            yield sse("[DONE]")

        return streamed(state, call, body.prompts(), body.params(), render)
    _, generation = await generated(state, call, body.prompts(), body.params())
    usage = generation.usage()
    choices = [{"text": s.text, "index": i, "logprobs": _logprobs(generation, i),
                "finish_reason": _finish(s.finish or "length")}
               for i, s in enumerate(generation.seqs)]
    return {**head, "choices": choices,
            "usage": {**usage, "total_tokens": usage["prompt_tokens"]
                      + usage["completion_tokens"]}}


ROUTES = [Route(
    "/v1", "completions", "completions", CompletionRequest, answer=complete, by_model=False,
    reads="any", refused=refused,
    tags=("openai",), openapi_extra={"requestBody": {
        "required": True,
        "content": {"application/json": {"schema": CompletionRequest.model_json_schema()}}}},
    responses={200: {"description": "OpenAI text_completion (JSON, or server-sent events "
                                    "with stream: true)"},
               **{code: {"model": OpenAIErrorResponse,
                         "description": "OpenAI error: {error: {message, type, param, code}}"}
                  for code in (400, 404, 413, 429, 500, 503, 504)}},
    doc="OpenAI-compatible text completion with a language model (see the module doc).")]
"""POST /v1/completions (`lifecycle.Route`): its errors are OpenAI's shape (every error of
this path is: `web.responses.shape_of`)."""
