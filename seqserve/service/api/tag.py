"""Tag: POST /v1/models/{name}/tag (and /versions/{v}/tag) for sequence taggers.

Each whitespace word of a text comes back with its label, that label's probability and its
character span [start, end) in the text as sent, so `text[start:end] == token`.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from pydantic import BaseModel, Field
from starlette.types import Receive, Scope

from seqserve.service.api.common import (
    ERRORS,
    TextsRequest,
    app_state,
)
from seqserve.service.api.lifecycle import answer, asgi_call
from seqserve.service.web.responses import JsonResponse
from seqserve.service.web.state import AppState
from seqserve.service.workers.tagger import TaggerWorker

router = APIRouter(prefix="/v1", tags=["v1"], responses=ERRORS)


class TagRequest(TextsRequest):
    """POST /v1/models/{name}/tag body."""


class TaggedToken(BaseModel):
    token: str = Field(description="The whitespace word, exactly text[start:end].")
    label: str | None = Field(description="Its tag (null when cut off by the token limit).")
    probability: float | None = Field(description="Probability of `label`.")
    start: int = Field(description="Character offset where the word starts.")
    end: int = Field(description="Character offset after the word.")


class Tagging(BaseModel):
    tokens: list[TaggedToken]
    num_tokens: int = Field(description="Subword pieces the model saw (after truncation).")
    truncated: bool = Field(description="True when the text was cut to the token limit.")


class TagResponse(BaseModel):
    model: str
    version: int
    results: list[Tagging]


async def tag_answer(state: AppState, scope: Scope, receive: Receive, name: str,
                    version: str | None, body: TagRequest) -> dict[str, Any]:
    """The answer (as plain data, the shape of TagResponse) to a validated body: this route's
    and the hot path's (`seqserve.service.api.hot_path`)."""
    entry, results = await answer(state, asgi_call(scope, receive, name, version),
                                  TaggerWorker, lambda w, ctx: w.tag(body.texts, ctx))
    return {"model": name, "version": entry.version, "results": results}


async def _tag(request: Request, name: str, version: str | None, body: TagRequest
               ) -> JsonResponse:
    return JsonResponse(await tag_answer(app_state(request), request.scope, request.receive,
                                              name, version, body))


@router.post("/models/{name}/tag", name="tag", response_model=TagResponse)
async def tag(name: str, body: TagRequest, request: Request) -> JsonResponse:
    """Tag every whitespace word of each text with the default (highest ready) version."""
    return await _tag(request, name, None, body)


@router.post("/models/{name}/versions/{version}/tag", name="tag", response_model=TagResponse)
async def tag_version(name: str, version: str, body: TagRequest, request: Request
                      ) -> JsonResponse:
    """Tag texts with one version."""
    return await _tag(request, name, version, body)
