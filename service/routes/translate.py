"""Translate API: POST /v1/models/{name}/translate (and /versions/{v}/translate).

The OIP v2 `infer` of translators goes through `TranslatorWorker.v2_infer` (service.routes.v2),
with the search options as request `parameters`.
"""

from __future__ import annotations

from typing import cast

from fastapi import APIRouter, Request

from service.engine.worker import TranslatorWorker
from service.routes.deps import app_state, call_scope
from service.schemas import ErrorResponse
from service.schemas_translate import TranslateRequest, TranslateResponse

ERRORS: dict[int | str, dict[str, object]] = {
    code: {"model": ErrorResponse} for code in (400, 404, 413, 422, 429, 500, 503, 504)
}
router = APIRouter(prefix="/v1", tags=["v1"], responses=ERRORS)


async def _translate(request: Request, name: str, version: str | None,
                     body: TranslateRequest) -> TranslateResponse:
    entry, worker = app_state(request).repository.worker(name, version, task="translator")
    translator = cast(TranslatorWorker, worker)
    async with call_scope(request) as call:
        results = await translator.translate(body.texts, body, call)
    return TranslateResponse(model=name, version=entry.version, results=results)


@router.post("/models/{name}/translate", name="translate", response_model_exclude_none=True)
async def translate(name: str, body: TranslateRequest, request: Request) -> TranslateResponse:
    """Translate texts with the default (highest ready) version: beam search or sampling,
    n-best hypotheses with scores and, on request, the attention matrix."""
    return await _translate(request, name, None, body)


@router.post("/models/{name}/versions/{version}/translate", name="translate",
             response_model_exclude_none=True)
async def translate_version(name: str, version: str, body: TranslateRequest,
                            request: Request) -> TranslateResponse:
    """Translate texts with one version."""
    return await _translate(request, name, version, body)
