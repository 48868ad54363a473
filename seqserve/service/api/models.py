"""Model listing: GET /v1/models and /v1/models/{name} (versions, states, details)."""

from __future__ import annotations

from typing import Any, Literal

from fastapi import APIRouter, Request
from pydantic import BaseModel, Field

from seqserve.service.api.common import ERRORS, app_state
from seqserve.service.web.repository import ModelEntry, ModelRepository

router = APIRouter(prefix="/v1", tags=["v1"], responses={404: ERRORS[404]})


class ModelVersionInfo(BaseModel):
    version: int
    state: Literal["loading", "ready", "failed", "stopped"]
    reason: str | None = None
    task: str | None = None
    default: bool = False
    details: dict[str, Any] = Field(
        default_factory=dict, description="labels, limits, runtime, providers, metrics; "
        "runs_in: where the model runs, the engine process or each API process (`api`)"
    )


class ModelInfo(BaseModel):
    name: str
    default_version: int | None
    versions: list[ModelVersionInfo]


class OpenAIModel(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int = 0
    owned_by: str = "seqserve"


class ModelList(BaseModel):
    models: list[ModelInfo]
    object: Literal["list"] = Field("list", description="OpenAI's list shape, beside `models`.")
    data: list[OpenAIModel] = Field(default_factory=list,
                                    description="OpenAI's model objects: one per model name.")


def version_info(entry: ModelEntry, default: int | None) -> ModelVersionInfo:
    details = entry.worker.describe() if entry.worker is not None else {}
    if entry.runs_in is not None:
        details = {**details, "runs_in": entry.runs_in}
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
    names = sorted(repo.entries)
    return ModelList(models=[model_info(repo, name) for name in names], object="list",
                     data=[OpenAIModel(id=name) for name in names])


@router.get("/models/{name}", name="v1_model")
async def get_model(name: str, request: Request) -> ModelInfo:
    """One model: versions, states, labels, limits, metrics."""
    return model_info(app_state(request).repository, name)
