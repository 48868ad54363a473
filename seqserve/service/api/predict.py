"""Predict: POST /v1/models/{name}/predict (and /versions/{v}/predict) for feature-sequence
models (`sequence-classifier`, `sequence-tagger`).

The body is `{"series": [[[x_1, ..., x_dim] per step] per series]}` (a one-feature step is
still a list: `[[x]]`), raw values (the server applies the bundle's normalisation). Each
series comes back as `{"outputs", "steps"}`: a list of k numbers (a sequence classifier) or
one per step (a sequence tagger), de-normalised when the bundle has an `output_scale`; a
bundle with labels adds `label` and `probabilities` (per step for a tagger).
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, Field, StrictFloat
from starlette.types import Receive, Scope

from seqserve.service.api.common import (
    ERRORS,
    HARD_MAX_TEXTS,
    app_state,
    request_call,
    request_timeout,
    shed_early,
)
from seqserve.service.core.errors import ModelNotFound
from seqserve.service.web.responses import JsonResponse
from seqserve.service.web.state import AppState
from seqserve.service.workers.series import F32_MAX, SeriesWorker

router = APIRouter(prefix="/v1", tags=["v1"], responses=ERRORS)

HARD_MAX_STEPS = 1_000_000
"""Schema ceiling of steps per series (the model's step limit is the live one)."""
Value = Annotated[StrictFloat, Field(ge=-F32_MAX, le=F32_MAX, allow_inf_nan=False)]
"""One feature value: a finite JSON number within float32's range (an integer is a number)."""
Step = Annotated[list[Value], Field(min_length=1, description="One step: the model's "
                                    "`features` values (a one-feature step is [x]).")]
Series = Annotated[list[Step], Field(min_length=1, max_length=HARD_MAX_STEPS,
                                     description="One series: 1 to the model's max_steps "
                                     "steps, every step as wide as the model's features.")]


class PredictRequest(BaseModel):
    """POST /v1/models/{name}/predict body."""

    model_config = ConfigDict(extra="forbid")

    series: list[Series] = Field(min_length=1, max_length=HARD_MAX_TEXTS,
                                 description="Series, 1 to max_texts of them; raw values "
                                 "(the server normalises).")


class Prediction(BaseModel):
    outputs: list[float | None] | list[list[float | None]] = Field(
        description="k numbers (a sequence classifier) or k numbers per step (a sequence "
        "tagger); null where the model's output is not finite.")
    steps: int = Field(description="Steps of the series.")
    label: str | list[str] | None = Field(None, description="With labels: the most probable "
                                          "label (per step for a tagger).")
    probabilities: list[float] | list[list[float]] | None = Field(
        None, description="With labels: softmax over the k outputs (per step for a tagger).")


class PredictResponse(BaseModel):
    model: str
    version: int
    results: list[Prediction]


def series_worker(state: AppState, name: str, version: str | None
                  ) -> tuple[Any, SeriesWorker]:
    """The ready feature-sequence worker of `name` (404 when it is a model of another task)."""
    entry = state.repository.entry(name, version)
    if entry.task is not None and not entry.task.startswith("sequence-"):
        raise ModelNotFound(f"model {name!r} is a {entry.task}, not a feature-sequence model "
                            "(sequence-classifier or sequence-tagger)")
    entry, worker = state.repository.ready(name, version)
    if not isinstance(worker, SeriesWorker):
        raise ModelNotFound(f"model {name!r} is a {worker.task}, not a feature-sequence model")
    return entry, worker


async def predict_answer(state: AppState, scope: Scope, receive: Receive, name: str,
                         version: str | None, body: PredictRequest) -> dict[str, Any]:
    """The answer (as plain data, the shape of PredictResponse) to a validated body: this
    route's and the hot path's (`seqserve.service.api.hot_path`)."""
    entry, worker = series_worker(state, name, version)
    timeout = request_timeout(state, scope)
    shed_early(state, worker.ctx.model, timeout)
    async with request_call(state, scope, receive, timeout) as call:
        results = await worker.predict(body.series, call)
    return {"model": name, "version": entry.version, "results": results}


async def _predict(request: Request, name: str, version: str | None, body: PredictRequest
                   ) -> JsonResponse:
    return JsonResponse(await predict_answer(app_state(request), request.scope,
                                             request.receive, name, version, body))


@router.post("/models/{name}/predict", name="predict", response_model=PredictResponse)
async def predict(name: str, body: PredictRequest, request: Request) -> JsonResponse:
    """Run a feature-sequence model on series of feature vectors (default version)."""
    return await _predict(request, name, None, body)


@router.post("/models/{name}/versions/{version}/predict", name="predict",
             response_model=PredictResponse)
async def predict_version(name: str, version: str, body: PredictRequest, request: Request
                          ) -> JsonResponse:
    """Run one version of a feature-sequence model on series of feature vectors."""
    return await _predict(request, name, version, body)
