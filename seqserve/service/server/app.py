"""`create_app(settings)`: the FastAPI app. Nothing is built at import time.

The lifespan loads the repository (verify, load, warm up) and only then reports ready; on
shutdown readiness turns false first (work is still served for the shutdown delay), and
admitted work drains. The API's
routes are `seqserve.service.api.routes`: its inference routes answered by the hot path
(`api/hot_path.py`) from their one table, FastAPI's routers for the rest. Every exception a
FastAPI route raises becomes the one error answer (`seqserve.service.web.responses.error_for`) here;
every success body is encoded by the one encoder (`JsonResponse`, the default response class).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from seqserve.service.api import routes
from seqserve.service.api.common import describe_errors
from seqserve.service.api.hot_path import HotPath
from seqserve.service.core.answers import Answer, bug_message
from seqserve.service.core.errors import ServiceError
from seqserve.service.core.metrics import Metrics
from seqserve.service.core.process import SUPERVISOR_ENV, freeze_heap
from seqserve.service.engine.client import EngineClient
from seqserve.service.engine.loading import RuntimeFactory
from seqserve.service.server.composition import Composition
from seqserve.service.server.openapi import install as install_openapi
from seqserve.service.web.auth import Keys
from seqserve.service.web.middleware import HttpLifecycle
from seqserve.service.web.responses import (
    JsonResponse,
    as_response,
    error_for,
    not_found,
    service_error_for,
)
from seqserve.service.web.settings import Settings
from seqserve.service.web.state import AppState

log = logging.getLogger("seqserve.app")


def create_app(settings: Settings, runtime_factory: RuntimeFactory | None = None,
               engine: EngineClient | None = None, freeze: bool = False) -> FastAPI:
    """Build the app for `settings`. Its models run in this process, or, given an `engine`
    client, in the engine process. `runtime_factory` replaces the real runtimes in tests.
    `freeze`: the app is its process's server (`seqserve serve`, an API process): once loaded,
    its start-up heap leaves the garbage collector's reach (`core.process.freeze_heap`)."""
    metrics = Metrics()
    composition = Composition(settings, metrics, runtime_factory, engine)
    state = AppState(composition.settings, metrics, composition.repository)

    lifecycle: HttpLifecycle | None = None

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        metrics.watch_process("api" if os.environ.get(SUPERVISOR_ENV) else "server")
        await composition.start()
        await composition.start_control()
        state.control = composition.control
        if freeze:
            log.debug("start-up heap frozen: %d objects", freeze_heap())
        state.started = True
        pending = "; ".join(state.repository.not_ready()) or "no model"
        serving = state.repository.serving(state.settings.readiness)  # (its peers aside)
        log.info("ready: %s", "yes" if serving else f"no ({pending})")
        yield
        state.begin_drain()
        drained = await composition.stop(state.drain_left())
        metrics.stop_watching()
        spans = lifecycle.spans if lifecycle is not None else None
        if spans is not None:  # the last spans exported
            await asyncio.to_thread(spans.shutdown)
        log.info("stopped (%s)", "all work drained" if drained else "drain timeout passed")

    app = SeqserveApp(
        title="seqserve",
        version=_version(),
        description="Recurrent sequence models: classify, translate, KServe v2 inference.",
        lifespan=lifespan,
        default_response_class=JsonResponse,
        # Our own Prometheus metrics cover requests; FastAPI's OpenTelemetry hooks (newer
        # releases) cost a third of the per-request time here. Older releases ignore this.
        telemetry={"tracing": False, "metrics": False, "logs": False, "operation_spans": False},
    )
    app.state.seqserve = state
    _add_error_handlers(app)
    for router in routes.ROUTERS:
        app.include_router(router)
    # the table's routes and FastAPI's, the live limits and one infer operation per model
    install_openapi(app, state, routes.FRONTS)
    # the one request lifecycle (request id, access log, CORS, the head's decision, API
    # keys, body, timing, metrics), then the hot path or FastAPI's own stack
    inner = HotPath(state, routes.TABLE, functools.partial(FastAPI.__call__, app))
    app.entry = lifecycle = HttpLifecycle(inner, state, Keys.of(settings))
    return app


class SeqserveApp(FastAPI):
    """The FastAPI app behind our own middleware chain (`entry`), which sits outside
    FastAPI's stack so that the inference routes are answered by the hot path
    (`seqserve.service.api.hot_path`) without FastAPI's per-request machinery."""

    entry: HttpLifecycle

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.entry(scope, receive, send)

    def answer_head(self, scope: Scope) -> Answer | None:
        """The chain's answer from a request's head alone (`web/http_protocol.py`: a refusal
        written without running the app), or None."""
        return self.entry.answer_head(scope)


def _add_error_handlers(app: FastAPI) -> None:
    """Every exception of FastAPI's stack becomes the one error answer."""

    @app.exception_handler(ServiceError)
    async def service_error(request: Request, exc: ServiceError) -> Response:
        return as_response(service_error_for(request.scope, exc))

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError) -> Response:
        return as_response(error_for(request.scope, 422, describe_errors(exc.errors())))

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> Response:
        detail = exc.detail if isinstance(exc.detail, str) else str(exc.detail)
        if exc.status_code == 400 and "parsing the body" in detail:
            detail = "request body is not valid JSON text (malformed or not UTF-8)"
        extra = [(k.lower().encode("latin-1"), v.encode("latin-1"))
                 for k, v in (exc.headers or {}).items()]
        if exc.status_code == 404 and detail == "Not Found":  # no route has this path
            return as_response(not_found(request.scope, detail))
        return as_response(error_for(request.scope, exc.status_code, detail, headers=extra))

    @app.exception_handler(Exception)
    async def bug(request: Request, exc: Exception) -> Response:
        # Logged once, with the request's id, by web.access_log (not here); the body carries
        # that id (`request_id`).
        return as_response(error_for(request.scope, 500, bug_message(exc)))


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("seqserve")
    except Exception:
        return "0.0.0"
