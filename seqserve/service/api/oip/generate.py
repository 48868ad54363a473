"""The Open Inference Protocol's generate extension, as Triton defines it, for language models.

`POST /v2/models/{name}[/versions/{v}]/generate`: `{"id"?, "text_input": "...",
"parameters"?: {...}}` -> `{"id"?, "model_name", "model_version", "text_output",
"finish_reason", "usage"}`. `.../generate_stream`: the same request, answered as server-sent
events, one `data: {"id"?, "model_name", "model_version", "text_output"}` per token as soon as
it exists and a last one with an empty `text_output` and the `finish_reason`; a failure after
the 200 is an `event: error` whose data is the usual `{"error": "..."}`, then the stream ends.

Parameters (every one optional; any other is refused, named): `max_tokens` (the v1
`max_new_tokens`), `temperature`, `top_k`, `top_p`, `seed`, `stop` (a string or a list), and
`stream` (false, or absent, for generate; true, or absent, for generate_stream, as Triton's
clients send it). Both
routes run through the same LM worker, limits, admission and metrics as `/v1/.../generate`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any, Literal

from fastapi import APIRouter, Request
from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict, Field, StrictStr

from seqserve.service.api import generate as v1
from seqserve.service.api.common import (
    ERRORS,
    TEXT_RULES,
    Text,
    WholeInt,
    app_state,
    standard_bounds,
)
from seqserve.service.api.generate import (
    DEFAULTS,
    HARD_MAX_NEW_TOKENS,
    MAX_STOPS,
    StopList,
    StopText,
)
from seqserve.service.api.lifecycle import asgi_call
from seqserve.service.api.translate import MAX_SEED, Number
from seqserve.service.web.responses import JsonResponse
from seqserve.service.workers.lm import GenerateParams, Generation

router = APIRouter(prefix="/v2", tags=["v2"], responses=ERRORS)


class GenerateParameters(BaseModel):
    """Sampling parameters of a generate request (Triton's names)."""

    model_config = ConfigDict(extra="forbid", json_schema_extra=standard_bounds)

    max_tokens: WholeInt = Field(DEFAULTS.max_new_tokens, ge=1, le=HARD_MAX_NEW_TOKENS,
                                 description="Most tokens generated (also bounded by the "
                                             "server's max_new_tokens).")
    temperature: Number = Field(DEFAULTS.temperature, ge=0, le=100, description="0 = greedy.")
    top_k: WholeInt = Field(DEFAULTS.top_k, ge=0, le=100_000, description="0 = off.")
    top_p: Number = Field(DEFAULTS.top_p, gt=0, le=1, description="1 = off.")
    seed: WholeInt | None = Field(DEFAULTS.seed, ge=0, le=MAX_SEED,
                                  description="Sampling seed (null = random).")
    stop: StopList | StopText | None = Field(
        None, description=f"Up to {MAX_STOPS} strings; the text ends before the first one.")
    stream: Literal[False] | None = Field(
        None, description="Absent or false (generate_stream streams).")

    def params(self) -> GenerateParams:
        p = self
        stops = () if p.stop is None else (p.stop,) if isinstance(p.stop, str) \
            else tuple(p.stop)
        return GenerateParams(max_new_tokens=p.max_tokens, temperature=float(p.temperature),
                              top_k=p.top_k, top_p=float(p.top_p), seed=p.seed, stop=stops)


class StreamParameters(GenerateParameters):
    """generate_stream's parameters: `stream` absent or true (Triton's clients send it)."""

    stream: Literal[True] | None = Field(  # type: ignore[assignment]
        None, description="Absent or true (generate answers in one piece).")


class V2GenerateRequest(BaseModel):
    """Body of generate."""

    model_config = ConfigDict(extra="forbid")

    id: StrictStr | None = Field(None, description="Echoed in the answer.")
    text_input: Text = Field(description=f"The prompt. {TEXT_RULES}")
    parameters: GenerateParameters = Field(
        default_factory=lambda: GenerateParameters.model_validate({}))


class V2GenerateStreamRequest(V2GenerateRequest):
    """Body of generate_stream."""

    parameters: StreamParameters = Field(  # type: ignore[assignment]
        default_factory=lambda: StreamParameters.model_validate({}))


class V2GenerateResponse(BaseModel):
    id: str | None = None
    model_name: str
    model_version: str
    text_output: str
    finish_reason: str = Field(description="length | stop | eos")
    usage: dict[str, int] = Field(description="prompt_tokens, completion_tokens")


def _head(name: str, version: int, body: V2GenerateRequest) -> dict[str, Any]:
    head: dict[str, Any] = {"model_name": name, "model_version": str(version)}
    if body.id is not None:
        head["id"] = body.id
    return head


async def _generate(request: Request, name: str, version: str | None,
                    body: V2GenerateRequest) -> JsonResponse:
    state = app_state(request)
    v, generation = await v1.generated(state, asgi_call(request.scope, request.receive, name,
                                                     version),
                                    [body.text_input], body.parameters.params())
    result = generation.results()[0]
    return JsonResponse({**_head(name, v, body), "text_output": result["text"],
                         "finish_reason": result["finish_reason"],
                         "usage": generation.usage()})


async def _generate_stream(request: Request, name: str, version: str | None,
                           body: V2GenerateStreamRequest) -> Response:
    state = app_state(request)

    async def render(generation: Generation, v: int) -> AsyncIterator[bytes]:
        head = _head(name, v, body)
        finish = "length"
        async for batch in generation.batches():  # one write per group
            chunk = b"".join(v1.sse({**head, "text_output": ev["text"]})
                             for ev in batch if "text" in ev)
            for ev in batch:
                finish = ev.get("finish_reason", finish)
            if chunk:
                yield chunk
        yield v1.sse({**head, "text_output": "", "finish_reason": finish,
                   "usage": generation.usage()})

    return v1.streamed(state, asgi_call(request.scope, request.receive, name, version),
                    [body.text_input], body.parameters.params(), render)


STREAM_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {"description": "Server-sent events: `data: {\"model_name\", \"model_version\", "
                         "\"text_output\"}` per token, a last one with `finish_reason` and "
                         "`usage`",
          "content": {"text/event-stream": {"schema": {"type": "string"}}}}}


@router.post("/models/{name}/generate", name="v2_generate",
             response_model=V2GenerateResponse)
async def generate(name: str, body: V2GenerateRequest, request: Request) -> JsonResponse:
    """Triton's generate extension: one prompt (`text_input`) and sampling `parameters`
    (max_tokens, temperature, top_k, top_p, seed, stop), answered with the whole
    `text_output`, with the default version."""
    return await _generate(request, name, None, body)


@router.post("/models/{name}/versions/{version}/generate", name="v2_generate",
             response_model=V2GenerateResponse)
async def generate_version(name: str, version: str, body: V2GenerateRequest,
                           request: Request) -> JsonResponse:
    """Triton's generate extension with one version."""
    return await _generate(request, name, version, body)


@router.post("/models/{name}/generate_stream", name="v2_generate_stream",
             response_class=Response, responses=STREAM_RESPONSES)
async def generate_stream(name: str, body: V2GenerateStreamRequest,
                          request: Request) -> Response:
    """Triton's generate extension, streamed as server-sent events: one `text_output` piece
    per token as soon as it exists, then a last event with the `finish_reason`."""
    return await _generate_stream(request, name, None, body)


@router.post("/models/{name}/versions/{version}/generate_stream", name="v2_generate_stream",
             response_class=Response, responses=STREAM_RESPONSES)
async def generate_stream_version(name: str, version: str, body: V2GenerateStreamRequest,
                                  request: Request) -> Response:
    """generate_stream with one version."""
    return await _generate_stream(request, name, version, body)
