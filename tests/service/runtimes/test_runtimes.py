"""Runtimes: provider lists, the GPU fallback check, TorchScript and ONNX Runtime agree."""

from __future__ import annotations

from pathlib import Path

import httpx
import numpy as np
import pytest
from service_fakes import runtime_spec, serve_in_thread

from seqserve.export.manifest import load_bundle
from seqserve.service.runtimes import load_runtime
from seqserve.service.runtimes.base import RuntimeUnavailable
from seqserve.service.runtimes.onnx import check_providers
from seqserve.service.server.app import create_app
from seqserve.service.web.settings import Settings

MODEL = "tiny-clf"


def test_device_cuda_selects_the_cuda_provider_list() -> None:
    assert Settings(device="cuda").runtime_spec().ort_providers()[0] == "CUDAExecutionProvider"
    assert Settings().runtime_spec().ort_providers() == ["CPUExecutionProvider"]
    assert runtime_spec(providers=("TensorrtExecutionProvider",)).ort_providers() == [
        "TensorrtExecutionProvider"]
    assert Settings(providers="TensorrtExecutionProvider,CPUExecutionProvider").providers == [
        "TensorrtExecutionProvider", "CPUExecutionProvider"]


@pytest.mark.parametrize(
    ("requested", "actual", "fails"),
    [
        (["CUDAExecutionProvider", "CPUExecutionProvider"], ["CPUExecutionProvider"], True),
        (["TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"],
         ["CUDAExecutionProvider", "CPUExecutionProvider"], True),
        (["CUDAExecutionProvider", "CPUExecutionProvider"],
         ["CUDAExecutionProvider", "CPUExecutionProvider"], False),
        (["CPUExecutionProvider"], ["CPUExecutionProvider"], False),
    ],
)
def test_check_providers(requested: list[str], actual: list[str], fails: bool) -> None:
    if fails:
        with pytest.raises(RuntimeUnavailable, match="not active"):
            check_providers(requested, actual)
    else:
        check_providers(requested, actual)


def test_torchscript_runtime_serves_same_scores(tiny_repo: Path) -> None:
    body = {"texts": ["one two three", "vingt et un cent"], "top_k": 3}
    scores = []
    for runtime in ("onnx", "torchscript"):
        settings = Settings(repo=tiny_repo, warmup=False, runtime=runtime)
        with serve_in_thread(create_app(settings)) as url:
            r = httpx.post(f"{url}/v1/models/{MODEL}/classify", json=body, timeout=30)
            assert r.status_code == 200, r.text
            scores.append([t["probability"] for res in r.json()["results"] for t in res["top_k"]])
    assert scores[0] == pytest.approx(scores[1], abs=1e-5)


def test_both_runtimes_run_every_graph_alike(tiny_repo: Path) -> None:
    for name in ("tiny-clf", "tiny-mt"):
        path = tiny_repo / name / "1"
        manifest = load_bundle(path)
        onnx = load_runtime(runtime_spec(kind="onnx", intra_op_threads=1), path, manifest)
        script = load_runtime(runtime_spec(kind="torchscript"), path, manifest)
        assert onnx.name == "onnx" and script.name == "torchscript"
        ids = np.array([[5, 6, 7, 8], [9, 10, 0, 0]], dtype=np.int64)  # (2, 4) right-padded
        lengths = np.array([4, 2], dtype=np.int64)
        inputs = ({"input_ids": ids, "lengths": lengths} if name == "tiny-clf"
                  else {"src_ids": ids, "src_lengths": lengths})
        graph = "classifier" if name == "tiny-clf" else "encoder"
        a, b = onnx.run(graph, inputs), script.run(graph, inputs)
        assert sorted(a) == sorted(b)
        for key in a:
            np.testing.assert_allclose(a[key], b[key], atol=1e-5)
