"""Liveness, readiness, metrics.

Every health route answers `HEAD` as it answers `GET`, without the body (status and headers,
Content-Length included: load balancers and uptime checkers probe with HEAD); the HEAD
routes are not listed in the API description.
"""

from __future__ import annotations

import gzip
from collections.abc import Callable
from typing import Any, TypeVar

from fastapi import APIRouter, Request, Response
from fastapi.responses import PlainTextResponse
from pydantic import BaseModel, Field

from seqserve.service.api.common import app_state
from seqserve.service.web.responses import JsonResponse, as_response, error_for

router = APIRouter()
Endpoint = TypeVar("Endpoint", bound=Callable[..., Any])


def _also_head(path: str, name: str) -> Callable[[Endpoint], Endpoint]:
    """Registers the decorated GET route's function for `HEAD path` too (see module doc)."""

    def register(endpoint: Endpoint) -> Endpoint:
        router.head(path, name=name, tags=["health"], include_in_schema=False)(endpoint)
        return endpoint

    return register


class Readiness(BaseModel):
    ready: bool
    error: str | None = Field(None, description="Why not (503 only).")
    request_id: str | None = Field(None, description="This request's X-Request-Id (503 only).")


READINESS: dict[int | str, dict[str, Any]] = {200: {"model": Readiness},
                                               503: {"model": Readiness}}


def _readiness(request: Request) -> Response:
    state = app_state(request)
    if state.ready:
        return JsonResponse({"ready": True})
    if state.draining:
        why = "draining"
    elif not state.started:
        why = "loading"
    elif state.peers_started is not None and not state.peers_started():
        why = "the other API processes are starting"
    else:
        pending = state.repository.not_ready()
        why = "; ".join(pending) if pending else "no model in the repository"
    return as_response(error_for(request.scope, 503, f"not ready: {why}",
                                 fields={"ready": False}))


@_also_head("/v2/health/live", "health_live")
@router.get("/v2/health/live", name="health_live", tags=["health"])
async def live() -> dict[str, bool]:
    """The process is up and answering."""
    return {"live": True}


@_also_head("/v2/health/ready", "health_ready")
@router.get("/v2/health/ready", name="health_ready", tags=["health"], responses=READINESS)
async def ready(request: Request) -> Response:
    """200 once every model's default version is loaded and warmed up (`--readiness all`:
    every version; `any`: at least one); 503 with the reason while loading, draining, or
    when a version it needs failed."""
    return _readiness(request)


@_also_head("/health", "health_ready")
@router.get("/health", name="health_ready", tags=["health"], responses=READINESS)
async def health(request: Request) -> Response:
    """/v2/health/ready at the path OpenAI-style servers (vLLM, TGI) and their clients use:
    200 when ready, else 503 with the reason."""
    return _readiness(request)


@_also_head("/health/live", "health_live")
@router.get("/health/live", name="health_live", tags=["health"])
async def live_alias() -> dict[str, bool]:
    """/v2/health/live without the protocol's prefix."""
    return {"live": True}


@_also_head("/health/ready", "health_ready")
@router.get("/health/ready", name="health_ready", tags=["health"], responses=READINESS)
async def ready_alias(request: Request) -> Response:
    """/v2/health/ready without the protocol's prefix."""
    return _readiness(request)


METRICS_RESPONSE: dict[int | str, dict[str, Any]] = {200: {
    "description": "Prometheus text exposition format.",
    "content": {"text/plain": {"schema": {"type": "string"}}},
}}


@router.get("/metrics", name="metrics", tags=["health"], response_class=PlainTextResponse,
            responses=METRICS_RESPONSE)
async def metrics(request: Request) -> Response:
    """Prometheus exposition of this app's registry (every process's samples), gzipped when
    the scraper accepts it (Prometheus does: the text is ~10x smaller)."""
    body, content_type = app_state(request).metrics.exposition()
    headers = {"vary": "Accept-Encoding"}
    if accepts_gzip(request.headers.get("accept-encoding", "")):
        body = gzip.compress(body, compresslevel=6)
        headers["content-encoding"] = "gzip"
    return Response(body, media_type=content_type, headers=headers)


def accepts_gzip(accept_encoding: str) -> bool:
    """Whether an Accept-Encoding value takes gzip (`gzip` or `*`, not at q=0)."""
    for item in accept_encoding.lower().split(","):
        coding, _, params = item.strip().partition(";")
        if coding.strip() in ("gzip", "*"):
            q = params.strip().removeprefix("q=")
            try:
                return not params.strip() or float(q) > 0
            except ValueError:
                return False
    return False
