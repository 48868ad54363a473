"""The one error answer and the one JSON encoder, through real servers.

- a model whose graph yields NaN (the real ONNX runtimes of every task, their float outputs
  replaced by NaN) gets answers that a strict JSON parser accepts, v1 (an application/json
  body and one read as FastAPI reads other types) and OIP (null where the NaN was);
- every error path (FastAPI's handlers, the hot path, the middleware's refusals, API keys,
  the protocol's 408, readiness) answers the same shape: `application/json`, a correct
  Content-Length, `{"error": message, "request_id": id}` with the request's X-Request-Id
  (every 5xx included), its protocol's own headers (Retry-After, WWW-Authenticate, Allow,
  Connection: close).
"""

from __future__ import annotations

import json
import math
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from server_support import serve_app
from service_fakes import FakeRuntime, fake_factory, serve_in_thread

from seqserve.service.core.answers import (
    ErrorShape,
    encode_json,
    error_answer,
    retry_after_value,
)
from seqserve.service.core.errors import QueueFull
from seqserve.service.runtimes import load_runtime
from seqserve.service.server.app import create_app
from seqserve.service.web.http_protocol import guarded_protocol
from seqserve.service.web.responses import service_error_for
from seqserve.service.web.settings import Settings


def strict_json(body: bytes) -> Any:
    """json.loads that refuses NaN, Infinity and -Infinity (which are not JSON)."""
    def refuse(constant: str) -> Any:
        raise ValueError(f"not JSON: {constant}")

    return json.loads(body, parse_constant=refuse)


# -- the encoder and the builder, without a server ----------------------------------------

def test_the_encoder_writes_non_finite_floats_as_null_and_numpy_as_numbers() -> None:
    value = {"a": [math.nan, math.inf, -math.inf, 1.5], "b": np.float32(0.25),
             "c": np.float64("nan"), "d": np.arange(3, dtype=np.int64), 1: "one"}
    assert strict_json(encode_json(value)) == {"a": [None, None, None, 1.5], "b": 0.25,
                                               "c": None, "d": [0, 1, 2], "1": "one"}
    with pytest.raises(TypeError, match="object"):
        encode_json({"x": object()})


def test_one_builder_for_every_shape() -> None:
    status, headers, body = error_answer(429, "slow down", request_id="r1", retry_after=0.2,
                                         headers=[(b"X-Extra", b"1")])
    assert status == 429 and strict_json(body) == {"error": "slow down", "request_id": "r1"}
    assert headers == [(b"content-type", b"application/json"),
                       (b"content-length", str(len(body)).encode()),
                       (b"retry-after", b"1"), (b"x-extra", b"1")]
    oip = error_answer(400, "bad", shape=ErrorShape.OIP)[2]
    assert strict_json(oip) == {"error": "bad"}  # the protocol's own shape
    openai = strict_json(error_answer(429, "slow down", request_id="r2",
                                      shape=ErrorShape.OPENAI)[2])
    assert openai == {"error": {"message": "slow down", "type": "rate_limit_error",
                                "param": None, "code": None}, "request_id": "r2"}
    assert strict_json(error_answer(500, "x", shape=ErrorShape.OPENAI)[2])["error"]["type"] \
        == "api_error"
    assert [retry_after_value(s) for s in (0, 0.2, 1, 2.5)] == [b"0", b"1", b"1", b"3"]
    scope = {"path": "/v2/models/m/infer", "state": {"request_id": "r3"}}
    status, headers, body = service_error_for(scope, QueueFull("full", retry_after=2))
    assert status == 429 and (b"retry-after", b"2") in headers
    assert strict_json(body) == {"error": "full", "request_id": "r3"}


# -- NaN from a real model ----------------------------------------------------------------

NAN_OUTPUTS = ("logits", "log_probs", "attention")
"""The float outputs made NaN: the classifier's and tagger's scores, every attention (a
translator's NaN log-probabilities end its search at once, so its attention carries them)."""


class NaNRuntime:
    """A real runtime whose float outputs named in NAN_OUTPUTS are all NaN."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.name = inner.name
        self.providers = inner.providers

    def run(self, graph: str, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        out = self.inner.run(graph, inputs)
        return {k: np.full_like(v, np.nan) if k in NAN_OUTPUTS else v for k, v in out.items()}


def _oip(text: str) -> dict[str, Any]:
    return {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": [text]}]}


NAN_CALLS = [
    ("/v1/models/tiny-clf/classify", {"texts": ["one two"], "return_attention": True}),
    ("/v1/models/tiny-tag/tag", {"texts": ["one two"]}),
    ("/v1/models/tiny-mt/translate", {"texts": ["one two"], "return_attention": True,
                                      "beam_size": 1}),
    ("/v2/models/tiny-clf/infer", _oip("one two")),
    ("/v2/models/tiny-tag/infer", _oip("one two")),
    ("/v2/models/tiny-mt/infer", _oip("one two")),
]


def _nulls(value: Any) -> int:
    """How many nulls `value` holds (OIP tags elements are JSON text themselves)."""
    if value is None:
        return 1
    if isinstance(value, dict):
        return sum(_nulls(v) for v in value.values())
    if isinstance(value, list):
        return sum(_nulls(v) for v in value)
    if isinstance(value, str) and value.startswith("[{"):
        return _nulls(strict_json(value.encode()))
    return 0


def test_a_model_that_outputs_nan_gets_valid_json_answers(tiny_full_repo: Path) -> None:
    settings = Settings(repo=tiny_full_repo, warmup=False, intra_op_threads=1)
    app = create_app(settings, lambda spec, path, manifest: NaNRuntime(
        load_runtime(spec, path, manifest)))
    with serve_in_thread(app) as base, httpx.Client(base_url=base, timeout=60) as c:
        for path, body in NAN_CALLS:
            # application/json: pydantic's JSON parser; a +json type: read as FastAPI reads it
            for kind in ("application/json", "application/vnd.seqserve+json"):
                if kind != "application/json" and path.startswith("/v2"):
                    continue  # OIP infer reads any body itself
                r = c.post(path, content=json.dumps(body), headers={"content-type": kind})
                assert r.status_code == 200, (path, kind, r.status_code, r.text[:300])
                assert r.headers["content-type"] == "application/json"
                doc = strict_json(r.content)  # also parses the OIP tags elements
                if "translate" in path or "tiny-mt" in path:
                    continue  # its NaN ends the search: valid, but maybe nothing to null
                assert _nulls(doc) > 0, (path, kind, r.text[:300])
        attention = c.post(NAN_CALLS[2][0], json=NAN_CALLS[2][1]).json()
        assert _nulls(attention["results"][0]["attention"]["weights"]) > 0


# -- every error path, one shape ----------------------------------------------------------

class GatedRuntime(FakeRuntime):
    """FakeRuntime that, while `hold` is set, waits in `run` until `release` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.hold = False
        self.entered = threading.Event()
        self.release = threading.Event()

    def run(self, graph: str, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        if self.hold:
            self.entered.set()
            self.release.wait(30)
        return super().run(graph, inputs)


KEY = "sesame"
AUTH = {"authorization": f"Bearer {KEY}"}
CLASSIFY = "/v1/models/tiny-clf/classify"
INFER = "/v2/models/tiny-clf/infer"


@pytest.fixture()
def guarded(tiny_repo: Path) -> Iterator[tuple[str, Any, GatedRuntime]]:
    runtime = GatedRuntime()
    settings = Settings(repo=tiny_repo, warmup=False, api_key=KEY, max_in_flight=1,
                        max_body_bytes=2000, body_timeout_s=1.0, retry_after_s=3)
    app = create_app(settings, fake_factory(runtime))
    with serve_app(app, http=guarded_protocol(1.0)) as base:
        yield base, app, runtime


def _raw(base: str, payload: bytes) -> tuple[int, dict[str, str], bytes]:
    """Send raw bytes, read until the server closes: (status, headers, body)."""
    host, port = base.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=20) as sock:
        sock.sendall(payload)
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (x.partition(":") for x in lines)}
    return int(status_line.split()[1]), headers, body


def _check(case: str, status: int, headers: dict[str, str], body: bytes, expected: int,
           rid: str | None, extra: tuple[str, ...] = ()) -> dict[str, Any]:
    """The one shape: status, JSON type and length, {"error", "request_id"} (+ `extra`)."""
    assert status == expected, (case, status, body[:300])
    assert headers["content-type"] == "application/json", (case, headers)
    assert int(headers["content-length"]) == len(body), case
    doc = strict_json(body)
    assert isinstance(doc.get("error"), str) and doc["error"], (case, doc)
    keys = {"error", *extra} | ({"request_id"} if rid else set())
    assert set(doc) == keys, (case, doc)
    if rid is not None:
        assert headers["x-request-id"] == rid and doc["request_id"] == rid, (case, doc)
    return dict(doc)


def test_every_error_path_answers_the_same_shape(
        guarded: tuple[str, Any, GatedRuntime]) -> None:
    base, app, runtime = guarded
    state = app.state.seqserve
    n = 0

    def ask(method: str, path: str, expected: int, body: Any = None,
            headers: dict[str, str] | None = None, auth: bool = True,
            extra: tuple[str, ...] = ()) -> httpx.Response:
        nonlocal n
        n += 1
        rid = f"case-{n}"
        head = {"x-request-id": rid, **(AUTH if auth else {}), **(headers or {})}
        content = body if isinstance(body, bytes) else None if body is None else json.dumps(body)
        if content is not None:
            head.setdefault("content-type", "application/json")
        r = httpx.request(method, base + path, content=content, headers=head, timeout=30)
        _check(f"{method} {path}", r.status_code, dict(r.headers), r.content, expected, rid,
               extra)
        return r

    good = {"texts": ["one two"]}
    # 400: the hot path (v1, OIP), also for a +json body (read as FastAPI reads one)
    plus_json = {"content-type": "application/vnd.x+json"}
    ask("POST", CLASSIFY, 400, good, {"x-request-timeout": "soon"})
    ask("POST", INFER, 400, {"inputs": [{"name": "txt", "datatype": "BYTES", "shape": [1],
                                         "data": ["one"]}]})
    ask("POST", CLASSIFY, 400, good, {"x-request-timeout": "soon", **plus_json})
    # 401: API keys, missing and wrong
    r = ask("POST", CLASSIFY, 401, good, auth=False)
    assert r.headers["www-authenticate"].startswith("Bearer")
    ask("GET", "/v2/models/tiny-clf", 401, headers={"authorization": "Bearer nope"},
        auth=False)
    # 404: an unknown route, an unknown model (FastAPI and the hot path)
    ask("GET", "/nowhere", 404)
    ask("GET", "/v2/models/nope", 404)
    ask("POST", "/v1/models/nope/classify", 404, good)
    # 405
    r = ask("GET", CLASSIFY, 405)
    assert "POST" in r.headers["allow"]
    # 413 (the middleware) and 422 (validation: JSON parser, FastAPI's reading of a +json)
    ask("POST", CLASSIFY, 413, {"texts": ["x" * 3000]})
    ask("POST", CLASSIFY, 422, {"texts": []})
    ask("POST", CLASSIFY, 422, {"texts": []}, plus_json)
    ask("POST", CLASSIFY, 422, b'{"texts": [', plus_json)
    # 408: a body that stalls (the middleware, a request id) ...
    status, headers, body = _raw(base, (
        f"POST {CLASSIFY} HTTP/1.1\r\nhost: x\r\nx-request-id: stall\r\n"
        f"authorization: Bearer {KEY}\r\ncontent-type: application/json\r\n"
        "content-length: 100\r\n\r\n{\"texts\":").encode())
    _check("stalled body", status, headers, body, 408, "stall")
    assert headers["connection"] == "close"
    # ... and headers that never end (the protocol: no request yet, so no request id)
    status, headers, body = _raw(base, f"POST {CLASSIFY} HTTP/1.1\r\nhost: x\r\nconte".encode())
    _check("slow headers", status, headers, body, 408, None)
    assert headers["connection"] == "close" and "x-request-id" not in headers
    # 429: beyond max_in_flight (one request held in the runtime)
    runtime.hold = True
    held = threading.Thread(target=httpx.post, args=(base + CLASSIFY,),
                            kwargs={"json": good, "headers": AUTH, "timeout": 30})
    held.start()
    try:
        assert runtime.entered.wait(30)
        r = ask("POST", CLASSIFY, 429, good)
        assert r.headers["retry-after"] == "3"
    finally:
        runtime.release.set()
        held.join(30)
    runtime.hold = False
    # 500: a runtime fault (a domain error), then bugs: FastAPI's handler, the hot path, and
    # one in the request lifecycle (answered by it): each carries its request id
    runtime.fail_next = 1
    assert "inference failed" in ask("POST", CLASSIFY, 500, good).json()["error"]

    def boom(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("injected bug")

    state.repository.ready = boom
    try:
        assert "server bug" in ask("GET", "/v2/models/tiny-clf", 500).json()["error"]
        ask("POST", INFER, 500, {"inputs": [{"name": "text", "datatype": "BYTES",
                                             "shape": [1], "data": ["one"]}]})
    finally:
        del state.repository.ready
    lifecycle = app.entry
    lifecycle._head = boom
    try:
        ask("POST", CLASSIFY, 500, good)
    finally:
        del lifecycle._head
    assert httpx.post(base + CLASSIFY, json=good, headers=AUTH, timeout=30).status_code == 200
    # 503: a model version not ready (the hot path, both readiness answers) ...
    translator = state.repository.entry("tiny-mt")
    translator.state = "failed"
    try:
        ask("POST", "/v1/models/tiny-mt/translate", 503, good)
        assert ask("GET", "/v2/health/ready", 503, extra=("ready",)).json()["ready"] is False
        ready = ask("GET", "/v2/models/tiny-mt/ready", 503, extra=("ready", "name", "version"))
        assert ready.json()["ready"] is False and ready.json()["name"] == "tiny-mt"
    finally:
        translator.state = "ready"
    # ... and draining: readiness says so (new work is still served, closing its connection)
    state.begin_drain()
    assert ask("GET", "/v2/health/ready", 503, extra=("ready",)).json()["ready"] is False
    r = httpx.post(base + CLASSIFY, json=good, headers=AUTH, timeout=30)
    assert r.status_code == 200 and r.headers["connection"] == "close"
