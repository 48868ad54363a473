"""`create_app(settings)`: the FastAPI app. Nothing is built at import time.

The lifespan loads the repository (verify, load, warm up) and only then reports ready; on
shutdown readiness turns false first, new work gets 503, and admitted work drains.
Routers are registered by module path (task-specific ones, such as the translator's, join
by adding their module to `ROUTERS`).
"""

from __future__ import annotations

import importlib
import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from fastapi import APIRouter, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from service.errors import ServiceError
from service.metrics import Metrics
from service.middleware import ServingMiddleware
from service.repository import ModelRepository, RuntimeFactory
from service.settings import Settings

log = logging.getLogger("seqserve.app")

ROUTERS = [
    "service.routes.health",
    "service.routes.v1",
    "service.routes.v2",
    "service.routes.translate",
    "service.routes.tag",
]
"""Modules with a `router`; a missing module (a task not installed) is skipped."""


@dataclass
class AppState:
    """What routes and middleware share (app.state.seqserve)."""

    settings: Settings
    metrics: Metrics
    repository: ModelRepository
    started: bool = False
    """Lifespan startup finished (repository loaded and warmed up)."""
    draining: bool = False
    """Shutdown began: readiness false, new work refused."""
    extras: dict[str, object] = field(default_factory=dict)
    drain_started: float | None = None
    """time.monotonic() when draining began: one drain budget covers HTTP and batchers."""

    @property
    def ready(self) -> bool:
        return self.started and not self.draining and self.repository.any_ready()

    def begin_drain(self) -> None:
        if not self.draining:
            log.info("draining: readiness false, new requests get 503")
            self.drain_started = time.monotonic()
        self.draining = True

    def drain_left(self) -> float:
        """Seconds left of `drain_timeout_s` since draining began (uvicorn's wait for open
        requests spends the same budget, so the process exits inside one drain timeout)."""
        spent = time.monotonic() - (self.drain_started or time.monotonic())
        return max(0.0, self.settings.drain_timeout_s - spent)


def create_app(settings: Settings, runtime_factory: RuntimeFactory | None = None) -> FastAPI:
    """Build the app for `settings`; `runtime_factory` replaces the real runtimes in tests."""
    metrics = Metrics()
    state = AppState(settings, metrics, ModelRepository(settings, metrics, runtime_factory))

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await state.repository.load_all()
        state.started = True
        log.info("ready: %s", "yes" if state.ready else "no model is ready")
        yield
        state.begin_drain()
        drained = await state.repository.stop_all(state.drain_left())
        log.info("stopped (%s)", "all work drained" if drained else "drain timeout passed")

    app = FastAPI(
        title="seqserve",
        version=_version(),
        description="Recurrent sequence models: classify, translate, KServe v2 inference.",
        lifespan=lifespan,
        # Our own Prometheus metrics cover requests; FastAPI's OpenTelemetry hooks (newer
        # releases) cost a third of the per-request time here. Older releases ignore this.
        telemetry={"tracing": False, "metrics": False, "logs": False, "operation_spans": False},
    )
    app.state.seqserve = state
    _add_error_handlers(app)
    for module in ROUTERS:
        router = _router(module)
        if router is not None:
            app.include_router(router)
    app.add_middleware(ServingMiddleware, state=state)
    return app


def _router(module_name: str) -> APIRouter | None:
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name != module_name:
            raise
        return None
    router: APIRouter = module.router
    return router


def _error(status: int, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status, headers=headers)


def _add_error_handlers(app: FastAPI) -> None:
    """Every error becomes `{"error": message}`; the mapping lives here and nowhere else."""

    @app.exception_handler(ServiceError)
    async def service_error(request: Request, exc: ServiceError) -> JSONResponse:
        headers = None
        if exc.retry_after is not None:
            headers = {"Retry-After": str(max(1, round(exc.retry_after)))}
        return _error(exc.status, exc.message, headers)

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        return _error(422, describe_validation(exc.errors()))

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> JSONResponse:
        detail = exc.detail if isinstance(exc.detail, str) else str(exc.detail)
        if exc.status_code == 400 and "parsing the body" in detail:
            detail = "request body is not valid JSON text (malformed or not UTF-8)"
        return _error(exc.status_code, detail, dict(exc.headers or {}))

    @app.exception_handler(Exception)
    async def bug(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        return _error(500, f"internal error ({type(exc).__name__}); this is a server bug")


def describe_validation(errors: object) -> str:
    """One line per pydantic error: `body.texts.0: Input should be a valid string`."""
    parts = []
    for e in errors if isinstance(errors, list | tuple) else []:
        loc = ".".join(str(x) for x in e.get("loc", ()))
        if e.get("type") == "json_invalid":
            parts.append(f"malformed JSON: {e.get('ctx', {}).get('error', e.get('msg'))}")
        else:
            parts.append(f"{loc}: {e.get('msg')}")
    return "; ".join(parts) or "invalid request"


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("seqserve")
    except Exception:
        return "0.0.0"
