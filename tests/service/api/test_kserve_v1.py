"""KServe V1 against a real server: `POST /v1/models/{m}:predict` (default and pinned
version) for a model of every task family, its predictions exactly the model's v1 route's
results; a language model's 400 naming what to use; refusals in the `{"error": ...}` shape;
`ready` in GET /v1/models/{m} and the listing as the model's state (a bundle that fails to
load: false); the route in the OpenAPI document; and the KServe SDK's own V1 REST client
(`is_model_ready`, `infer`) in its environment (`.client-venvs/kserve`, as
test_kserve_sdk.py)."""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from client_venvs import client_python
from service_fakes import serve_in_thread, settings
from test_kserve_sdk import VENV_NAME

from seqserve.service.server.app import create_app

TEXTS = ["one two three", "cent"]
STEP = [10.0, -2.0, 0.5]
BROKEN = "broken-clf"
"""A classifier bundle whose graph is not a graph: it fails to load (never ready)."""


@pytest.fixture(scope="module")
def url(tiny_full_repo: Path, tiny_lm_repo: Path, tiny_series_repo: Path,
        tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    repo = tmp_path_factory.mktemp("kserve-v1") / "repo"
    shutil.copytree(tiny_full_repo, repo)
    shutil.copytree(tiny_lm_repo / "tiny-lm", repo / "tiny-lm")
    shutil.copytree(tiny_series_repo / "tiny-series", repo / "tiny-series")
    shutil.copytree(tiny_full_repo / "tiny-clf", repo / BROKEN)
    for graph in (repo / BROKEN / "1").glob("*.onnx"):
        graph.write_bytes(b"not a graph")
    with serve_in_thread(create_app(settings(repo))) as base:
        yield base


@pytest.mark.parametrize(("model", "verb"), [("tiny-clf", "classify"), ("tiny-tag", "tag"),
                                             ("tiny-mt", "translate")])
def test_text_predictions_are_the_v1_routes_results(url: str, model: str, verb: str) -> None:
    ours = httpx.post(f"{url}/v1/models/{model}/{verb}", json={"texts": TEXTS}, timeout=60)
    assert ours.status_code == 200, ours.text
    expected = {"predictions": ours.json()["results"]}
    for path, instances in ((f"{model}:predict", TEXTS),
                            (f"{model}:predict", [{"text": t} for t in TEXTS]),
                            (f"{model}/versions/1:predict", TEXTS)):
        got = httpx.post(f"{url}/v1/models/{path}", json={"instances": instances}, timeout=60)
        assert got.status_code == 200, (path, got.text)
        assert got.json() == expected, path


def test_series_predictions_are_the_predict_routes_results(url: str) -> None:
    series = [[STEP, STEP], [STEP]]
    ours = httpx.post(f"{url}/v1/models/tiny-series/predict", json={"series": series},
                      timeout=60)
    assert ours.status_code == 200, ours.text
    got = httpx.post(f"{url}/v1/models/tiny-series:predict", json={"instances": series},
                     timeout=60)
    assert got.status_code == 200, got.text
    assert got.json() == {"predictions": ours.json()["results"]}


def test_refusals_say_why_in_the_v1_error_shape(url: str) -> None:
    lm = httpx.post(f"{url}/v1/models/tiny-lm:predict", json={"instances": ["one"]})
    assert lm.status_code == 400
    assert "/v1/completions" in lm.json()["error"] and "tiny-lm/generate" in lm.json()["error"]
    bad = httpx.post(f"{url}/v1/models/tiny-clf:predict", json={"instances": ["one", 5]})
    assert bad.status_code == 422 and "instances.1" in bad.json()["error"], bad.text
    steps = httpx.post(f"{url}/v1/models/tiny-series:predict", json={"instances": ["one"]})
    assert steps.status_code == 422 and "instances.0" in steps.json()["error"], steps.text
    missing = httpx.post(f"{url}/v1/models/no-such-model:predict", json={"instances": ["a"]})
    assert missing.status_code == 404 and isinstance(missing.json()["error"], str)
    not_ready = httpx.post(f"{url}/v1/models/{BROKEN}:predict", json={"instances": ["a"]})
    assert not_ready.status_code == 503 and not_ready.json()["error"]
    assert httpx.get(f"{url}/v1/models/tiny-clf:predict").status_code == 405


def test_model_status_has_ready_and_keeps_its_fields(url: str) -> None:
    one = httpx.get(f"{url}/v1/models/tiny-clf").json()
    assert one["ready"] is True
    assert {"id", "object", "created", "owned_by", "name", "default_version",
            "versions"} <= set(one)
    broken = httpx.get(f"{url}/v1/models/{BROKEN}").json()
    assert broken["ready"] is False and broken["versions"][0]["state"] == "failed"
    listing = httpx.get(f"{url}/v1/models").json()
    assert {m["name"]: m["ready"] for m in listing["models"]}[BROKEN] is False
    assert all(m["ready"] for m in listing["models"] if m["name"] != BROKEN)
    assert listing["object"] == "list" and listing["data"]


def test_the_route_is_in_the_openapi_document_per_model(url: str) -> None:
    paths = httpx.get(f"{url}/openapi.json").json()["paths"]

    def instance(path: str) -> dict[str, object]:
        body = paths[path]["post"]["requestBody"]["content"]["application/json"]["schema"]
        return body["properties"]["instances"]["items"]

    for model in ("tiny-clf", "tiny-tag", "tiny-mt"):
        for path in (f"/v1/models/{model}:predict", f"/v1/models/{model}/versions/1:predict"):
            text, wrapped = instance(path)["anyOf"]
            assert text["type"] == "string" and wrapped["properties"]["text"] == text, path
    steps = instance("/v1/models/tiny-series:predict")["items"]
    assert steps["minItems"] == steps["maxItems"] == 3
    assert "/v1/models/tiny-lm:predict" not in paths and BROKEN not in str(list(paths))
    assert not any("{name}" in p and ":predict" in p for p in paths)


def test_the_kserve_sdk_v1_client(url: str) -> None:
    python = client_python(VENV_NAME)
    script = Path(__file__).with_name("kserve_v1_client.py")
    done = subprocess.run([str(python), str(script), url, "tiny-clf", BROKEN, *TEXTS],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["model_ready"] is True and got["not_ready"] is False
    ours = httpx.post(f"{url}/v1/models/tiny-clf/classify", json={"texts": TEXTS}).json()
    assert got["predict"] == {"predictions": ours["results"]}
