"""Repository: tampered bundles and provider fallback are reported and skipped; the rest serve."""

from __future__ import annotations

import shutil
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from service_fakes import copy_repo, serve_in_thread

from seqserve.service.server.app import create_app
from seqserve.service.web.settings import Settings

MODEL = "tiny-clf"


def _samples(text: str, name: str) -> dict[tuple[str, str], float]:
    return {(s.labels["model"], s.labels["version"]): s.value
            for f in text_string_to_metric_families(text) for s in f.samples if s.name == name}


@pytest.mark.parametrize("readiness", ["all", "any"])
def test_tampered_bundle_is_skipped_while_another_serves(tiny_repo: Path, tmp_path: Path,
                                                         readiness: str) -> None:
    repo = copy_repo(tiny_repo, tmp_path / "repo")
    v2 = repo / MODEL / "2"
    shutil.copytree(repo / MODEL / "1", v2)
    onnx = v2 / "classifier.onnx"
    data = bytearray(onnx.read_bytes())
    data[len(data) // 2] ^= 0xFF
    onnx.write_bytes(bytes(data))
    app = create_app(Settings(repo=repo, warmup=False, readiness=readiness))
    with serve_in_thread(app) as url, httpx.Client(base_url=url, timeout=30) as c:
        info = c.get(f"/v1/models/{MODEL}").json()
        by_version = {v["version"]: v for v in info["versions"]}
        assert by_version[2]["state"] == "failed"
        assert "sha256" in by_version[2]["reason"] and "classifier.onnx" in by_version[2][
            "reason"]
        assert by_version[1]["state"] == "ready" and info["default_version"] == 1
        ok = c.post(f"/v1/models/{MODEL}/classify", json={"texts": ["one"]})
        assert ok.status_code == 200 and ok.json()["version"] == 1
        bad = c.post(f"/v1/models/{MODEL}/versions/2/classify", json={"texts": ["one"]})
        assert bad.status_code == 503 and "sha256" in bad.json()["error"]
        assert "retry-after" not in bad.headers  # failed stays failed: do not retry
        assert c.get(f"/v2/models/{MODEL}/versions/2/ready").status_code == 503
        ready = c.get("/v2/health/ready")
        metrics = c.get("/metrics").text
    if readiness == "all":  # strict: a failed version keeps the server out of rotation
        assert ready.status_code == 503 and f"{MODEL}/2: failed" in ready.json()["error"]
    else:
        assert ready.status_code == 200
    ready_gauge = _samples(metrics, "seqserve_model_ready")
    assert ready_gauge[(MODEL, "1")] == 1 and ready_gauge[(MODEL, "2")] == 0
    assert _samples(metrics, "seqserve_model_load_failures_total")[(MODEL, "2")] == 1


def test_requested_cuda_on_cpu_build_is_not_ready(tiny_repo: Path) -> None:
    settings = Settings(repo=tiny_repo, warmup=False,
                        providers=["CUDAExecutionProvider", "CPUExecutionProvider"])
    with serve_in_thread(create_app(settings)) as url, httpx.Client(base_url=url) as c:
        info = c.get(f"/v1/models/{MODEL}").json()["versions"][0]
        assert info["state"] == "failed"
        assert "CUDAExecutionProvider" in info["reason"] and "CPUExecutionProvider" in info[
            "reason"]
        assert c.get("/v2/health/ready").status_code == 503
        r = c.post(f"/v1/models/{MODEL}/classify", json={"texts": ["one"]})
        assert r.status_code == 503 and "CUDAExecutionProvider" in r.json()["error"]


def test_empty_repository_is_not_ready(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with serve_in_thread(create_app(Settings(repo=tmp_path / "empty"))) as url:
        assert httpx.get(f"{url}/v2/health/ready").status_code == 503
        assert httpx.get(f"{url}/v1/models").json() == {"models": []}
