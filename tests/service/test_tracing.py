"""OpenTelemetry spans (`--otel-endpoint`, web/tracing.py) exported over OTLP/HTTP to a local
receiver: a request's span continues the client's trace under its parent, carries the span id
the answer's `traceparent` names, its route, status, model and request id, and has queue and
compute children; a refusal answered from the head gets its span too; a new trace the server
starts is sampled; a parent that is not sampled records nothing; off, nothing is exported."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from server_support import serve_app
from service_fakes import settings

from seqserve.service.server.app import create_app

pb = pytest.importorskip("opentelemetry.proto.collector.trace.v1.trace_service_pb2")

URL = "/v1/models/tiny-clf/classify"
TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT = "00f067aa0ba902b7"


@pytest.fixture()
def receiver() -> Iterator[tuple[str, list[Any]]]:
    """An OTLP/HTTP traces endpoint on 127.0.0.1 that keeps every span it is sent."""
    spans: list[Any] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 (http.server's name)
            body = self.rfile.read(int(self.headers["content-length"]))
            request = pb.ExportTraceServiceRequest.FromString(body)
            for resource in request.resource_spans:
                for scope in resource.scope_spans:
                    spans.extend(scope.spans)
            self.send_response(200)
            self.send_header("content-type", "application/x-protobuf")
            self.send_header("content-length", "0")
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1/traces", spans
    finally:
        server.shutdown()


def _attrs(span: Any) -> dict[str, Any]:
    out = {}
    for kv in span.attributes:
        value = kv.value
        out[kv.key] = value.string_value if value.HasField("string_value") else \
            value.double_value if value.HasField("double_value") else value.int_value
    return out


def test_request_spans_are_exported_with_the_answered_ids(
        tiny_repo: Path, receiver: tuple[str, list[Any]]) -> None:
    endpoint, spans = receiver
    app = create_app(settings(tiny_repo, otel_endpoint=endpoint))
    with serve_app(app) as url, httpx.Client(base_url=url, timeout=30) as client:
        continued = client.post(URL, json={"texts": ["one two"]},
                                headers={"traceparent": f"00-{TRACE}-{PARENT}-01",
                                         "x-request-id": "traced-1"})
        fresh = client.post(URL, json={"texts": ["one"]})
        unsampled = client.post(URL, json={"texts": ["one"]},
                                headers={"traceparent": f"00-{'1' * 32}-{PARENT}-00"})
        missing = client.post("/v1/models/nope/classify", json={"texts": ["one"]})
        translated = client.post("/v1/models/tiny-mt/translate",
                                 json={"texts": ["twenty one"]})
    # (the server stopped: its last spans were exported)
    assert continued.status_code == fresh.status_code == unsampled.status_code == 200
    _, trace, span_id, flags = continued.headers["traceparent"].split("-")
    assert (trace, flags) == (TRACE, "01")
    sampled = [int(r.headers["traceparent"][-2:], 16) & 1 for r in (fresh, unsampled)]
    assert sampled == [1, 0]  # a new trace is sampled (01, with W3C's random bit: 03)
    by_id = {s.span_id.hex(): s for s in spans}
    request = by_id[span_id]
    assert request.trace_id.hex() == TRACE and request.parent_span_id.hex() == PARENT
    assert request.name == "POST /v1/models/{name}/classify"
    attrs = _attrs(request)
    assert attrs["http.response.status_code"] == 200 and attrs["seqserve.model"] == "tiny-clf"
    assert attrs["seqserve.request_id"] == "traced-1"
    children = {s.name: s for s in spans if s.parent_span_id.hex() == span_id}
    assert set(children) == {"queue", "compute"}
    assert request.start_time_unix_nano <= children["queue"].start_time_unix_nano \
        <= children["compute"].start_time_unix_nano <= request.end_time_unix_nano
    assert _attrs(children["compute"])["seqserve.batch_rows"] >= 1  # its batch's summary
    assert translated.status_code == 200  # a translation's compute: its decode steps
    translation = translated.headers["traceparent"].split("-")[2]
    decode = next(s for s in spans if s.parent_span_id.hex() == translation
                  and s.name == "compute")
    summary = _attrs(decode)
    assert summary["seqserve.decode_steps"] >= 1 and summary["seqserve.decode_step_ms"] > 0
    assert "seqserve.batch_rows" not in summary
    fresh_span = by_id[fresh.headers["traceparent"].split("-")[2]]
    assert fresh_span.trace_id.hex() == fresh.headers["traceparent"].split("-")[1]
    assert not fresh_span.parent_span_id
    assert all(s.trace_id.hex() != "1" * 32 for s in spans)  # its parent said: not sampled
    missing_span = by_id[missing.headers["traceparent"].split("-")[2]]
    assert _attrs(missing_span)["http.response.status_code"] == 404


def test_no_endpoint_no_spans(tiny_repo: Path, receiver: tuple[str, list[Any]]) -> None:
    _, spans = receiver
    with serve_app(create_app(settings(tiny_repo))) as url:
        r = httpx.post(url + URL, json={"texts": ["one"]}, timeout=30)
    assert r.status_code == 200 and r.headers["traceparent"].endswith("-00")
    assert spans == []
