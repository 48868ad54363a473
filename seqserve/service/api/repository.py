"""Models while serving, over HTTP: the OIP (Triton) repository, statistics and model
configuration extensions, and the same for the v1 API under /v1/admin/models.

- `POST /v2/repository/index` (body `{"ready": bool}` optional): every model version in the
  table with Triton's state (READY, UNAVAILABLE, LOADING, UNLOADING) and the reason of one
  that is not ready, and every other model folder as UNAVAILABLE ("unloaded");
- `POST /v2/repository/models/{m}/load`: 200 once every version its policy serves is ready
  in every process, else 400 with the reason (the serving version, if any, serves on);
  `.../unload`: 200 once it is out of every process's table (the model answers 404 from
  then on; what it admitted finishes). The model control's mode decides what is allowed
  (`engine.control.Controller.load` / `unload`);
- `GET /v2/models[/{m}[/versions/{v}]]/stats`: Triton's statistics, per version, summed over
  every process (`seqserve_model_inferences_total` and `..._seconds_total`);
- `GET /v2/models/{m}[/versions/{v}]/config`: Triton's model configuration, each field what
  the server does with the model (`api/oip/config.py`: dims infer takes, sequence or dynamic
  batching, decoupled streaming, instance group), with the manifest as served (no
  build-machine paths) and the effective scheduling under `seqserve`.

All behind the API key when keys are on (`web/auth.py`: every path but health and metrics).
The gRPC front's RepositoryIndex, RepositoryModelLoad / Unload, ModelStatistics and ModelConfig
(`api/grpc/repository.py`) answer with these same functions and the same control.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from fastapi import APIRouter, Request, Response
from pydantic import BaseModel, ConfigDict, Field, StrictBool

from seqserve.service.api.common import ERRORS, ErrorResponse, app_state
from seqserve.service.api.oip.config import model_config
from seqserve.service.core.errors import ShuttingDown
from seqserve.service.repository.control import ModelControl, Refused
from seqserve.service.repository.entries import ModelEntry
from seqserve.service.web.responses import JsonResponse, as_response, error_for
from seqserve.service.web.state import AppState

router = APIRouter(tags=["v2"], responses=ERRORS)
admin = APIRouter(prefix="/v1/admin", tags=["admin"], responses=ERRORS)

class IndexRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    ready: StrictBool = Field(False, description="Only the versions that are ready.")


class RepositoryModel(BaseModel):
    name: str
    version: str = Field("", description="Empty for a model folder that is not loaded.")
    state: str = Field(description="READY, UNAVAILABLE, LOADING or UNLOADING.")
    reason: str = ""


class LoadParameters(BaseModel):
    """Triton's parameters of a load or unload: `unload_dependents` (ignored: no model
    depends on another here); a configuration or files in the request (Triton's `config`,
    `file:...`) are not taken (422): publish the bundle in the repository instead."""

    model_config = ConfigDict(extra="forbid")

    unload_dependents: StrictBool = False


class LoadRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    parameters: LoadParameters = Field(default_factory=LoadParameters)


def control_of(state: AppState) -> ModelControl:
    """The model control the routes (HTTP's and gRPC's) ask (ShuttingDown until started)."""
    control = state.control
    if control is None:  # (only an app whose lifespan did not run)
        raise ShuttingDown("the model control is not started", retry_after=1)
    return control


def _control(request: Request) -> ModelControl:
    return control_of(app_state(request))


async def _change(request: Request, name: str, load: bool) -> Response:
    """A load or unload: 200 `{}` once done everywhere, else the refusal (400: the load
    failed, with the reason; 404: no such model; 409: the mode does not allow it)."""
    try:
        control = _control(request)
        await (control.load(name) if load else control.unload(name))
    except Refused as exc:
        return as_response(error_for(request.scope, exc.status, str(exc)))
    return JsonResponse({})


CHANGE: dict[int | str, dict[str, Any]] = {
    **ERRORS, 409: {"model": ErrorResponse, "description": "The model control's mode does not "
                    "allow it (--model-control)."}}


@router.post("/v2/repository/index", name="v2_repository_index")
async def repository_index(request: Request, body: IndexRequest | None = None
                           ) -> list[RepositoryModel]:
    """Every model version and its state (Triton's repository extension)."""
    rows = await _control(request).index(body is not None and body.ready)
    return [RepositoryModel(**r) for r in rows]


@router.post("/v2/repository/models/{name}/load", name="v2_repository_load",
             responses=CHANGE)
async def repository_load(name: str, request: Request, body: LoadRequest | None = None
                          ) -> Response:
    """Load the model (explicit), or scan its folder now (poll): 200 once every version its
    policy serves is ready in every process; 400 with the reason otherwise."""
    return await _change(request, name, True)


@router.post("/v2/repository/models/{name}/unload", name="v2_repository_unload",
             responses=CHANGE)
async def repository_unload(name: str, request: Request, body: LoadRequest | None = None
                            ) -> Response:
    """Unload every version of the model (explicit): it answers 404 from then on."""
    return await _change(request, name, False)


# -- statistics --------------------------------------------------------------------------

def statistics(state: AppState, entries: list[ModelEntry]) -> list[dict[str, Any]]:
    """Triton's model statistics of `entries`, summed over every process."""
    wanted = {(e.name, str(e.version)) for e in entries}
    sums: dict[tuple[str, str, str], float] = defaultdict(float)
    last: dict[tuple[str, str], float] = defaultdict(float)
    for family in state.metrics.readable().collect():
        for s in family.samples:
            key = (s.labels.get("model", ""), s.labels.get("version", ""))
            if key not in wanted:
                continue
            if s.name == "seqserve_model_inferences_total":
                sums[(*key, s.labels["outcome"] + "_count")] += s.value
            elif s.name == "seqserve_model_inference_seconds_total":
                sums[(*key, s.labels["stage"])] += s.value
            elif s.name == "seqserve_model_last_inference_timestamp_seconds":
                last[key] = max(last[key], s.value)
    out = []
    for e in entries:
        key = (e.name, str(e.version))
        ok, failed = int(sums[(*key, "success_count")]), int(sums[(*key, "fail_count")])

        def duration(count: int, stage: str, k: tuple[str, str] = key) -> dict[str, int]:
            return {"count": count, "ns": int(sums[(*k, stage)] * 1e9)}

        out.append({
            "name": e.name, "version": str(e.version),
            "last_inference": int(last[key] * 1000), "inference_count": ok,
            "execution_count": ok,
            "inference_stats": {
                "success": duration(ok, "success"), "fail": duration(failed, "fail"),
                "queue": duration(ok, "queue"), "compute_input": duration(ok, "none"),
                "compute_infer": duration(ok, "compute"),
                "compute_output": duration(ok, "none"), "cache_hit": duration(0, "none"),
                "cache_miss": duration(0, "none")},
            "batch_stats": []})
    return out


def entries(state: AppState, name: str | None, version: str | None) -> list[ModelEntry]:
    """The entries statistics are asked for: every version of every model (`name` None),
    of one model (`version` None) or one version (ModelNotFound: no such model or version)."""
    repo = state.repository
    if name is None:
        return [e for n in sorted(repo.entries) for _, e in sorted(repo.entries[n].items())]
    if version is not None:
        return [repo.entry(name, version)]
    return [e for _, e in sorted(repo.versions(name).items())]


@router.get("/v2/models/stats", name="v2_model_stats")
async def all_stats(request: Request) -> dict[str, Any]:
    """Every model version's statistics (Triton's statistics extension)."""
    state = app_state(request)
    return {"model_stats": statistics(state, entries(state, None, None))}


@router.get("/v2/models/{name}/stats", name="v2_model_stats")
async def model_stats(name: str, request: Request) -> dict[str, Any]:
    """Each version's request counts and cumulative durations, summed over every process."""
    state = app_state(request)
    return {"model_stats": statistics(state, entries(state, name, None))}


@router.get("/v2/models/{name}/versions/{version}/stats", name="v2_model_stats")
async def model_version_stats(name: str, version: str, request: Request) -> dict[str, Any]:
    state = app_state(request)
    return {"model_stats": statistics(state, entries(state, name, version))}


# -- configuration -----------------------------------------------------------------------

def config_of(state: AppState, name: str, version: str | None) -> dict[str, Any]:
    """The configuration of a ready version (the default one when `version` is None)."""
    entry, _ = state.repository.ready(name, version)
    return model_config(entry)


def _config(request: Request, name: str, version: str | None) -> dict[str, Any]:
    return config_of(app_state(request), name, version)


@router.get("/v2/models/{name}/config", name="v2_model_config")
async def config(name: str, request: Request) -> dict[str, Any]:
    """What the default version's bundle declares (Triton's model configuration)."""
    return _config(request, name, None)


@router.get("/v2/models/{name}/versions/{version}/config", name="v2_model_config")
async def version_config(name: str, version: str, request: Request) -> dict[str, Any]:
    return _config(request, name, version)


# -- the v1 face --------------------------------------------------------------------------

class AdminModels(BaseModel):
    mode: str = Field(description="The model control: none, poll or explicit.")
    models: list[RepositoryModel]


@admin.get("/models", name="admin_models")
async def admin_models(request: Request) -> AdminModels:
    """Every model version and its state, as the repository index lists them."""
    control = _control(request)
    return AdminModels(mode=control.mode,
                       models=[RepositoryModel(**r) for r in await control.index()])


@admin.post("/models/{name}/load", name="admin_model_load", responses=CHANGE)
async def admin_load(name: str, request: Request) -> Response:
    """Load the model (explicit), or scan its folder now (poll): 200 once ready in every
    process; 400 with the reason otherwise."""
    return await _change(request, name, True)


@admin.post("/models/{name}/unload", name="admin_model_unload", responses=CHANGE)
async def admin_unload(name: str, request: Request) -> Response:
    """Unload every version of the model (explicit): it answers 404 from then on."""
    return await _change(request, name, False)
