"""The inference routes are one table (`api/routes.py`): the hot path dispatches them, FastAPI
holds none of them (its routing cost is what the hot path avoids), and the OpenAPI document
lists each of them (default and pinned version) from that same table."""

from __future__ import annotations

from pathlib import Path

from fastapi.routing import APIRoute

from seqserve.service.api.routes import TABLE
from seqserve.service.server.app import create_app
from seqserve.service.server.openapi import documented
from seqserve.service.web.settings import Settings


def test_fastapi_holds_no_inference_route(tmp_path: Path) -> None:
    app = create_app(Settings(repo=tmp_path, warmup=False))
    routes = [r for route in app.routes
              for r in getattr(getattr(route, "original_router", None), "routes", [route])]
    paths = {r.path for r in routes if isinstance(r, APIRoute)}
    table = {route.path(pinned) for route in TABLE for pinned in (False, True)}
    assert table and not paths & table
    assert {"/v2/health/ready", "/v1/models", "/v2/models/{name}/ready"} <= paths


def test_the_document_lists_each_table_route_once_per_version() -> None:
    operations = [(r.path, r.name) for r in documented(TABLE) if isinstance(r, APIRoute)]
    expected = [(route.path(pinned), route.name) for route in TABLE if route.documented
                for pinned in ((False, True) if route.by_model else (False,))]
    assert operations == expected
    assert ("/v1/completions", "completions") in operations
    assert not any(name == "v2_infer" for _, name in operations)  # documented per model


def test_the_hot_path_matches_every_table_route(tmp_path: Path) -> None:
    from seqserve.service.api.hot_path import HotPath

    app = create_app(Settings(repo=tmp_path, warmup=False))
    hot = HotPath(app.state.seqserve, TABLE, app.router)
    for route in TABLE:
        for pinned in (False, True) if route.by_model else (False,):
            path = route.path(pinned).replace("{name}", "m").replace("{version}", "3")
            found = hot.match(path)
            assert found is not None and found[0] is route, path
            assert found[3] == route.path(pinned)
            if route.by_model:
                assert found[1:3] == ("m", "3" if pinned else None)
    for other in ("/v1/models/m", "/v1/models/m/versions/3", "/v2/models/m/ready",
                  "/v1/models/m/infer", "/v2/models/m/classify", "/v1/completions/x"):
        assert hot.match(other) is None, other
