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

from pydantic import BaseModel, ConfigDict, Field, StrictStr

from seqserve.service.api import generate as v1
from seqserve.service.api.common import (
    ERRORS,
    TEXT_RULES,
    Text,
    WholeInt,
    standard_bounds,
)
from seqserve.service.api.lifecycle import Call, Route
from seqserve.service.api.translate import MAX_SEED, Number
from seqserve.service.web.state import AppState
from seqserve.service.workers.lm import GenerateParams, Generation


class GenerateParameters(BaseModel):
    """Sampling parameters of a generate request (Triton's names)."""

    model_config = ConfigDict(extra="forbid", json_schema_extra=standard_bounds)

    max_tokens: WholeInt = Field(v1.DEFAULTS.max_new_tokens, ge=1, le=v1.HARD_MAX_NEW_TOKENS,
                                 description="Most tokens generated (also bounded by the "
                                             "server's max_new_tokens).")
    temperature: Number = Field(v1.DEFAULTS.temperature, ge=0, le=100, description="0 = greedy.")
    top_k: WholeInt = Field(v1.DEFAULTS.top_k, ge=0, le=100_000, description="0 = off.")
    top_p: Number = Field(v1.DEFAULTS.top_p, gt=0, le=1, description="1 = off.")
    seed: WholeInt | None = Field(v1.DEFAULTS.seed, ge=0, le=MAX_SEED,
                                  description="Sampling seed (null = random).")
    stop: v1.StopList | v1.StopText | None = Field(
        None, description=f"Up to {v1.MAX_STOPS} strings; the text ends before the first one.")
    stream: Literal[False] | None = Field(
        None, description="Absent or false (generate_stream streams).")

    def params(self) -> GenerateParams:
        p = self
        stops = () if p.stop is None else (p.stop,) if isinstance(p.stop, str) \
            else tuple(p.stop)
        return GenerateParams(max_new_tokens=p.max_tokens, temperature=float(p.temperature),
                              top_k=p.top_k, top_p=float(p.top_p), seed=p.seed, stop=stops,
                              limit_name="max_tokens")


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


async def generate_answer(state: AppState, call: Call, body: V2GenerateRequest
                          ) -> dict[str, Any]:
    """generate: the whole `text_output`."""
    v, generation = await v1.generated(state, call, [body.text_input], body.parameters.params())
    result = generation.results()[0]
    return {**_head(call.model, v, body), "text_output": result["text"],
            "finish_reason": result["finish_reason"], "usage": generation.usage()}


async def stream_answer(state: AppState, call: Call, body: V2GenerateStreamRequest
                        ) -> v1.EventStream:
    """generate_stream: its events (module doc)."""
    async def render(generation: Generation, v: int) -> AsyncIterator[bytes]:
        head = _head(call.model, v, body)
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

    return v1.streamed(state, call, [body.text_input], body.parameters.params(), render)


STREAM_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {"description": "Server-sent events: `data: {\"model_name\", \"model_version\", "
                         "\"text_output\"}` per token, a last one with `finish_reason` and "
                         "`usage`",
          "content": {"text/event-stream": {"schema": v1.SSE_EVENT}}}}

ROUTES = [
    Route("/v2", "generate", "v2_generate", V2GenerateRequest, answer=generate_answer,
          reads="fastapi", response_model=V2GenerateResponse,
          doc="Triton's generate extension: one prompt (`text_input`) and sampling "
              "`parameters`\n(max_tokens, temperature, top_k, top_p, seed, stop), answered "
              "with the whole\n`text_output`, with the default version.",
          version_doc="Triton's generate extension with one version."),
    Route("/v2", "generate_stream", "v2_generate_stream", V2GenerateStreamRequest,
          answer=stream_answer, reads="fastapi", events=True,
          responses={**ERRORS, **STREAM_RESPONSES},
          doc="Triton's generate extension, streamed as server-sent events: one "
              "`text_output` piece\nper token as soon as it exists, then a last event with "
              "the `finish_reason`.",
          version_doc="generate_stream with one version."),
]
"""POST /v2/models/{name}[/versions/{v}]/generate and /generate_stream (`lifecycle.Route`)."""
