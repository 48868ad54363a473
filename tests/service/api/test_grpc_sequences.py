"""tritonclient.grpc against the gRPC front with FP32 feature inputs (a stateful
feature-sequence bundle: sequences by `sequence_id` / `sequence_start` / `sequence_end`, as
the HTTP OIP maps them to sessions) and a language model's streamed generation
(ModelStreamInfer, the HTTP generate extension's behaviour): the answers equal HTTP's."""

from __future__ import annotations

import queue
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from grpc_support import Running, serve_with_grpc
from service_fakes import settings

from seqserve.service.server.app import create_app

grpcclient = pytest.importorskip("tritonclient.grpc")
from tritonclient.utils import InferenceServerException  # noqa: E402

SERIES = "tiny-series"
LM = "tiny-lm"


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory, tiny_series_repo: Path,
           tiny_lm_repo: Path) -> Iterator[Running]:
    repo = tmp_path_factory.mktemp("grpc-seq") / "repo"
    shutil.copytree(tiny_series_repo, repo)
    shutil.copytree(tiny_lm_repo / LM, repo / LM)
    with serve_with_grpc(create_app(settings(repo, grpc_port=0))) as running:
        yield running


def features(x: np.ndarray) -> Any:
    inp = grpcclient.InferInput("features", list(x.shape), "FP32")
    inp.set_data_from_numpy(x.astype(np.float32))
    return inp


def over_http(url: str, x: np.ndarray, parameters: dict[str, Any] | None = None) -> Any:
    body: dict[str, Any] = {"inputs": [{"name": "features", "datatype": "FP32",
                                        "shape": list(x.shape),
                                        "data": x.astype(np.float32).reshape(-1).tolist()}]}
    if parameters:
        body["parameters"] = parameters
    r = httpx.post(f"{url}/v2/models/{SERIES}/infer", json=body, timeout=30)
    assert r.status_code == 200, r.text
    return r.json()


def test_fp32_features_answer_as_http(served: Running) -> None:
    x = np.random.default_rng(1).standard_normal((2, 5, 3)) * 2 + 5
    client = grpcclient.InferenceServerClient(url=served.grpc)
    meta = client.get_model_metadata(SERIES, as_json=True)
    assert [i["name"] for i in meta["inputs"]] == ["features", "lengths"]
    got = client.infer(SERIES, [features(x)]).as_numpy("outputs")
    want = over_http(served.url, x)["outputs"][0]
    assert got.shape == tuple(want["shape"]) == (2, 5, 1)
    assert np.allclose(got.reshape(-1), want["data"], atol=1e-6)


def test_sequences_are_sessions(served: Running) -> None:
    series = np.random.default_rng(2).standard_normal((9, 3)) * 2 + 5
    client = grpcclient.InferenceServerClient(url=served.grpc)
    outs = []
    for i, (a, b) in enumerate([(0, 4), (4, 9)]):
        result = client.infer(SERIES, [features(series[None, a:b])], sequence_id=77,
                              sequence_start=i == 0, sequence_end=i == 1)
        params = result.get_response().parameters
        assert params["sequence_id"].int64_param == 77
        assert params["sequence_steps"].int64_param == b
        outs.append(result.as_numpy("outputs")[0])
    whole = over_http(served.url, series[None])["outputs"][0]
    assert np.allclose(np.concatenate(outs).reshape(-1), whole["data"], atol=1e-5)
    with pytest.raises(InferenceServerException, match="unknown") as caught:  # it ended
        client.infer(SERIES, [features(series[None, :2])], sequence_id=77)
    assert caught.value.status() == "StatusCode.NOT_FOUND"
    two = np.stack([series[:2], series[2:4]])
    with pytest.raises(InferenceServerException, match="exactly one series") as caught:
        client.infer(SERIES, [features(two)], sequence_id="s", sequence_start=True)
    assert caught.value.status() == "StatusCode.INVALID_ARGUMENT"


def text_input(prompt: str) -> Any:
    inp = grpcclient.InferInput("text_input", [1], "BYTES")
    inp.set_data_from_numpy(np.array([prompt], dtype=object))
    return inp


def stream(client: Any, got: queue.Queue[Any], **kwargs: Any) -> list[Any]:
    """The responses of one stream request, up to its final one (or its error)."""
    client.async_stream_infer(LM, **kwargs)
    out = []
    while True:
        result, error = got.get(timeout=30)
        if error is not None:
            return [error]
        out.append(result)
        if result.get_response().parameters["triton_final_response"].bool_param:
            return out


def test_streamed_generation_as_http_generate(served: Running) -> None:
    prompt = "one two"
    params = {"max_tokens": 6, "temperature": 0}
    http = httpx.post(f"{served.url}/v2/models/{LM}/generate", timeout=30,
                      json={"text_input": prompt, "parameters": params}).json()
    client = grpcclient.InferenceServerClient(url=served.grpc)
    got: queue.Queue[Any] = queue.Queue()
    client.start_stream(lambda result, error: got.put((result, error)))
    try:
        answers = stream(client, got, inputs=[text_input(prompt)], parameters=params,
                         request_id="g1", enable_empty_final_response=True)
        pieces = [r.as_numpy("text_output")[0].decode() for r in answers]
        last = answers[-1].get_response()
        assert pieces[-1] == "" and "".join(pieces) == http["text_output"]
        assert len(answers) == http["usage"]["completion_tokens"] + 1  # one per token
        assert last.parameters["finish_reason"].string_param == http["finish_reason"]
        assert last.parameters["completion_tokens"].int64_param == \
            http["usage"]["completion_tokens"]
        assert all(r.get_response().id == "g1" for r in answers)
        [error] = stream(client, got, inputs=[text_input(prompt)],
                         parameters={"max_tokens": 2, "beam": 3})
        assert isinstance(error, InferenceServerException) and "beam" in str(error)
        again = stream(client, got, inputs=[text_input(prompt)], parameters=params)
        assert "".join(r.as_numpy("text_output")[0].decode() for r in again) == \
            http["text_output"]  # the stream went on after the failed request
    finally:
        client.stop_stream()
    whole = client.infer(LM, [text_input(prompt)], parameters=params)  # ModelInfer: in one
    assert whole.as_numpy("text_output")[0].decode() == http["text_output"]
