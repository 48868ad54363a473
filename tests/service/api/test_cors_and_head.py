"""CORS (`--cors-origins`) and HEAD on the health routes, against a real server: preflights
answered without an API key and before the content-type check, the CORS headers on every
answer to an allowed origin (401, 415 included), none to another origin or with CORS off."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from server_support import serve_app
from service_fakes import settings

from seqserve.cli import build_parser
from seqserve.cli.serve import settings_from_args
from seqserve.models.errors import UserError
from seqserve.service.server.app import create_app

KEY = "cors-test-key"
PAGE = "http://localhost:3000"
PREDICT = "/v1/models/tiny-series/predict"
BODY = {"series": [[[10.0, -2.0, 0.5], [11.0, -2.1, 0.7]]]}
HEALTH = ["/v2/health/live", "/v2/health/ready", "/health", "/health/live", "/health/ready"]


def _preflight(client: httpx.Client, origin: str, method: str = "POST",
               headers: str = "authorization, content-type") -> httpx.Response:
    return client.options(PREDICT, headers={"origin": origin,
                                            "access-control-request-method": method,
                                            "access-control-request-headers": headers})


def test_cors_with_api_keys(tiny_series_repo: Path) -> None:
    app = create_app(settings(tiny_series_repo, api_key=KEY,
                              cors_origins=f"{PAGE}/, https://app.example.com"))
    with serve_app(app) as url, httpx.Client(base_url=url, timeout=30) as client:
        pre = _preflight(client, PAGE)  # no key: a browser never sends one with a preflight
        assert pre.status_code == 204, pre.text
        assert pre.headers["access-control-allow-origin"] == PAGE
        assert "POST" in pre.headers["access-control-allow-methods"]
        allowed = pre.headers["access-control-allow-headers"].split(", ")
        assert "authorization" in allowed and "content-type" in allowed
        assert int(pre.headers["access-control-max-age"]) > 0
        assert "Origin" in pre.headers["vary"] and pre.content == b""

        other = _preflight(client, "http://evil.example")
        assert other.status_code == 403
        assert "http://evil.example" in other.json()["error"]
        assert "access-control-allow-origin" not in other.headers
        header = _preflight(client, PAGE, headers="content-type, x-custom")
        assert header.status_code == 403 and "x-custom" in header.json()["error"]
        method = _preflight(client, PAGE, method="DELETE")
        assert method.status_code == 403 and "DELETE" in method.json()["error"]

        auth = {"authorization": f"Bearer {KEY}", "origin": PAGE}
        ok = client.post(PREDICT, json=BODY, headers=auth)
        assert ok.status_code == 200, ok.text
        assert ok.headers["access-control-allow-origin"] == PAGE
        exposed = ok.headers["access-control-expose-headers"]
        assert "x-request-id" in exposed and "retry-after" in exposed
        assert ok.headers["x-request-id"]

        # the page can read why it was refused: 401 without the key, 415 for a form's type
        nokey = client.post(PREDICT, json=BODY, headers={"origin": PAGE})
        assert nokey.status_code == 401
        assert nokey.headers["access-control-allow-origin"] == PAGE
        form = client.post(PREDICT, content=b"a=b", headers={
            **auth, "content-type": "application/x-www-form-urlencoded"})
        assert form.status_code == 415
        assert form.headers["access-control-allow-origin"] == PAGE

        foreign = client.post(PREDICT, json=BODY, headers={**auth, "origin": "http://x.test"})
        assert foreign.status_code == 200  # served; the browser hides it from that page
        assert "access-control-allow-origin" not in foreign.headers
        assert "Origin" in foreign.headers["vary"]
        # an OPTIONS that is no preflight is no CORS business: the key and routes as ever
        assert client.options(PREDICT, headers={"origin": PAGE}).status_code == 401


def test_cors_any_origin_and_off(tiny_series_repo: Path) -> None:
    with serve_app(create_app(settings(tiny_series_repo, cors_origins="*"))) as url:
        pre = httpx.options(f"{url}{PREDICT}", headers={
            "origin": "https://anywhere.test", "access-control-request-method": "POST",
            "access-control-request-headers": "Content-Type"})
        assert pre.status_code == 204
        assert pre.headers["access-control-allow-origin"] == "*"
        got = httpx.post(f"{url}{PREDICT}", json=BODY, headers={"origin": "https://a.test"})
        assert got.status_code == 200 and got.headers["access-control-allow-origin"] == "*"
        assert "vary" not in got.headers
    with serve_app(create_app(settings(tiny_series_repo))) as url:
        pre = httpx.options(f"{url}{PREDICT}", headers={
            "origin": PAGE, "access-control-request-method": "POST"})
        assert pre.status_code == 405  # off by default: no preflight answered
        got = httpx.post(f"{url}{PREDICT}", json=BODY, headers={"origin": PAGE})
        assert got.status_code == 200
        assert not any(h.startswith("access-control-") for h in got.headers)


def test_cors_allows_trace_context_the_openai_sdk_and_configured_headers(
        tiny_series_repo: Path) -> None:
    """A browser page sending W3C trace context and the OpenAI JavaScript SDK's headers is
    allowed by default; `--cors-headers` adds names and prefixes, `--cors-expose-headers`
    answer headers the page may read (traceparent among the defaults)."""
    app = create_app(settings(tiny_series_repo, cors_origins=PAGE,
                              cors_headers="x-app-*,X-Tenant",
                              cors_expose_headers="x-model-version"))
    with serve_app(app) as url, httpx.Client(base_url=url, timeout=30) as client:
        sdk = _preflight(client, PAGE, headers="content-type, traceparent, tracestate, "
                         "x-stainless-os, x-stainless-lang, x-stainless-retry-count")
        assert sdk.status_code == 204, sdk.text
        allowed = sdk.headers["access-control-allow-headers"].split(", ")
        assert {"traceparent", "tracestate", "x-stainless-os", "x-stainless-lang",
                "x-stainless-retry-count"} <= set(allowed), allowed
        assert not any(name.endswith("*") for name in allowed)  # browsers read no patterns
        configured = _preflight(client, PAGE, headers="x-app-user, x-tenant")
        assert configured.status_code == 204, configured.text
        assert {"x-app-user", "x-tenant"} <= set(
            configured.headers["access-control-allow-headers"].split(", "))
        assert _preflight(client, PAGE, headers="x-other").status_code == 403
        got = client.post(PREDICT, json=BODY, headers={"origin": PAGE})
        exposed = got.headers["access-control-expose-headers"].split(", ")
        assert {"traceparent", "x-request-id", "x-model-version"} <= set(exposed), exposed
    with pytest.raises(ValueError, match="is not a header name"):
        settings(tiny_series_repo, cors_origins=PAGE, cors_headers="bad header")


def test_cors_origins_flag() -> None:
    args = build_parser().parse_args(["serve", "--repo", ".", "--cors-origins",
                                      "https://a.test,http://localhost:8080/"])
    assert settings_from_args(args).cors_origins == ["https://a.test", "http://localhost:8080"]
    bad = build_parser().parse_args(["serve", "--repo", ".", "--cors-origins",
                                     "https://a.test/app"])
    with pytest.raises(UserError, match="'https://a.test/app' is not an origin"):
        settings_from_args(bad)


def test_head_on_health_routes(tiny_series_repo: Path) -> None:
    app = create_app(settings(tiny_series_repo, api_key=KEY))
    with serve_app(app) as url, httpx.Client(base_url=url, timeout=30) as client:
        for path in HEALTH:
            get, head = client.get(path), client.head(path)
            assert head.status_code == get.status_code == 200, path
            assert head.content == b"", path
            assert head.headers["content-type"] == get.headers["content-type"]
            assert head.headers["content-length"] == str(len(get.content)), path
        # a HEAD never gets a route's body, not even an error's
        assert client.head("/v1/models").status_code == 401
        doc = client.get("/openapi.json").json()
        assert all("head" not in ops for ops in doc["paths"].values())
    app = create_app(settings(tiny_series_repo, api_key=KEY, auth_health=True))
    with serve_app(app) as url:
        assert httpx.head(f"{url}/health").status_code == 401
        assert httpx.head(f"{url}/health", headers={"authorization": f"Bearer {KEY}"}
                          ).status_code == 200
