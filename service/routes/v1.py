"""Native API: model listing and classification."""

from __future__ import annotations

from typing import cast

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from service.repository import ModelEntry, ModelRepository
from service.routes.deps import app_state, call_scope
from service.schemas import (
    ClassifyRequest,
    ClassifyResponse,
    ErrorResponse,
    ModelInfo,
    ModelList,
    ModelVersionInfo,
)
from service.workers.classifier import ClassifierWorker

ERRORS: dict[int | str, dict[str, object]] = {
    code: {"model": ErrorResponse} for code in (400, 404, 413, 422, 429, 500, 503, 504)
}
router = APIRouter(prefix="/v1", tags=["v1"], responses=ERRORS)


def version_info(entry: ModelEntry, default: int | None) -> ModelVersionInfo:
    details = entry.worker.describe() if entry.worker is not None else {}
    return ModelVersionInfo(
        version=entry.version, state=entry.state, reason=entry.reason,  # type: ignore[arg-type]
        task=entry.task, default=entry.version == default, details=details,
    )


def model_info(repo: ModelRepository, name: str) -> ModelInfo:
    default = repo.default_version(name)
    versions = [version_info(e, default) for _, e in sorted(repo.versions(name).items())]
    return ModelInfo(name=name, default_version=default, versions=versions)


@router.get("/models", name="v1_models")
async def list_models(request: Request) -> ModelList:
    """Every model with every version, its state (failed ones with the reason) and details."""
    repo = app_state(request).repository
    return ModelList(models=[model_info(repo, name) for name in sorted(repo.entries)])


@router.get("/models/{name}", name="v1_model")
async def get_model(name: str, request: Request) -> ModelInfo:
    """One model: versions, states, labels, limits, metrics."""
    return model_info(app_state(request).repository, name)


async def _classify(
    request: Request, name: str, version: str | None, body: ClassifyRequest
) -> JSONResponse:
    entry, worker = app_state(request).repository.worker(name, version, task="classifier")
    classifier = cast(ClassifierWorker, worker)
    async with call_scope(request) as call:
        results = await classifier.classify(body.texts, body.top_k, body.return_attention, call)
    # The shape of ClassifyResponse, built as plain data (no second validation pass).
    return JSONResponse({"model": name, "version": entry.version, "results": results})


@router.post("/models/{name}/classify", name="classify", response_model=ClassifyResponse)
async def classify(name: str, body: ClassifyRequest, request: Request) -> JSONResponse:
    """Classify texts with the default (highest ready) version."""
    return await _classify(request, name, None, body)


@router.post(
    "/models/{name}/versions/{version}/classify", name="classify",
    response_model=ClassifyResponse,
)
async def classify_version(
    name: str, version: str, body: ClassifyRequest, request: Request
) -> JSONResponse:
    """Classify texts with one version."""
    return await _classify(request, name, version, body)
