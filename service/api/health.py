"""Liveness, readiness, metrics."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse

from service.api.common import app_state

router = APIRouter()


def _readiness(request: Request) -> JSONResponse:
    state = app_state(request)
    if state.ready:
        return JSONResponse({"ready": True})
    if state.draining:
        why = "draining"
    elif not state.started:
        why = "loading"
    else:
        pending = state.repository.not_ready()
        why = "; ".join(pending) if pending else "no model in the repository"
    return JSONResponse({"ready": False, "error": f"not ready: {why}"}, status_code=503)


@router.get("/v2/health/live", name="health_live", tags=["health"])
async def live() -> dict[str, bool]:
    """The process is up and answering."""
    return {"live": True}


@router.get("/v2/health/ready", name="health_ready", tags=["health"])
async def ready(request: Request) -> JSONResponse:
    """200 once every model version is loaded and warmed up (`--readiness any`: at least one);
    503 with the reason while loading, draining, or when a version failed."""
    return _readiness(request)


@router.get("/health/live", name="health_live", tags=["health"], include_in_schema=False)
async def live_alias() -> dict[str, bool]:
    return {"live": True}


@router.get("/health/ready", name="health_ready", tags=["health"], include_in_schema=False)
async def ready_alias(request: Request) -> JSONResponse:
    return _readiness(request)


@router.get("/metrics", name="metrics", tags=["health"])
async def metrics(request: Request) -> Response:
    """Prometheus exposition of this app's registry."""
    body, content_type = app_state(request).metrics.exposition()
    return Response(body, media_type=content_type)
