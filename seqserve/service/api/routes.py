"""Every route of the API, in the order the app serves and documents them.

The inference routes are `lifecycle.Route`s, each declared once beside its schemas: the HTTP
front dispatches them by this table (`api/hot_path.py`, never FastAPI's routing: it cost
~40% of an API process) and the OpenAPI document is built from it (`server/openapi.py`).
The other routes (health, listing, OIP metadata and readiness, admin) are FastAPI's own,
its `APIRouter`s here.
"""

from __future__ import annotations

from fastapi import APIRouter

from seqserve.service.api import (
    admin,
    chat,
    classify,
    generate,
    health,
    kserve,
    models,
    openai,
    predict,
    repository,
    tag,
    tokenize,
    translate,
)
from seqserve.service.api.lifecycle import Route
from seqserve.service.api.oip import generate as oip_generate
from seqserve.service.api.oip import routes as oip

FRONTS: tuple[APIRouter | Route, ...] = (
    health.router, models.router, *classify.ROUTES, *translate.ROUTES, *tag.ROUTES,
    *predict.ROUTES, *kserve.ROUTES, *generate.ROUTES, *openai.ROUTES, *chat.ROUTES,
    tokenize.router,
    repository.router, oip.router, *oip.ROUTES, *oip_generate.ROUTES, admin.router,
    repository.admin)
"""The API's routes in order (the OpenAPI document lists its paths in this order)."""
TABLE: tuple[Route, ...] = tuple(r for r in FRONTS if isinstance(r, Route))
"""The inference routes."""
ROUTERS: tuple[APIRouter, ...] = tuple(r for r in FRONTS if isinstance(r, APIRouter))
"""FastAPI's routers (everything else)."""
