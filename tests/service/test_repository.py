"""Repository: tampered bundles and provider fallback are reported and skipped; the rest serve."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from service_fakes import copy_repo, serve_in_thread

import seqserve.export.manifest as manifest_module
from seqserve.export.manifest import load_bundle
from seqserve.service.core.metrics import Metrics
from seqserve.service.engine.client import EngineClient
from seqserve.service.engine.server import EngineServer
from seqserve.service.server.app import create_app
from seqserve.service.server.composition import Composition, engine_options
from seqserve.service.web.settings import Settings
from seqserve.service.workers.base import RequestContext
from seqserve.service.workers.classifier import ClassifierWorker

MODEL = "tiny-clf"


def _samples(text: str, name: str) -> dict[tuple[str, str], float]:
    return {(s.labels["model"], s.labels["version"]): s.value
            for f in text_string_to_metric_families(text) for s in f.samples if s.name == name}


@pytest.mark.parametrize("readiness", ["default", "all"])
def test_a_failed_version_beside_the_default_holds_readiness_only_when_strict(
        tiny_repo: Path, tmp_path: Path, readiness: str) -> None:
    """Version 1's graph truncated, version 2 good (the default: the highest ready): with
    `--readiness default` (the default) the server is ready and version 1 is reported failed
    with its reason in the repository index and the metrics; with `all` it is unready."""
    repo = copy_repo(tiny_repo, tmp_path / "repo")
    shutil.copytree(repo / MODEL / "1", repo / MODEL / "2")
    onnx = repo / MODEL / "1" / "classifier.onnx"
    onnx.write_bytes(onnx.read_bytes()[: onnx.stat().st_size // 2])
    assert Settings(repo=repo).readiness == "default"
    chosen = {} if readiness == "default" else {"readiness": readiness}
    app = create_app(Settings(repo=repo, warmup=False, **chosen))
    with serve_in_thread(app) as url, httpx.Client(base_url=url, timeout=30) as c:
        ready = c.get("/v2/health/ready")
        index = {(m["name"], m["version"]): m for m in c.post("/v2/repository/index").json()}
        ok = c.post(f"/v1/models/{MODEL}/classify", json={"texts": ["one"]})
        metrics = c.get("/metrics").text
    assert index[MODEL, "1"]["state"] == "UNAVAILABLE"
    assert "classifier.onnx" in index[MODEL, "1"]["reason"]
    assert index[MODEL, "2"]["state"] == "READY"
    assert ok.status_code == 200 and ok.json()["version"] == 2
    assert _samples(metrics, "seqserve_model_load_failures_total")[(MODEL, "1")] == 1
    if readiness == "default":
        assert ready.status_code == 200, ready.text
    else:
        assert ready.status_code == 503 and f"{MODEL}/1: failed" in ready.json()["error"]


def test_a_model_with_no_version_ready_holds_default_readiness(tiny_repo: Path,
                                                              tmp_path: Path) -> None:
    """`--readiness default` is not `any`: a model none of whose versions loaded keeps the
    server unready though another model serves."""
    repo = copy_repo(tiny_repo, tmp_path / "repo")
    shutil.copytree(repo / MODEL, repo / "broken")
    onnx = repo / "broken" / "1" / "classifier.onnx"
    onnx.write_bytes(onnx.read_bytes()[:100])
    with serve_in_thread(create_app(Settings(repo=repo, warmup=False))) as url:
        ready = httpx.get(f"{url}/v2/health/ready", timeout=30)
        ok = httpx.post(f"{url}/v1/models/{MODEL}/classify", json={"texts": ["one"]}, timeout=30)
    assert ok.status_code == 200
    assert ready.status_code == 503 and "broken/1: failed" in ready.json()["error"]


@pytest.mark.parametrize("readiness", ["default", "all", "any"])
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
        assert str(repo) not in by_version[2]["reason"]
        assert by_version[1]["state"] == "ready" and info["default_version"] == 1
        ok = c.post(f"/v1/models/{MODEL}/classify", json={"texts": ["one"]})
        assert ok.status_code == 200 and ok.json()["version"] == 1
        bad = c.post(f"/v1/models/{MODEL}/versions/2/classify", json={"texts": ["one"]})
        assert bad.status_code == 503 and "sha256" in bad.json()["error"]
        # every 503 says when to ask again (a failed version may load again: a fixed file)
        assert bad.headers["retry-after"] == "1"
        version_ready = c.get(f"/v2/models/{MODEL}/versions/2/ready")
        assert version_ready.status_code == 503 and version_ready.headers["retry-after"] == "1"
        ready = c.get("/v2/health/ready")
        metrics = c.get("/metrics").text
    if readiness == "all":  # strict: a failed version keeps the server out of rotation
        # (default: version 2 is not the default while it is failed, version 1 serves)
        assert ready.status_code == 503 and f"{MODEL}/2: failed" in ready.json()["error"]
        assert ready.headers["retry-after"] == "1"
        # the open readiness answer names the file within the repository: before, it showed
        # the server's absolute path to anyone
        assert f"{MODEL}/2/classifier.onnx" in ready.text and str(repo) not in ready.text
    else:
        assert ready.status_code == 200
    ready_gauge = _samples(metrics, "seqserve_model_ready")
    assert ready_gauge[(MODEL, "1")] == 1 and ready_gauge[(MODEL, "2")] == 0
    assert _samples(metrics, "seqserve_model_load_failures_total")[(MODEL, "2")] == 1


def test_a_failed_version_answers_grpc_unavailable_with_retry_after(tiny_repo: Path,
                                                                  tmp_path: Path) -> None:
    """gRPC's 503 (UNAVAILABLE) says when to ask again as HTTP's does: `retry-after` in its
    trailing metadata, for a failed version too (ModelNotReady set none before)."""
    import grpc
    from grpc_support import serve_with_grpc
    from service_fakes import settings

    from seqserve.service.api.grpc import messages as pb

    repo = copy_repo(tiny_repo, tmp_path / "repo")
    shutil.copytree(repo / MODEL / "1", repo / MODEL / "2")
    onnx = repo / MODEL / "2" / "classifier.onnx"
    onnx.write_bytes(onnx.read_bytes() + b"\0")
    app = create_app(settings(repo, grpc_port=0, retry_after_s=3))
    request = pb.ModelInferRequest(model_name=MODEL, model_version="2")
    request.inputs.add(name="text", datatype="BYTES", shape=[1]).contents.bytes_contents \
        .append(b"one")
    with serve_with_grpc(app) as running, grpc.insecure_channel(running.grpc) as channel:
        infer = channel.unary_unary(f"/{pb.INFERENCE}/ModelInfer",
                                    request_serializer=pb.ModelInferRequest.SerializeToString,
                                    response_deserializer=pb.ModelInferResponse.FromString)
        with pytest.raises(grpc.RpcError) as caught:
            infer(request, timeout=30)
        http = httpx.post(f"{running.url}/v1/models/{MODEL}/versions/2/classify",
                          json={"texts": ["one"]}, timeout=30)
    error: Any = caught.value
    assert error.code() == grpc.StatusCode.UNAVAILABLE and "sha256" in error.details()
    assert dict(error.trailing_metadata())["retry-after"] == "3"
    assert http.status_code == 503 and http.headers["retry-after"] == "3"


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
        assert httpx.get(f"{url}/v1/models").json() == {"models": [], "object": "list",
                                                            "data": []}


def test_with_an_engine_the_api_side_hashes_nothing(tiny_repo: Path, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """The engine verifies every bundle once; an API process's repository takes the verified
    manifest, limits and state from the engine's Hello answer: not one file is hashed there
    (and a version the engine failed is failed there too, with the engine's reason)."""
    repo = copy_repo(tiny_repo, tmp_path / "repo")
    shutil.copytree(repo / MODEL / "1", repo / MODEL / "2")
    onnx = repo / MODEL / "2" / "classifier.onnx"
    onnx.write_bytes(onnx.read_bytes() + b"\0")
    settings = Settings(repo=repo, warmup=False, max_tokens=8, max_batch_tokens=512)
    hashed: list[str] = []
    real_hash = manifest_module.sha256_file
    monkeypatch.setattr(manifest_module, "sha256_file",
                        lambda path, *a: hashed.append(str(path)) or real_hash(path, *a))
    address = f"ipc://{tempfile.mkdtemp(prefix='sq-')}/engine.sock"

    async def scenario() -> None:
        engine = EngineServer(engine_options(settings), Metrics())
        await engine.load()
        stop = asyncio.Event()
        serving = asyncio.create_task(engine.serve(address, stop))
        by_engine = len(hashed)
        client = EngineClient(address)
        composition = Composition(settings, Metrics(), remote=client)
        api = composition.repository
        try:
            await composition.start()
            assert by_engine > 0 and len(hashed) == by_engine, hashed[by_engine:]
            good = api.entry(MODEL, 1)
            assert good.state == "ready" and good.manifest == load_bundle(repo / MODEL / "1")
            assert isinstance(good.worker, ClassifierWorker)
            assert good.worker.ctx.limits.max_tokens == 8  # the engine's limit, not re-derived
            assert good.scheduling and good.scheduling["batcher"]["max_batch_tokens"] == 512
            bad = api.entry(MODEL, 2)
            assert bad.state == "failed" and bad.reason and "sha256" in bad.reason
            call = RequestContext(deadline=time.monotonic() + 30)
            (answer,) = await good.worker.classify(["one two"], 1, False, call)
            assert answer["label"]
            report = api.engine_report()
            assert report["mode"] == "engine process"
            assert report["options"] == engine_options(settings).to_dict()
        finally:
            stop.set()
            await serving
            await engine.drain(5.0)
            await composition.stop(5.0)

    asyncio.run(asyncio.wait_for(scenario(), timeout=120))


def test_in_process_the_bundle_is_verified_once(tiny_repo: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """--api-workers 0: one load per bundle, which hashes each of its files once."""
    hashed: list[str] = []
    real_hash = manifest_module.sha256_file
    monkeypatch.setattr(manifest_module, "sha256_file",
                        lambda path, *a: hashed.append(str(path)) or real_hash(path, *a))
    composition = Composition(Settings(repo=tiny_repo, warmup=False), Metrics())

    async def scenario() -> None:
        await composition.start(only=MODEL)
        await composition.stop(5.0)

    asyncio.run(scenario())
    files = load_bundle(tiny_repo / MODEL / "1", verify=False).files
    assert sorted(hashed) == sorted(str(tiny_repo / MODEL / "1" / f) for f in files)
