"""Standard gRPC clients against the server's KServe v2 / Triton gRPC front, unchanged:
tritonclient.grpc passes the checks tritonclient.http passes (test_oip_client.py) and gets
HTTP's answers; grpcio-health-checking's client probes it. One process serves both (the
server process's own `build_server`, gRPC on a free port); tritonclient's own message
registrations live in the same process as the server's."""

from __future__ import annotations

import contextlib
import json
import queue
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import numpy as np
import pytest
from grpc_support import Running, serve_with_grpc
from prometheus_client.parser import text_string_to_metric_families
from service_fakes import settings

from seqserve.service.server.app import create_app

grpcclient = pytest.importorskip("tritonclient.grpc")
httpclient = pytest.importorskip("tritonclient.http")
health_pb2 = pytest.importorskip("grpc_health.v1.health_pb2")
health_pb2_grpc = pytest.importorskip("grpc_health.v1.health_pb2_grpc")
from tritonclient.utils import InferenceServerException  # noqa: E402

MODEL = "tiny-clf"
TEXTS = ["one two three", "vingt et un", "cent"]


@pytest.fixture(scope="module")
def served(tiny_repo: Path) -> Iterator[Running]:
    with serve_with_grpc(create_app(settings(tiny_repo, grpc_port=0))) as running:
        yield running


def text_input(module: Any, texts: list[str]) -> Any:
    inp = module.InferInput("text", [len(texts)], "BYTES")
    inp.set_data_from_numpy(np.array(texts, dtype=object))
    return inp


def test_tritonclient_grpc_infer_answers_as_http(served: Running, tiny_repo: Path) -> None:
    names = json.loads((tiny_repo / MODEL / "1" / "manifest.json").read_text())["labels"]
    client = grpcclient.InferenceServerClient(url=served.grpc)
    assert client.is_server_live() and client.is_server_ready()
    assert client.is_model_ready(MODEL) and client.is_model_ready(MODEL, "1")
    assert not client.is_model_ready("nope") and not client.is_model_ready(MODEL, "7")
    meta = client.get_model_metadata(MODEL, as_json=True)
    assert meta["inputs"] == [{"name": "text", "datatype": "BYTES", "shape": ["-1"]}]
    assert meta["platform"] == "seqserve_classifier" and meta["versions"] == ["1"]
    assert client.get_server_metadata().name == "seqserve"
    result = client.infer(MODEL, [text_input(grpcclient, TEXTS)], request_id="abc")
    probs, labels = result.as_numpy("probabilities"), result.as_numpy("label")
    assert probs.shape == (3, len(names)) and probs.dtype == np.float32
    assert [x.decode() for x in labels] == [names[i] for i in probs.argmax(1)]
    assert result.get_response().id == "abc"
    assert result.get_response().model_version == "1"
    http = httpclient.InferenceServerClient(url=served.url.removeprefix("http://"))
    over_http = http.infer(MODEL, [text_input(httpclient, TEXTS)])
    assert np.array_equal(over_http.as_numpy("probabilities"), probs)
    only = client.infer(MODEL, [text_input(grpcclient, TEXTS[:1])],
                        outputs=[grpcclient.InferRequestedOutput("label")])
    assert [o.name for o in only.get_response().outputs] == ["label"]
    packed = client.infer(MODEL, [text_input(grpcclient, TEXTS)], compression_algorithm="gzip")
    assert np.array_equal(packed.as_numpy("probabilities"), probs)


def test_typed_contents_are_answered_in_kind(served: Running) -> None:
    """KServe's clients may send typed `contents` instead of raw bytes: the answer comes
    back typed too, with the same values."""
    from tritonclient.grpc import service_pb2, service_pb2_grpc

    request = service_pb2.ModelInferRequest(model_name=MODEL, id="t")
    inp = request.inputs.add(name="text", datatype="BYTES", shape=[2])
    inp.contents.bytes_contents.extend([t.encode() for t in TEXTS[:2]])
    with grpc.insecure_channel(served.grpc) as channel:
        answer = service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request)
    assert not answer.raw_output_contents and answer.id == "t"
    outputs = {o.name: o for o in answer.outputs}
    raw = grpcclient.InferenceServerClient(url=served.grpc).infer(
        MODEL, [text_input(grpcclient, TEXTS[:2])])
    assert np.array_equal(np.array(outputs["probabilities"].contents.fp32_contents,
                                   np.float32).reshape(2, -1), raw.as_numpy("probabilities"))
    assert list(outputs["label"].contents.bytes_contents) == list(raw.as_numpy("label"))


def status_of(call: Any) -> grpc.StatusCode:
    with pytest.raises(InferenceServerException) as caught:
        call()
    return caught.value.status()


def test_errors_are_grpc_status_codes(served: Running) -> None:
    client = grpcclient.InferenceServerClient(url=served.grpc)
    wrong = grpcclient.InferInput("wrong", [1], "BYTES")
    wrong.set_data_from_numpy(np.array(["a"], dtype=object))
    with pytest.raises(InferenceServerException, match="text") as caught:
        client.infer(MODEL, [wrong])
    assert caught.value.status() == "StatusCode.INVALID_ARGUMENT"
    empty = text_input(grpcclient, [""])
    assert status_of(lambda: client.infer(MODEL, [empty])) == "StatusCode.INVALID_ARGUMENT"
    bad_shape = text_input(grpcclient, ["a"])
    bad_shape.set_shape([2])  # one element sent for two
    assert status_of(lambda: client.infer(MODEL, [bad_shape])) == \
        "StatusCode.INVALID_ARGUMENT"
    ok = text_input(grpcclient, ["cent"])
    assert status_of(lambda: client.infer("nope", [ok])) == "StatusCode.NOT_FOUND"
    assert status_of(lambda: client.get_model_metadata("nope")) == "StatusCode.NOT_FOUND"
    assert status_of(lambda: client.infer(MODEL, [ok], parameters={"beam": 3})) == \
        "StatusCode.INVALID_ARGUMENT"
    big = text_input(grpcclient, ["a " * 600_000])  # over max_body_bytes (1 MiB)
    assert status_of(lambda: client.infer(MODEL, [big])) == "StatusCode.RESOURCE_EXHAUSTED"
    assert status_of(lambda: client.get_model_config("nope")) == "StatusCode.NOT_FOUND"
    assert status_of(lambda: client.get_inference_statistics("nope")) == \
        "StatusCode.NOT_FOUND"


def samples(url: str, name: str) -> dict[tuple[str, str, str], float]:
    out: dict[tuple[str, str, str], float] = {}
    for family in text_string_to_metric_families(httpx.get(f"{url}/metrics", timeout=10).text):
        for s in family.samples:
            if s.name == name:
                key = (s.labels.get("model", ""), s.labels.get("endpoint", ""),
                       s.labels.get("status", ""))
                out[key] = out.get(key, 0.0) + s.value
    return out


def test_requests_are_counted_like_http(served: Running) -> None:
    before = samples(served.url, "seqserve_requests_total")
    client = grpcclient.InferenceServerClient(url=served.grpc)
    client.infer(MODEL, [text_input(grpcclient, ["cent"])])
    status_of(lambda: client.infer(MODEL, [text_input(grpcclient, [""])]))
    client.is_server_ready()
    after = samples(served.url, "seqserve_requests_total")

    def grew(key: tuple[str, str, str]) -> float:
        return after.get(key, 0.0) - before.get(key, 0.0)

    assert grew((MODEL, "grpc_infer", "200")) == 1
    assert grew((MODEL, "grpc_infer", "400")) == 1
    assert not any(k[1] == "grpc_server_ready" for k in after)  # probes are not traffic


def test_health_check_and_watch(served: Running) -> None:
    with grpc.insecure_channel(served.grpc) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        serving = health_pb2.HealthCheckResponse.SERVING
        assert stub.Check(health_pb2.HealthCheckRequest()).status == serving
        assert stub.Check(health_pb2.HealthCheckRequest(service="live")).status == serving
        with pytest.raises(grpc.RpcError) as caught:
            stub.Check(health_pb2.HealthCheckRequest(service="nope"))
        assert caught.value.code() == grpc.StatusCode.NOT_FOUND
        watch = stub.Watch(health_pb2.HealthCheckRequest(), timeout=5)
        assert next(watch).status == serving
        watch.cancel()


@pytest.fixture(scope="module")
def keyed(tiny_repo: Path) -> Iterator[Running]:
    app = create_app(settings(tiny_repo, grpc_port=0, api_key="k-123"))
    with serve_with_grpc(app) as running:
        yield running


def test_api_key_required_when_keys_are_on(keyed: Running) -> None:
    client = grpcclient.InferenceServerClient(url=keyed.grpc)
    inp = text_input(grpcclient, ["cent"])
    assert status_of(lambda: client.infer(MODEL, [inp])) == "StatusCode.UNAUTHENTICATED"
    wrong = {"authorization": "Bearer nope"}
    assert status_of(lambda: client.infer(MODEL, [inp], headers=wrong)) == \
        "StatusCode.UNAUTHENTICATED"
    assert status_of(lambda: client.get_model_metadata(MODEL)) == "StatusCode.UNAUTHENTICATED"
    good = {"authorization": "Bearer k-123"}
    assert client.infer(MODEL, [inp], headers=good).as_numpy("label").shape == (1,)
    assert client.is_server_live() and client.is_server_ready()  # health stays open
    with grpc.insecure_channel(keyed.grpc) as channel:
        answer = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest())
        assert answer.status == health_pb2.HealthCheckResponse.SERVING
    got: queue.Queue[Any] = queue.Queue()
    client.start_stream(lambda result, error: got.put((result, error)))
    with contextlib.suppress(InferenceServerException):  # the stream may be over already
        client.async_stream_infer(MODEL, [inp])
    result, error = got.get(timeout=10)  # refused at its start
    assert result is None and "UNAUTHENTICATED" in str(error.status())
    client.stop_stream()
    client.start_stream(lambda result, error: got.put((result, error)), headers=good)
    client.async_stream_infer(MODEL, [inp])
    result, error = got.get(timeout=10)
    assert error is None and result.as_numpy("label").shape == (1,)
    client.stop_stream()
