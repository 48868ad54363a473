"""Model listing: GET /v1/models and /v1/models/{name} (versions, states, details).

Both are supersets of OpenAI's: the listing has `object: "list"` and `data` (OpenAI's Model
objects) beside `models`; one model has OpenAI's Model fields (`id`, `object: "model"`,
`created`: when its default version was exported, `owned_by`) beside its own, so OpenAI's
clients list and retrieve models as they do at OpenAI. Each model also has KServe V1's model
status, `ready` (its default version is ready), which KServe's SDK reads (`is_model_ready`)."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from fastapi import APIRouter, Request
from pydantic import BaseModel, Field

from seqserve.service.api.common import ERRORS, app_state
from seqserve.service.repository.entries import ModelEntry, ModelRepository

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


class OpenAIModel(BaseModel):
    """OpenAI's Model object."""

    id: str
    object: Literal["model"] = "model"
    created: int = Field(0, description="Unix seconds: when the default version (else the "
                                        "newest) was exported; 0 when unknown.")
    owned_by: str = "seqserve"


class ModelInfo(OpenAIModel):
    """One model: OpenAI's Model object (`id` is the name) and its versions."""

    name: str
    ready: bool = Field(description="KServe V1's model status: a request without a version "
                        "would be served now (the default version is ready).")
    default_version: int | None
    versions: list[ModelVersionInfo]


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


def created(repo: ModelRepository, name: str) -> int:
    """When the model's default version (else its newest) was exported, in Unix seconds
    (its manifest's `created`); 0 when unknown."""
    versions = repo.versions(name)
    default = repo.default_version(name)
    entry = versions[default] if default is not None else versions[max(versions)]
    stamp = entry.manifest.created if entry.manifest is not None else ""
    try:
        return int(datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp())
    except ValueError:
        return 0


def model_info(repo: ModelRepository, name: str) -> ModelInfo:
    default = repo.default_version(name)
    entries = repo.versions(name)
    versions = [version_info(e, default) for _, e in sorted(entries.items())]
    ready = default is not None and entries[default].worker is not None
    return ModelInfo(id=name, created=created(repo, name), name=name, ready=ready,
                     default_version=default, versions=versions)


@router.get("/models", name="v1_models")
async def list_models(request: Request) -> ModelList:
    """Every model with every version, its state (failed ones with the reason) and details."""
    repo = app_state(request).repository
    names = sorted(repo.entries)
    return ModelList(models=[model_info(repo, name) for name in names], object="list",
                     data=[OpenAIModel(id=name, created=created(repo, name))
                           for name in names])


@router.get("/models/{name}", name="v1_model")
async def get_model(name: str, request: Request) -> ModelInfo:
    """One model: versions, states, labels, limits, metrics; and OpenAI's Model fields."""
    return model_info(app_state(request).repository, name)
