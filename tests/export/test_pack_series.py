"""Feature-sequence models (sequence-classifier, sequence-tagger) written outside seqserve
(tests/series_support.py: tutorial-style nn.GRU / nn.LSTM modules with their own tensor
names), packed by the CLI from their own ONNX files and by the Python API, served by a real
server: the served outputs equal the eager module's to 1e-5 (normalisation applied by the
server, output scale undone), over v1 predict and over OIP with tritonclient's FP32 numpy
arrays (JSON and binary), whatever else shares the batch; a module whose state is not its
rows' own is refused naming the fix."""

from __future__ import annotations

import json
import warnings
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import torch
from series_support import (
    NORM,
    SCALE,
    GRUForecaster,
    LSTMSensorClassifier,
    NaiveStatefulGRU,
    TutorialLSTMTagger,
    eager_series,
    init,
    raw_series,
)

import seqserve.pack
from seqserve.cli import main
from seqserve.models.errors import BundleError

LABELS = ["idle", "walk", "run"]
GRID = {"batch_sizes": (1, 3), "lengths": (1, 7)}


def _onnx(module: torch.nn.Module, example: tuple[Any, ...], path: Path, inputs: list[str],
          outputs: list[str], axes: dict[str, dict[int, str]]) -> Path:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(module, example, str(path), input_names=inputs, output_names=outputs,
                          dynamic_axes=axes, opset_version=17, dynamo=False)
    return path


@pytest.fixture(scope="module")
def packed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    d = tmp_path_factory.mktemp("pack-series")
    repo = d / "repo"
    gru = init(GRUForecaster())
    seqserve.pack.sequence_tagger(gru, features=3, outputs=1, normalization=NORM,
                                  output_scale=SCALE, repo=repo, name="forecast-api",
                                  max_steps=24, progress=False, grid=GRID)
    lstm = init(LSTMSensorClassifier(), seed=1)
    seqserve.pack.sequence_classifier(lstm, features=3, labels=LABELS, normalization=NORM,
                                      repo=repo, name="activity-api", max_steps=24,
                                      progress=False, grid=GRID)
    # the CLI, from the user's own ONNX files and names: a stateful GRU (x, n, h0 -> y, hn)
    x, n = torch.randn(3, 5, 3), torch.tensor([5, 3, 2])
    _onnx(gru, (x, n, torch.zeros(3, 24)), d / "gru.onnx", ["x", "n", "h0"], ["y", "hn"],
          {"x": {0: "b", 1: "t"}, "n": {0: "b"}, "h0": {0: "b"}, "y": {0: "b", 1: "t"},
           "hn": {0: "b"}})
    (d / "norm.json").write_text(json.dumps(NORM))
    (d / "scale.json").write_text(json.dumps(SCALE))
    assert main(["pack", "sequence-tagger", "--onnx", str(d / "gru.onnx"), "--features", "3",
                 "--outputs", "1", "--input-names", "x,n,h0", "--output-names", "y,hn",
                 "--normalization", str(d / "norm.json"), "--output-scale",
                 str(d / "scale.json"), "--repo", str(repo), "--name", "forecast-cli",
                 "--max-steps", "24"]) == 0
    # a stateless tutorial LSTM tagger with a TorchScript twin, raw inputs
    tagger = init(TutorialLSTMTagger(), seed=2)
    _onnx(tagger, (x, n), d / "lstm.onnx", ["signal", "steps"], ["level"],
          {"signal": {0: "b", 1: "t"}, "steps": {0: "b"}, "level": {0: "b", 1: "t"}})
    torch.jit.save(torch.jit.trace(tagger, (x, n)), str(d / "lstm.pt"))
    assert main(["pack", "sequence-tagger", "--onnx", str(d / "lstm.onnx"), "--torchscript",
                 str(d / "lstm.pt"), "--features", "3", "--outputs", "1", "--repo", str(repo),
                 "--name", "level-cli", "--max-steps", "24"]) == 0
    return {"repo": repo, "gru": gru, "lstm": lstm, "tagger": tagger}


@pytest.fixture(scope="module")
def server(packed: dict[str, Any]) -> Iterator[str]:
    from service_fakes import serve_repo

    with serve_repo(packed["repo"], max_wait_ms=20, max_texts=8) as url:
        yield url


def test_manifests_record_what_the_server_applies(packed: dict[str, Any]) -> None:
    m = json.loads((packed["repo"] / "forecast-cli" / "1" / "manifest.json").read_text())
    assert m["task"] == "sequence-tagger" and "tokenizer" not in m
    assert m["features"] == 3 and m["outputs"] == 1 and m["state_dim"] == 24
    assert m["normalization"] == NORM and m["output_scale"] == SCALE
    assert m["source"]["input_names"] == ["x", "n", "h0"]
    assert m["parity"]["passed"] and "sequence_tagger.chunked" in m["parity"][
        "invariance_max_diff"]["onnx"]
    clf = json.loads((packed["repo"] / "activity-api" / "1" / "manifest.json").read_text())
    assert clf["labels"] == LABELS and clf["state_dim"] == 2 * 2 * 10
    api = json.loads((packed["repo"] / "forecast-api" / "1" / "manifest.json").read_text())
    for manifest in (api, clf):  # seqserve.pack.length_aware through the default exporter
        assert manifest["source"]["exporter"] == "dynamo"
    assert main(["verify", str(packed["repo"] / "activity-api" / "1")]) == 0


@pytest.mark.parametrize("name", ["forecast-api", "forecast-cli"])
def test_predict_equals_the_eager_forecaster(server: str, packed: dict[str, Any],
                                             name: str) -> None:
    rng = np.random.default_rng(0)
    series = [raw_series(rng, n) for n in (24, 1, 9, 17)]  # one request, mixed lengths
    r = httpx.post(f"{server}/v1/models/{name}/predict",
                   json={"series": [s.tolist() for s in series]}, timeout=30)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["model"] == name and body["version"] == 1
    for s, result in zip(series, body["results"], strict=True):
        want = eager_series(packed["gru"], s, scale=SCALE)  # (T, 1)
        got = np.asarray(result["outputs"])
        assert got.shape == want.shape == (len(s), 1) and result["steps"] == len(s)
        assert np.abs(got - want).max() <= 1e-5 * max(1.0, np.abs(want).max())
        assert "label" not in result


def test_classifier_labels_probabilities_and_outputs(server: str, packed: dict[str, Any]
                                                     ) -> None:
    rng = np.random.default_rng(1)
    series = [raw_series(rng, n) for n in (3, 20)]
    r = httpx.post(f"{server}/v1/models/activity-api/predict",
                   json={"series": [s.tolist() for s in series]}, timeout=30)
    assert r.status_code == 200, r.text
    for s, result in zip(series, r.json()["results"], strict=True):
        logits = eager_series(packed["lstm"], s)  # (3,)
        probs = np.exp(logits - logits.max()) / np.exp(logits - logits.max()).sum()
        assert np.allclose(result["outputs"], logits, atol=1e-5)
        assert np.allclose(result["probabilities"], probs, atol=1e-5)
        assert result["label"] == LABELS[int(np.argmax(logits))]


def test_batch_invariance_across_concurrent_requests(server: str, packed: dict[str, Any]
                                                     ) -> None:
    """Requests of different lengths sent at once share batches (the length-aware batcher);
    each answer equals that series alone through the eager module."""
    rng = np.random.default_rng(2)
    series = [raw_series(rng, n) for n in (1, 2, 5, 8, 13, 21, 24, 3, 11, 16)]

    def one(s: np.ndarray) -> np.ndarray:
        r = httpx.post(f"{server}/v1/models/level-cli/predict",
                       json={"series": [s.tolist()]}, timeout=30)
        assert r.status_code == 200, r.text
        return np.asarray(r.json()["results"][0]["outputs"])

    with ThreadPoolExecutor(len(series)) as pool:
        answers = list(pool.map(one, series))
    for s, got in zip(series, answers, strict=True):
        want = eager_series(packed["tagger"], s, norm=None)
        assert np.abs(got - want).max() <= 1e-5
    metrics = httpx.get(f"{server}/metrics", timeout=10).text
    assert 'endpoint="predict"' in metrics and 'model="level-cli"' in metrics


@pytest.mark.parametrize("binary", [True, False])
def test_tritonclient_sends_fp32_arrays(server: str, packed: dict[str, Any],
                                        binary: bool) -> None:
    httpclient = pytest.importorskip("tritonclient.http")
    client = httpclient.InferenceServerClient(url=server.removeprefix("http://"))
    meta = client.get_model_metadata("forecast-api")
    assert meta["inputs"] == [{"name": "features", "datatype": "FP32", "shape": [-1, -1, 3]},
                              {"name": "lengths", "datatype": "INT64", "shape": [-1]}]
    assert meta["outputs"] == [{"name": "outputs", "datatype": "FP32", "shape": [-1, -1, 1]}]
    rng = np.random.default_rng(3)
    lengths = np.array([10, 4, 7], np.int64)
    batch = np.zeros((3, 10, 3), np.float32)
    rows = [raw_series(rng, int(n)) for n in lengths]
    for i, s in enumerate(rows):
        batch[i, : len(s)] = s
    features = httpclient.InferInput("features", list(batch.shape), "FP32")
    features.set_data_from_numpy(batch, binary_data=binary)
    n = httpclient.InferInput("lengths", [3], "INT64")
    n.set_data_from_numpy(lengths, binary_data=binary)
    outputs = [httpclient.InferRequestedOutput("outputs", binary_data=binary)]
    result = client.infer("forecast-api", [features, n], outputs=outputs)
    got = result.as_numpy("outputs")
    assert got.shape == (3, 10, 1) and got.dtype == np.float32
    for i, s in enumerate(rows):
        want = eager_series(packed["gru"], s.astype(np.float32).astype(np.float64),
                            scale=SCALE)
        assert np.abs(got[i, : len(s)] - want).max() <= 1e-5 * max(1.0, np.abs(want).max())
        assert not got[i, len(s):].any()
    # every row full length: lengths may be left out
    full = httpclient.InferInput("features", [1, 4, 3], "FP32")
    full.set_data_from_numpy(batch[:1, :4], binary_data=binary)
    alone = client.infer("forecast-api", [full]).as_numpy("outputs")
    want = eager_series(packed["gru"], batch[0, :4].astype(np.float64), scale=SCALE)
    assert np.abs(alone[0] - want).max() <= 1e-5 * max(1.0, np.abs(want).max())


def test_oip_classifier_answers_labels_and_probabilities(server: str) -> None:
    body = {"inputs": [{"name": "features", "datatype": "FP32", "shape": [2, 2, 3],
                        "data": [[[10, -2, 0.5], [11, -2, 1]], [[9, -1, 0], [8, -3, 2]]]}]}
    r = httpx.post(f"{server}/v2/models/activity-api/infer", json=body, timeout=30)
    assert r.status_code == 200, r.text
    outs = {o["name"]: o for o in r.json()["outputs"]}
    assert outs["outputs"]["shape"] == [2, 3] and outs["probabilities"]["shape"] == [2, 3]
    probs = np.asarray(outs["probabilities"]["data"]).reshape(2, 3)
    assert np.allclose(probs.sum(1), 1, atol=1e-5)
    assert outs["label"]["data"] == [LABELS[int(j)] for j in probs.argmax(1)]


def test_predict_on_a_text_model_and_text_routes_on_a_series_model_are_404(
        server: str) -> None:
    r = httpx.post(f"{server}/v1/models/forecast-api/classify", json={"texts": ["a"]})
    assert r.status_code == 404 and r.json()["error"]
    models = httpx.get(f"{server}/v1/models", timeout=10).json()
    tasks = {m["name"]: v["task"] for m in models["models"] for v in m["versions"]}
    assert tasks["activity-api"] == "sequence-classifier", models
    assert tasks["forecast-api"] == "sequence-tagger", models


def test_a_state_after_the_padding_is_refused_naming_the_fix(tmp_path: Path) -> None:
    with pytest.raises(BundleError, match=r"length_aware"):
        seqserve.pack.sequence_tagger(init(NaiveStatefulGRU()), features=3, outputs=1,
                                      repo=tmp_path, name="naive", max_steps=16,
                                      progress=False, grid=GRID)
    assert not any((tmp_path / "naive").glob("*/manifest.json"))


def test_bad_pack_arguments_are_refused(tmp_path: Path) -> None:
    from seqserve.models.errors import UserError

    gru = init(GRUForecaster())
    with pytest.raises(UserError, match="normalization.mean must list 3"):
        seqserve.pack.sequence_tagger(gru, features=3, outputs=1, normalization={
            "mean": [0.0], "std": [1.0]}, repo=tmp_path, name="x", progress=False)
    with pytest.raises(UserError, match="std must be > 0"):
        seqserve.pack.sequence_tagger(gru, features=3, outputs=1, normalization={
            "mean": [0.0] * 3, "std": [1.0, 0.0, 1.0]}, repo=tmp_path, name="x",
            progress=False)
    with pytest.raises(UserError, match="gives 1 outputs"):
        seqserve.pack.sequence_tagger(gru, features=3, outputs=2, repo=tmp_path, name="x",
                                      progress=False, grid=GRID)
    with pytest.raises(UserError, match="labels= .* or outputs="):
        seqserve.pack.sequence_tagger(gru, features=3, repo=tmp_path, name="x",
                                      progress=False)


def test_served_through_the_engine_process(packed: dict[str, Any]) -> None:
    """`seqserve serve` (API process + engine process): float series cross the engine's
    socket, share its batches and come back equal to the eager module's."""
    from process_support import serve

    rng = np.random.default_rng(4)
    series = [raw_series(rng, n) for n in (6, 24, 1)]
    with serve(packed["repo"], "--layout", "engine", "--api-workers", "1") as server:
        r = httpx.post(f"{server.url}/v1/models/forecast-cli/predict",
                       json={"series": [s.tolist() for s in series]}, timeout=30)
        assert r.status_code == 200, r.text
        for s, result in zip(series, r.json()["results"], strict=True):
            want = eager_series(packed["gru"], s, scale=SCALE)
            got = np.asarray(result["outputs"])
            assert np.abs(got - want).max() <= 1e-5 * max(1.0, np.abs(want).max())
        bad = httpx.post(f"{server.url}/v1/models/forecast-cli/predict",
                         json={"series": [[[1.0, 2.0]]]}, timeout=30)
        assert bad.status_code == 400 and "3 per step" in bad.json()["error"]
