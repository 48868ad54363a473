"""Request ids, the access log and tracebacks, on a real server: one line per request with
its route, model, status and timings; the client's X-Request-Id or a new one comes back; a 4xx
is one line without a traceback; a server bug is one short traceback, not uvicorn's copy too."""

from __future__ import annotations

import json
import logging
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from server_support import serve_app
from service_fakes import free_port, settings

from seqserve.service.core.logs import TRACEBACK_FRAMES, JsonFormatter, TextFormatter
from seqserve.service.server.app import create_app
from seqserve.service.web.access_log import request_id
from seqserve.service.workers.classifier import ClassifierWorker

URL = "/v1/models/tiny-clf/classify"
ROOT = Path(__file__).resolve().parents[2]


def _access(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "seqserve.access"]


def test_one_line_per_request_with_its_id(tiny_repo: Path,
                                          caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="seqserve.access")
    with serve_app(create_app(settings(tiny_repo))) as url, \
            httpx.Client(base_url=url, timeout=30) as client:
        ok = client.post(URL, json={"texts": ["one two"]}, headers={"x-request-id": "abc-123"})
        bad = client.post(URL, json={"texts": [""]})
        odd = client.get("/v2/health/ready", headers={"x-request-id": "no spaces, please"})
    assert ok.headers["x-request-id"] == "abc-123"
    assert len(bad.headers["x-request-id"]) == 32
    assert odd.headers["x-request-id"] not in ("", "no spaces, please")
    lines = _access(caplog)
    assert len(lines) == 3 and not any(r.exc_info for r in caplog.records)
    first, second, third = (r.fields for r in lines)  # type: ignore[attr-defined]
    assert first["method"] == "POST" and first["route"] == "/v1/models/{name}/classify"
    assert (first["model"], first["status"], first["request_id"]) == ("tiny-clf", 200,
                                                                      "abc-123")
    assert first["compute_ms"] > 0 and first["total_ms"] >= first["compute_ms"]
    assert (second["status"], second["request_id"]) == (400, bad.headers["x-request-id"])
    assert third["route"] == "/v2/health/ready" and third["model"] == ""


def test_trace_context_is_continued_answered_and_logged(
        tiny_repo: Path, caplog: pytest.LogCaptureFixture) -> None:
    """W3C trace context: a valid `traceparent` is continued (same trace, a new span of this
    server's, the same flags), a missing or invalid one starts a new unsampled trace; the
    answer's `traceparent` names the span and the access line the trace id."""
    caplog.set_level(logging.INFO, logger="seqserve.access")
    trace = "4bf92f3577b34da6a3ce929d0e0e4736"
    parent = f"00-{trace}-00f067aa0ba902b7-01"
    with serve_app(create_app(settings(tiny_repo))) as url, \
            httpx.Client(base_url=url, timeout=30) as client:
        continued = client.post(URL, json={"texts": ["one"]}, headers={"traceparent": parent})
        fresh = client.post(URL, json={"texts": ["one"]})
        zeros = client.get("/v2/health/live", headers={
            "traceparent": "00-" + "0" * 32 + "-00f067aa0ba902b7-01"})
        refused = client.post(URL, json={"texts": 5}, headers={"traceparent": parent})
    shape = re.compile(r"00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})")
    got = [shape.fullmatch(r.headers["traceparent"]) for r in (continued, fresh, zeros, refused)]
    assert all(got), [r.headers.get("traceparent") for r in (continued, fresh, zeros, refused)]
    first, second, third, fourth = (m.groups() for m in got if m)
    assert first[0] == trace and first[1] != "00f067aa0ba902b7" and first[2] == "01"
    assert second[0] != trace and second[2] == "00" and third[0] != "0" * 32
    assert fourth[0] == trace and refused.status_code == 422 and fourth[1] != first[1]
    lines = [r.fields for r in _access(caplog)]  # type: ignore[attr-defined]
    assert [f["trace_id"] for f in lines] == [first[0], second[0], third[0], fourth[0]]


def test_a_server_bug_logs_one_short_traceback(tiny_repo: Path, caplog: pytest.LogCaptureFixture,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(self: Any, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("a bug in the worker")

    monkeypatch.setattr(ClassifierWorker, "begin_classify", broken)
    uvicorn_records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            uvicorn_records.append(record)

    caplog.set_level(logging.INFO)
    keep = Keep()
    with serve_app(create_app(settings(tiny_repo, access_log=False)), log_level="info") as url:
        logging.getLogger("uvicorn.error").addHandler(keep)
        try:
            for _ in range(3):
                r = httpx.post(url + URL, json={"texts": ["one"]}, timeout=30)
                assert r.status_code == 500 and "server bug" in r.json()["error"]
                assert r.headers["x-request-id"]
        finally:
            logging.getLogger("uvicorn.error").removeHandler(keep)
    bugs = [r for r in caplog.records if r.exc_info]
    assert len(bugs) == 3 and all(r.name == "seqserve.access" for r in bugs)
    assert not [r for r in uvicorn_records if r.exc_info]  # not logged a second time
    text = TextFormatter().format(bugs[0])
    assert "RuntimeError: a bug in the worker" in text and "status=500" in text
    assert text.count('File "') <= TRACEBACK_FRAMES and len(text) < 4000


def test_json_lines() -> None:
    record = logging.LogRecord("seqserve.access", logging.INFO, __file__, 1, "GET %s %d",
                               ("/metrics", 200), None)
    record.fields = {"status": 200, "request_id": "r1", "model": ""}
    doc = json.loads(JsonFormatter().format(record))
    assert doc["message"] == "GET /metrics 200" and doc["level"] == "info"
    assert doc["status"] == 200 and doc["request_id"] == "r1" and doc["time"].endswith("Z")
    text = TextFormatter().format(record)
    assert text.endswith('GET /metrics 200 status=200 request_id=r1 model=""')


def test_request_ids_are_tokens() -> None:
    def scope(value: bytes) -> dict[str, Any]:
        return {"headers": [(b"x-request-id", value)]}

    assert request_id(scope(b"a.b:c/d-1_2")) == "a.b:c/d-1_2"
    for bad in (b"", b"x" * 129, b"a b", b"a\x00", "é".encode()):
        assert request_id(scope(bad)) != bad.decode("utf-8", "replace")
    assert request_id({"headers": []}) != request_id({"headers": []})


def test_serve_writes_json_lines(tiny_repo: Path) -> None:
    """`seqserve serve --log-format json`: every line on stderr is JSON, uvicorn's too."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "seqserve.cli", "serve", "--repo", str(tiny_repo), "--port",
         str(port), "--grpc-port", "0", "--no-warmup", "--log-format", "json",
         "--intra-op-threads", "1"],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None and time.monotonic() < deadline, "server did not start"
            try:
                if httpx.get(base + "/v2/health/ready", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.1)
        r = httpx.post(base + URL, json={"texts": ["one"]}, headers={"x-request-id": "j-1"})
        assert r.status_code == 200
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=60)
    lines = [json.loads(line) for line in err.decode().splitlines() if line.strip()]
    access = [d for d in lines if d.get("request_id") == "j-1"]
    assert len(access) == 1 and access[0]["route"] == "/v1/models/{name}/classify"
    assert any(d["logger"].startswith("uvicorn") for d in lines)


@pytest.mark.parametrize("api_workers", ["0", "1"])
def test_serve_logs_one_access_line_per_request(tiny_repo: Path, api_workers: str) -> None:
    """`seqserve serve` at its default level and format, one process or API processes in
    front of the engine: one classify request is one access line (seqserve.access), and
    uvicorn's access logger writes nothing."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "seqserve.cli", "serve", "--repo", str(tiny_repo), "--port",
         str(port), "--grpc-port", "0", "--no-warmup", "--intra-op-threads", "1",
         "--api-workers", api_workers],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 90
        while True:
            assert proc.poll() is None and time.monotonic() < deadline, "server did not start"
            try:
                if httpx.get(base + "/v2/health/ready", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.1)
        r = httpx.post(base + URL, json={"texts": ["one"]}, headers={"x-request-id": "once-1"})
        assert r.status_code == 200
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=60)
    lines = err.decode().splitlines()
    assert proc.returncode == 0, "\n".join(lines[-30:])
    loggers = [m.group(1) for line in lines if (m := re.match(r"\S+ \S+ [A-Z]+ (\S+): ", line))]
    assert loggers and "seqserve.access" in loggers, "\n".join(lines[-30:])
    assert "uvicorn.access" not in loggers, "\n".join(lines[-30:])
    about_it = [line for line in lines if "classify" in line or "once-1" in line]
    assert len(about_it) == 1, about_it
    assert " seqserve.access: POST /v1/models/{name}/classify 200 " in about_it[0]
    assert "request_id=once-1" in about_it[0]


def test_new_ids_are_version_4_uuids() -> None:
    import uuid

    from seqserve.service.web.access_log import new_id

    ids = {new_id() for _ in range(2000)}
    assert len(ids) == 2000
    for value in list(ids)[:200]:
        parsed = uuid.UUID(hex=value)
        assert (len(value), parsed.version, parsed.variant) == (32, 4, uuid.RFC_4122)


def test_refusal_lines_are_bounded_and_say_how_many_were_left_out() -> None:
    from seqserve.service.web.access_log import RefusalLines

    lines = RefusalLines(per_s=3)
    got = [lines.admit(100.0 + i / 100) for i in range(10)]  # ten refusals in one second
    assert got == [0, 0, 0] + [None] * 7
    assert lines.admit(101.2) == 7  # the next second's first line tells of the seven
    assert lines.admit(101.3) == 0


def test_refusals_logged_at_most_ten_a_second_others_always(
        caplog: pytest.LogCaptureFixture) -> None:
    """The access log of a refusal flood: at most 10 lines a second of 429s (the rest only
    counted, then told by the next logged one), every other answer logged."""
    from seqserve.service.web.access_log import AccessLog

    def flood() -> float:
        lines = AccessLog()
        start = time.monotonic()
        for i in range(300):
            path = "/ok" if i % 100 == 0 else "/v1/models/m/classify"
            scope = {"type": "http", "method": "POST", "path": path, "headers": []}
            lines.line(scope, f"r{i}", 200 if path == "/ok" else 429, time.monotonic())
        time.sleep(max(0.0, 1.05 - (time.monotonic() - start) % 1))  # a new second
        scope = {"type": "http", "method": "POST", "path": "/x", "headers": []}
        lines.line(scope, "last", 429, time.monotonic())
        return time.monotonic() - start

    caplog.set_level(logging.INFO, logger="seqserve.access")
    seconds = flood()
    lines = _access(caplog)
    oks = [r for r in lines if r.fields["status"] == 200]  # type: ignore[attr-defined]
    refusals = [r for r in lines if r.fields["status"] == 429]  # type: ignore[attr-defined]
    assert len(oks) == 3
    assert 10 <= len(refusals) <= 10 * (int(seconds) + 2), len(refusals)
    told = sum(r.fields.get("refusals_not_logged", 0) for r in refusals)  # type: ignore[attr-defined]
    assert len(refusals) + told == 298, (len(refusals), told)
    assert "more refusals not logged" in refusals[-1].getMessage()


class _Writes:
    """A stream that records each write."""

    def __init__(self) -> None:
        self.writes: list[str] = []

    def write(self, text: str) -> None:
        self.writes.append(text)

    def flush(self) -> None:
        pass


def _record(message: str, level: int = logging.INFO) -> logging.LogRecord:
    return logging.LogRecord("seqserve.access", level, __file__, 1, message, (), None)


def test_the_handler_writes_a_loop_turns_lines_in_one_write_in_order() -> None:
    import asyncio

    from seqserve.service.core.logs import TurnHandler

    stream = _Writes()
    handler = TurnHandler(stream)
    handler.setFormatter(logging.Formatter("%(message)s"))
    handler.handle(_record("outside a loop"))  # no loop on this thread: at once
    assert stream.writes == ["outside a loop\n"]

    async def turns() -> list[list[str]]:
        seen = []
        for i in range(3):
            handler.handle(_record(f"line {i}"))
        seen.append(list(stream.writes))  # the turn has not ended: nothing more written
        await asyncio.sleep(0)
        seen.append(list(stream.writes))
        handler.handle(_record("a"))
        handler.handle(_record("b", logging.WARNING))  # a warning: at once, after what waits
        seen.append(list(stream.writes))
        handler.handle(_record("c"))
        handler.flush()  # logging's at exit: what waits is written
        seen.append(list(stream.writes))
        await asyncio.sleep(0)
        return seen

    first, second, third, fourth = asyncio.run(turns())
    assert first == ["outside a loop\n"]
    assert second == ["outside a loop\n", "line 0\nline 1\nline 2\n"]
    assert third[2:] == ["a\nb\n"]
    assert fourth[3:] == ["c\n"] and stream.writes == fourth  # nothing written twice
