"""API keys against a real server: 401 + WWW-Authenticate without a valid bearer key on model
and inference routes, health and metrics open unless asked, key files, keys never shown."""

from __future__ import annotations

import logging
from pathlib import Path

import httpx
import pytest
from server_support import serve_app
from service_fakes import settings

from seqserve.cli import build_parser
from seqserve.cli.serve import settings_from_args
from seqserve.service.server.app import create_app
from seqserve.service.web.auth import ApiKeyError, key_matches, load_keys

KEY = "k3y-0f-the-first-kind"
OTHER = "second-key-from-the-file"
PROTECTED = [("GET", "/v1/models"), ("GET", "/v1/models/tiny-clf"), ("GET", "/v2"),
             ("GET", "/v2/models/tiny-clf"), ("GET", "/v2/models/tiny-clf/ready"),
             ("POST", "/v1/models/tiny-clf/classify"), ("POST", "/v2/models/tiny-clf/infer"),
             ("POST", "/v1/models/no-such-model/classify")]
HEALTH = ["/v2/health/live", "/v2/health/ready", "/health/ready"]
BODIES = {"/v1/models/tiny-clf/classify": {"texts": ["one two"]},
          "/v1/models/no-such-model/classify": {"texts": ["one two"]},
          "/v2/models/tiny-clf/infer": {"inputs": [{"name": "text", "datatype": "BYTES",
                                                    "shape": [1], "data": ["one two"]}]}}


def _call(client: httpx.Client, method: str, path: str, key: str | None) -> httpx.Response:
    headers = {"authorization": key if key.startswith("Basic") else f"Bearer {key}"} \
        if key is not None else {}
    return client.request(method, path, json=BODIES.get(path), headers=headers)


def test_keys_guard_model_and_inference_routes(tiny_repo: Path,
                                               caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    app = create_app(settings(tiny_repo, api_key=KEY))
    with serve_app(app) as url, httpx.Client(base_url=url, timeout=30) as client:
        for method, path in PROTECTED:
            for key in (None, "wrong", KEY[:-1], f"Basic {KEY}"):
                r = _call(client, method, path, key)
                assert r.status_code == 401, (path, key, r.text)
                assert r.headers["www-authenticate"].startswith("Bearer")
                assert "key" in r.json()["error"]
            wrong = _call(client, method, path, "wrong")
            assert 'error="invalid_token"' in wrong.headers["www-authenticate"]
            ok = _call(client, method, path, KEY)
            assert ok.status_code == (404 if "no-such" in path else 200), (path, ok.text)
            assert client.request(method, path, json=BODIES.get(path),
                                  headers={"authorization": f"bearer  {KEY}"}).status_code \
                == ok.status_code  # the scheme is case-insensitive
        for path in [*HEALTH, "/metrics", "/openapi.json"]:
            assert client.get(path).status_code == 200, path
    assert KEY not in caplog.text and KEY not in repr(app.state.seqserve.settings)


def test_health_and_metrics_can_require_the_key(tiny_repo: Path, tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    keys.write_text(f"# two keys\n{KEY}\n\n  {OTHER}  \n")
    app = create_app(settings(tiny_repo, api_key=f"@{keys}", auth_health=True,
                              auth_metrics=True))
    with serve_app(app) as url, httpx.Client(base_url=url, timeout=30) as client:
        for path in [*HEALTH, "/metrics"]:
            assert client.get(path).status_code == 401, path
            for key in (KEY, OTHER):
                r = client.get(path, headers={"authorization": f"Bearer {key}"})
                assert r.status_code == 200, (path, key)
        assert _call(client, "GET", "/v1/models", "# two keys").status_code == 401
        assert client.get("/docs").status_code == 200  # /docs must load /openapi.json


def test_without_a_key_the_api_description_names_no_model(tiny_repo: Path,
                                                         tmp_path: Path) -> None:
    """/openapi.json stays open (so /docs loads), but before it listed every served model and
    version to anyone; now without a valid key it is the generic document."""
    keys = tmp_path / "keys"
    keys.write_text(f"{KEY}\n")
    app = create_app(settings(tiny_repo, api_key_file=keys))
    with serve_app(app) as url, httpx.Client(base_url=url, timeout=30) as client:
        for key in (None, "wrong"):
            r = _call(client, "GET", "/openapi.json", key)
            assert r.status_code == 200
            assert "tiny-clf" not in r.text and "tiny-mt" not in r.text, key
            assert "/v1/models/{name}/classify" in r.json()["paths"]
        full = _call(client, "GET", "/openapi.json", KEY)
        assert "/v1/models/tiny-clf/classify" in full.json()["paths"]
        assert _call(client, "POST", "/v1/models/tiny-clf/classify", KEY).status_code == 200
        assert _call(client, "POST", "/v1/models/tiny-clf/classify", None).status_code == 401


def test_the_key_file_setting(tmp_path: Path) -> None:
    from pydantic import SecretStr, ValidationError

    from seqserve.service.web.settings import Settings

    keys = tmp_path / "keys"
    keys.write_text(f"# rotation\n{KEY}\n{OTHER}\n")
    s = settings_from_args(build_parser().parse_args(["serve", "--api-key-file", str(keys)]))
    assert s.keys_on and s.api_key is None
    digests = load_keys(s.api_key, s.api_key_file)
    assert key_matches(KEY.encode(), digests) and key_matches(OTHER.encode(), digests)
    with pytest.raises(ValidationError, match="not both"):
        Settings(api_key=SecretStr(KEY), api_key_file=keys)
    with pytest.raises(ApiKeyError):
        load_keys(None, tmp_path / "missing")


def test_key_files_and_comparison(tmp_path: Path) -> None:
    from pydantic import SecretStr

    empty = tmp_path / "empty"
    empty.write_text("# nothing\n\n")
    for bad in (SecretStr(""), SecretStr("  "), SecretStr(f"@{empty}"),
                SecretStr(f"@{tmp_path / 'missing'}")):
        with pytest.raises(ApiKeyError):
            load_keys(bad)
    digests = load_keys(SecretStr(KEY))
    assert key_matches(KEY.encode(), digests) and not key_matches(b"k3y", digests)
    digests = load_keys(SecretStr(f"{KEY}\n{OTHER}\n"))  # a Secret's value, several keys
    assert key_matches(KEY.encode(), digests) and key_matches(OTHER.encode(), digests)


def test_the_flag_shows_no_secret(capsys: pytest.CaptureFixture[str],
                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SEQSERVE_API_KEY", KEY)
    s = settings_from_args(build_parser().parse_args(["serve"]))
    assert s.api_key is not None and s.api_key.get_secret_value() == KEY
    assert KEY not in repr(s) and KEY not in str(s.model_dump())
    s = settings_from_args(build_parser().parse_args(["serve", "--api-key", OTHER]))
    assert s.api_key.get_secret_value() == OTHER and OTHER not in repr(s)
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "--api-key" in out and "SEQSERVE_API_KEY" in out and KEY not in out
