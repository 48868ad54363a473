"""The repository, statistics and configuration extensions as tritonclient calls them, the
same under /v1/admin/models and `seqserve models`, behind the API key; loading and unloading
a version frees its memory (issue 34)."""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
from control_support import CLF, MT, Traffic, publish
from service_fakes import copy_repo, serve_in_thread, settings

from seqserve.service.server.app import create_app

httpclient = pytest.importorskip("tritonclient.http")
from tritonclient.utils import InferenceServerException  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def explicit(tiny_repo: Path, tmp_path: Path) -> Iterator[tuple[str, Path]]:
    repo = copy_repo(tiny_repo, tmp_path / "repo")
    app = create_app(settings(repo, model_control="explicit", load_model=[CLF]))
    with serve_in_thread(app) as url:
        yield url, repo


def _translate(url: str) -> httpx.Response:
    return httpx.post(f"{url}/v1/models/{MT}/translate", json={"texts": ["one"]}, timeout=30)


def test_tritonclient_loads_and_unloads_and_reads_the_index_stats_and_config(
        explicit: tuple[str, Path]) -> None:
    url, repo = explicit
    client = httpclient.InferenceServerClient(url=url.removeprefix("http://"))
    index = {(r["name"], r.get("version", "")): r for r in client.get_model_repository_index()}
    assert index[(CLF, "1")]["state"] == "READY"
    assert index[(MT, "")]["state"] == "UNAVAILABLE" and index[(MT, "")]["reason"] == "unloaded"
    assert _translate(url).status_code == 404
    with Traffic(url, models=(CLF,)) as traffic:  # classify answers through every change
        client.load_model(MT)
        assert client.is_model_ready(MT)
        assert _translate(url).status_code == 200
        ready = client.get_model_repository_index()
        assert {(r["name"], r["version"], r["state"]) for r in ready} >= {
            (MT, "1", "READY"), (CLF, "1", "READY")}
        publish(repo, MT, 1, 2)
        client.load_model(MT)  # explicit: a load picks up the new version
        assert _translate(url).json()["version"] == 2
        client.unload_model(MT)
        assert _translate(url).status_code == 404
        assert not client.is_model_ready(MT)
        with pytest.raises(InferenceServerException, match="no model folder"):
            client.load_model("nope")
        with pytest.raises(InferenceServerException, match="config"):
            client.load_model(CLF, config=json.dumps({"max_batch_size": 4}))
    assert set(traffic.statuses) == {200}, traffic.errors[:5]
    stats = client.get_inference_statistics(CLF)["model_stats"]
    assert [s["version"] for s in stats] == ["1"]
    success = stats[0]["inference_stats"]["success"]
    assert success["count"] == traffic.statuses[200] > 0 and success["ns"] > 0
    assert stats[0]["inference_stats"]["compute_infer"]["ns"] > 0
    assert stats[0]["last_inference"] > 0
    every = client.get_inference_statistics()["model_stats"]
    assert [s["name"] for s in every] == [CLF]
    config = client.get_model_config(CLF)
    assert config["name"] == CLF and config["platform"] == "seqserve_classifier"
    assert config["input"][0]["name"] == "text" and config["input"][0]["data_type"] == \
        "TYPE_STRING"
    assert config["seqserve"]["manifest"]["task"] == "classifier"
    assert client.get_model_config(CLF, "1")["version"] == "1"
    extensions = httpx.get(f"{url}/v2").json()["extensions"]
    assert {"model_repository", "statistics", "model_configuration", "sequence"} <= set(
        extensions)


def test_v1_admin_models_and_the_cli(explicit: tuple[str, Path]) -> None:
    url, _ = explicit
    listed = httpx.get(f"{url}/v1/admin/models").json()
    assert listed["mode"] == "explicit"
    assert {(m["name"], m["state"]) for m in listed["models"]} == {
        (CLF, "READY"), (MT, "UNAVAILABLE")}

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "seqserve.cli", "models", *args, "--url",
                               url], capture_output=True, text=True, cwd=ROOT, timeout=120)

    done = cli("load", MT)
    assert done.returncode == 0 and f"{MT}: loaded" in done.stdout, done.stderr
    shown = cli("list")
    assert shown.returncode == 0 and f"{MT}\t1\tREADY" in shown.stdout
    assert _translate(url).status_code == 200
    gone = cli("unload", MT)
    assert gone.returncode == 0 and _translate(url).status_code == 404
    refused = cli("unload", "nope")
    assert refused.returncode == 1 and "not loaded" in refused.stderr
    assert httpx.post(f"{url}/v1/admin/models/{MT}/load").status_code == 200
    assert _translate(url).status_code == 200


def test_the_control_routes_are_behind_the_api_key(tiny_repo: Path) -> None:
    app = create_app(settings(tiny_repo, api_key="k3y", model_control="none"))
    with serve_in_thread(app) as url:
        for method, path in [("POST", "/v2/repository/index"),
                             ("POST", f"/v2/repository/models/{MT}/load"),
                             ("GET", f"/v2/models/{CLF}/stats"),
                             ("GET", f"/v2/models/{CLF}/config"),
                             ("GET", "/v1/admin/models")]:
            assert httpx.request(method, url + path).status_code == 401, path
        key = {"Authorization": "Bearer k3y"}
        assert httpx.post(f"{url}/v2/repository/index", headers=key).status_code == 200
        refused = httpx.post(f"{url}/v2/repository/models/{MT}/unload", headers=key)
        assert refused.status_code == 409 and "'none'" in refused.json()["error"]


def test_poll_mode_refuses_an_unload_and_loads_by_scanning(tiny_repo: Path,
                                                           tmp_path: Path) -> None:
    repo = copy_repo(tiny_repo, tmp_path / "repo")
    app = create_app(settings(repo, repository_poll_s=3600))
    with serve_in_thread(app) as url:
        r = httpx.post(f"{url}/v2/repository/models/{CLF}/unload")
        assert r.status_code == 409 and "remove its folder" in r.json()["error"]
        publish(repo, CLF, 1, 2)
        assert httpx.post(f"{url}/v2/repository/models/{CLF}/load").status_code == 200
        r = httpx.post(f"{url}/v1/models/{CLF}/classify", json={"texts": ["one"]})
        assert r.json()["version"] == 2


def _rss_mb() -> float:
    with open(f"/proc/{os.getpid()}/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def test_loading_and_unloading_a_version_ten_times_frees_its_memory(
        explicit: tuple[str, Path]) -> None:
    """ONNX Runtime sessions and the scheduler's buffers really freed: RSS between cycle 5
    and cycle 10 grows by less than 10 MB (the benchmark runs 50 cycles)."""
    url, _ = explicit
    client = httpclient.InferenceServerClient(url=url.removeprefix("http://"))
    rss = []
    for _ in range(10):
        client.load_model(MT)
        for _ in range(3):
            assert _translate(url).status_code == 200
        client.unload_model(MT)
        gc.collect()
        rss.append(_rss_mb())
    growth = rss[9] - rss[4]
    print(f"\nRSS per cycle (MB): {np.round(rss, 1).tolist()}; cycle 5 -> 10: {growth:+.1f}")
    assert growth < 10, rss
