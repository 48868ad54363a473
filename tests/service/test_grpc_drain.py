"""The gRPC front's share of the lifecycle with a slow fake runtime: the client's gRPC deadline
is the request's (DEADLINE_EXCEEDED, counted 504, its work dropped); `max_in_flight` counts
HTTP and gRPC together; SIGTERM's drain (the server process's own `handle_exit`): not ready
and NOT_SERVING through the shutdown delay, then no new RPC, the one in flight finishes, and
an idle open stream and a health Watch end at once (they do not hold the drain budget)."""

from __future__ import annotations

import signal
import threading
import time
from pathlib import Path
from typing import Any

import grpc
import httpx
import numpy as np
import pytest
from grpc_support import serve_with_grpc
from service_fakes import FakeRuntime, fake_factory

from seqserve.service.server.app import create_app
from seqserve.service.web.settings import Settings

grpcclient = pytest.importorskip("tritonclient.grpc")
health_pb2 = pytest.importorskip("grpc_health.v1.health_pb2")
health_pb2_grpc = pytest.importorskip("grpc_health.v1.health_pb2_grpc")
from tritonclient.utils import InferenceServerException  # noqa: E402

MODEL = "tiny-clf"


def _app(tiny_repo: Path, runtime: FakeRuntime, **settings: Any) -> Any:
    return create_app(Settings(repo=tiny_repo, warmup=False, grpc_port=0, max_wait_ms=0,
                               max_queue_wait_s=30, **settings), fake_factory(runtime))


def _text(texts: list[str]) -> Any:
    inp = grpcclient.InferInput("text", [len(texts)], "BYTES")
    inp.set_data_from_numpy(np.array(texts, dtype=object))
    return inp


def _in_background(call: Any) -> tuple[threading.Thread, dict[str, Any]]:
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            out["result"] = call()
        except Exception as exc:
            out["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, out


def _wait_for(condition: Any, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.01)


def test_grpc_deadline_and_shared_in_flight_limit(tiny_repo: Path) -> None:
    runtime = FakeRuntime(delay_s=0.5)
    app = _app(tiny_repo, runtime, max_batch_size=1, max_in_flight=1)
    state = app.state.seqserve
    with serve_with_grpc(app) as running:
        client = grpcclient.InferenceServerClient(url=running.grpc)
        with pytest.raises(InferenceServerException) as caught:
            client.infer(MODEL, [_text(["one"])], client_timeout=0.15)
        assert caught.value.status() == "StatusCode.DEADLINE_EXCEEDED"
        _wait_for(lambda: state.admitted == 0)
        time.sleep(0.5)  # the batch that was computing ends; nothing else was queued
        assert len(runtime.calls) == 1
        thread, out = _in_background(lambda: client.infer(MODEL, [_text(["two"])]))
        _wait_for(lambda: state.admitted == 1)
        with pytest.raises(InferenceServerException, match="max_in_flight") as caught:
            client.infer(MODEL, [_text(["three"])])
        assert caught.value.status() == "StatusCode.RESOURCE_EXHAUSTED"
        http = httpx.post(f"{running.url}/v2/models/{MODEL}/infer", timeout=10, json={
            "inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": ["x"]}]})
        assert http.status_code == 429  # the one slot is the gRPC call's
        thread.join(10)
        assert "result" in out
        text = httpx.get(f"{running.url}/metrics", timeout=10).text
    assert 'seqserve_requests_total{endpoint="grpc_infer",model="tiny-clf",status="504"}' \
        in text
    assert 'seqserve_requests_total{endpoint="grpc_infer",model="tiny-clf",status="429"}' \
        in text
    assert 'seqserve_in_flight_requests{model="tiny-clf"} 0.0' in text


def test_sigterm_drains_grpc_with_http(tiny_repo: Path) -> None:
    runtime = FakeRuntime(delay_s=1.2)
    app = _app(tiny_repo, runtime, shutdown_delay_s=0.6, drain_timeout_s=10)
    state = app.state.seqserve
    with serve_with_grpc(app) as running:
        client = grpcclient.InferenceServerClient(url=running.grpc)
        streamed = grpcclient.InferenceServerClient(url=running.grpc)
        got: list[Any] = []
        streamed.start_stream(lambda result, error: got.append((result, error)))
        channel = grpc.insecure_channel(running.grpc)
        watch = health_pb2_grpc.HealthStub(channel).Watch(health_pb2.HealthCheckRequest())
        assert next(watch).status == health_pb2.HealthCheckResponse.SERVING
        thread, out = _in_background(lambda: client.infer(MODEL, [_text(["one"])]))
        _wait_for(lambda: state.admitted == 1)
        running.server.handle_exit(signal.SIGTERM, None)  # what the signal handler calls
        assert next(watch).status == health_pb2.HealthCheckResponse.NOT_SERVING
        assert not client.is_server_ready() and client.is_server_live()  # the delay: serving
        with grpc.insecure_channel(running.grpc) as channel:
            health = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest())
        assert health.status == health_pb2.HealthCheckResponse.NOT_SERVING
        _wait_for(lambda: running.server.should_exit)
        _wait_for(lambda: running.server.grpc is not None
                  and running.server.grpc.service.closing.is_set())
        stopping = time.monotonic()
        assert list(watch) == []  # ended (after its NOT_SERVING) when the server stopped
        with pytest.raises(InferenceServerException) as caught:  # no new RPC
            grpcclient.InferenceServerClient(url=running.grpc).is_server_live(
                client_timeout=2)
        assert caught.value.status() in ("StatusCode.UNAVAILABLE",
                                         "StatusCode.DEADLINE_EXCEEDED")
        thread.join(15)
        running.thread.join(15)
        assert time.monotonic() - stopping < 5  # not the 10 s drain budget: nothing held it
        streamed.stop_stream()
        channel.close()
    assert "result" in out, out  # the call in flight when it stopped listening finished
    assert out["result"].as_numpy("label").shape == (1,)
    assert all(error is None for _, error in got)  # the idle stream ended without an error
