"""Classify: POST /v1/models/{name}/classify (and /versions/{v}/classify)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from pydantic import BaseModel, Field, StrictBool
from starlette.types import Receive, Scope

from seqserve.service.api.common import (
    ERRORS,
    TextsRequest,
    WholeInt,
    app_state,
)
from seqserve.service.api.lifecycle import answer, asgi_call
from seqserve.service.web.responses import JsonResponse
from seqserve.service.web.state import AppState
from seqserve.service.workers.classifier import ClassifierWorker

router = APIRouter(prefix="/v1", tags=["v1"], responses=ERRORS)


class ClassifyRequest(TextsRequest):
    """POST /v1/models/{name}/classify body."""

    top_k: WholeInt = Field(1, ge=1, le=1000,
                            description="How many labels to return per text (at most all).")
    return_attention: StrictBool = Field(
        False, description="Return each token's attention weight with its text span."
    )


class LabelProbability(BaseModel):
    label: str
    probability: float


class TokenAttention(BaseModel):
    token: str = Field(description="The tokenizer's piece.")
    weight: float = Field(description="Attention pooling weight (sums to 1 over the text).")
    start: int = Field(description="Character offset in the text where the piece starts.")
    end: int = Field(description="Character offset after the piece.")


class Classification(BaseModel):
    label: str
    score: float = Field(description="Probability of `label`.")
    top_k: list[LabelProbability]
    num_tokens: int = Field(description="Tokens the model saw (after truncation).")
    truncated: bool = Field(description="True when the text was cut to the token limit.")
    attention: list[TokenAttention] | None = None


class ClassifyResponse(BaseModel):
    model: str
    version: int
    results: list[Classification]


async def classify_answer(state: AppState, scope: Scope, receive: Receive, name: str,
                         version: str | None, body: ClassifyRequest) -> dict[str, Any]:
    """The answer (as plain data, the shape of ClassifyResponse) to a validated body: this route's
    and the hot path's (`seqserve.service.api.hot_path`)."""
    entry, results = await answer(state, asgi_call(scope, receive, name, version),
                                  ClassifierWorker, lambda w, ctx: w.classify(
                                      body.texts, body.top_k, body.return_attention, ctx))
    return {"model": name, "version": entry.version, "results": results}


async def _classify(request: Request, name: str, version: str | None, body: ClassifyRequest
                    ) -> JsonResponse:
    return JsonResponse(await classify_answer(app_state(request), request.scope, request.receive,
                                                   name, version, body))


@router.post("/models/{name}/classify", name="classify", response_model=ClassifyResponse)
async def classify(name: str, body: ClassifyRequest, request: Request) -> JsonResponse:
    """Classify texts with the default (highest ready) version."""
    return await _classify(request, name, None, body)


@router.post("/models/{name}/versions/{version}/classify", name="classify",
             response_model=ClassifyResponse)
async def classify_version(name: str, version: str, body: ClassifyRequest,
                           request: Request) -> JsonResponse:
    """Classify texts with one version."""
    return await _classify(request, name, version, body)
