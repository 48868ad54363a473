"""Tag API: POST /v1/models/{name}/tag (and /versions/{v}/tag) for sequence taggers.

The OIP v2 `infer` of taggers goes through `TaggerWorker.v2_infer` (service.routes.v2).
"""

from __future__ import annotations

from typing import cast

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from service.routes.deps import app_state, call_scope
from service.schemas import ErrorResponse
from service.schemas_tag import TagRequest, TagResponse
from service.workers.tagger import TaggerWorker

ERRORS: dict[int | str, dict[str, object]] = {
    code: {"model": ErrorResponse} for code in (400, 404, 413, 422, 429, 500, 503, 504)
}
router = APIRouter(prefix="/v1", tags=["v1"], responses=ERRORS)


async def _tag(request: Request, name: str, version: str | None, body: TagRequest
               ) -> JSONResponse:
    entry, worker = app_state(request).repository.worker(name, version, task="tagger")
    tagger = cast(TaggerWorker, worker)
    async with call_scope(request) as call:
        results = await tagger.tag(body.texts, call)
    # The shape of TagResponse, built as plain data (no second validation pass).
    return JSONResponse({"model": name, "version": entry.version, "results": results})


@router.post("/models/{name}/tag", name="tag", response_model=TagResponse)
async def tag(name: str, body: TagRequest, request: Request) -> JSONResponse:
    """Tag every whitespace word of each text with the default (highest ready) version."""
    return await _tag(request, name, None, body)


@router.post("/models/{name}/versions/{version}/tag", name="tag", response_model=TagResponse)
async def tag_version(name: str, version: str, body: TagRequest, request: Request
                      ) -> JSONResponse:
    """Tag texts with one version."""
    return await _tag(request, name, version, body)
