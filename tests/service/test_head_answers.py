"""Refusals answered from the request's head (`web/http_protocol.py` `answer_head`): under
overload the protocol writes the app's 429 without running the app, and that answer is the
one the app gives (status, headers, body, metrics), on a connection that goes on serving."""

from __future__ import annotations

import json
import logging
import re
import socket
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from server_support import RawConnection
from service_fakes import CountingEntry, FakeRuntime, fake_factory, serve_in_thread, served

from seqserve.service.server.app import create_app
from seqserve.service.server.native import CALM_GAP_S
from seqserve.service.web.access_log import VALID_ID, Trace
from seqserve.service.web.front_rule import FrontRule
from seqserve.service.web.http_protocol import guarded_protocol
from seqserve.service.web.middleware import _body_kind
from seqserve.service.web.settings import Settings

MODEL = "tiny-clf"
URL = f"/v1/models/{MODEL}/classify"
BODY = b'{"texts": ["one two"]}'
JSON = {"content-type": "application/json"}


def _served(tiny_repo: Path, front: str, pace_s: float = 0.0, **settings: Any
            ) -> tuple[Any, CountingEntry, Any]:
    """The app with its head answers on `front` (each 429 written at once unless `pace_s`):
    uvicorn with our protocol, or the native front."""
    runtime = FakeRuntime()
    app = create_app(Settings(repo=tiny_repo, warmup=False, max_queue_wait_s=0.5, front=front,
                              refusal_pace_s=pace_s, **settings), fake_factory(runtime))
    entry = CountingEntry(app.entry)
    app.entry = entry
    protocol = {"http": guarded_protocol(5.0, answer_head=app.answer_head, pace_s=pace_s)} \
        if front == "uvicorn" else {}
    server = serve_in_thread(app, **protocol)
    return app, entry, server


def _overloaded(app: Any) -> Any:
    batcher = served(app, MODEL).batcher
    batcher.expected_wait = lambda: 2.0
    return batcher


def _calm(batcher: Any) -> None:
    """The model's own estimate again. Set behind the event loop's back (no loop turn runs
    the model's work), it reaches the native front's own refusals once the state the loop
    published last is too old to refuse by (`FrontRule.MAX_AGE_S`)."""
    del batcher.expected_wait
    time.sleep(FrontRule.MAX_AGE_S * 1.2)


def _count(text: str, status: str) -> float:
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "seqserve_requests_total" and sample.labels == {
                    "endpoint": "classify", "model": MODEL, "status": status}:
                return sample.value
    return 0.0


def test_a_refusal_from_the_head_is_the_apps_own_answer(
        tiny_repo: Path, http_front: str, caplog: Any) -> None:
    """40 requests to an overloaded model on one connection within a second or two: the
    first of each second go the full path (their access lines are due), the rest are answered
    from their heads; every answer the same 429 (headers but the date and timing, body),
    each counted once in the metrics and the access log's count of the lines left out; the
    connection then serves a plain request."""
    caplog.set_level(logging.INFO, logger="seqserve.access")
    app, entry, server = _served(tiny_repo, http_front)
    with server as base:
        conn = RawConnection(base)
        assert conn.request("POST", URL, BODY, JSON)[0] == 200
        batcher = _overloaded(app)
        before, heads = entry.calls, entry.heads
        answers = [conn.request("POST", URL, BODY, {**JSON, "x-request-id": "same-id"})
                   for _ in range(40)]
        full = entry.calls - before
        asked = entry.heads - heads
        time.sleep(1.05)  # a new second: the next refusal's line is due (the full path)
        answers.append(conn.request("POST", URL, BODY, {**JSON, "x-request-id": "same-id"}))
        assert entry.calls - before == full + 1
        _calm(batcher)
        assert conn.request("POST", URL, BODY, JSON)[0] == 200  # same connection
        metrics = httpx.get(base + "/metrics").text
        conn.close()
    assert 10 <= full <= 30, full  # 10 access lines a second; the rest from the head
    if http_front == "native":  # most of those written by the front itself, by the rule the
        assert asked - full <= (40 - full) // 2, (asked, full)  # loop published: never asked
    lines = [r for r in caplog.records if getattr(r, "fields", {}).get("status") == 429]
    assert len(lines) == full + 1
    assert sum(r.fields.get("refusals_not_logged", 0) for r in lines) == 40 - full
    status, headers, body = answers[0]
    assert status == 429 and float(headers["retry-after"]) >= 2
    assert b"overloaded: expected queue wait 2.000 s" in body and b"same-id" in body
    varying = {"date", "server-timing", "traceparent"}  # (each its own span)
    for other in answers[1:]:
        assert other[0] == status and other[2] == body
        assert {k: v for k, v in other[1].items() if k not in varying} == \
            {k: v for k, v in headers.items() if k not in varying}
        assert other[1]["server-timing"].startswith("queue;dur=0.000, compute;dur=0.000")
    assert _count(metrics, "429") == 41
    assert _count(metrics, "200") == 2


def test_the_front_refuses_by_the_apps_own_rule(tiny_repo: Path, http_front: str) -> None:
    """An overloaded model's refusals (no access lines due) are the app's answer in every
    part on both fronts, the native front's written without asking Python: the request id
    the client sent, else a new UUID; the client's trace continued under a new span, else a
    new one; the 429 of an OIP route in its shape; a deadline the client shortened; every one
    counted in the request metrics. What the rule leaves to the app gets the app's answer: a
    malformed X-Request-Timeout (400), a content type it does not read (415); a model not
    overloaded, its result."""
    app, entry, server = _served(tiny_repo, http_front, access_log=False)
    trace = "00-" + "ab" * 16 + "-" + "cd" * 8 + "-01"
    with server as base:
        conn = RawConnection(base)
        assert conn.request("POST", URL, BODY, JSON)[0] == 200
        _overloaded(app)
        time.sleep(CALM_GAP_S * 1.2)  # (past the gap between the loop's publications)
        assert conn.request("POST", URL, BODY, JSON)[0] == 429  # (the loop publishes it)
        heads = entry.heads
        named = conn.request("POST", URL, BODY, {**JSON, "x-request-id": "client:id-1"})
        fresh = conn.request("POST", URL, BODY, {**JSON, "x-request-id": "not valid!"})
        traced = conn.request("POST", URL, BODY, {**JSON, "traceparent": trace})
        oip = conn.request("POST", f"/v2/models/{MODEL}/infer", b'{"inputs": []}', JSON)
        short = conn.request("POST", URL, BODY, {**JSON, "x-request-timeout": "0.25"})
        if http_front == "native":
            assert entry.heads == heads  # none of them asked Python
        bad = conn.request("POST", URL, BODY, {**JSON, "x-request-timeout": "soon"})
        typed = conn.request("POST", URL, BODY, {"content-type": "text/plain"})
        metrics = httpx.get(base + "/metrics").text
        conn.close()
    for status, headers, body in (named, fresh, traced, oip, short):
        assert status == 429 and headers["retry-after"] == "2", (status, headers, body)
        doc = json.loads(body)
        assert doc["request_id"] == headers["x-request-id"]
        assert headers["content-type"] == "application/json"
        assert int(headers["content-length"]) == len(body)
        assert headers["server-timing"].startswith("queue;dur=0.000, compute;dur=0.000, total")
    assert json.loads(named[2]) == {
        "error": "overloaded: expected queue wait 2.000 s > 0.500 s allowed",
        "request_id": "client:id-1"}
    assert re.fullmatch(r"[0-9a-f]{12}4[0-9a-f]{3}[89ab][0-9a-f]{15}",
                        fresh[1]["x-request-id"])
    assert fresh[1]["traceparent"].endswith("-00")  # a new trace, not sampled
    assert traced[1]["traceparent"].startswith("00-" + "ab" * 16 + "-")
    assert traced[1]["traceparent"].endswith("-01") and "cd" * 8 not in traced[1]["traceparent"]
    assert json.loads(short[2])["error"].endswith("> 0.250 s allowed")
    assert bad[0] == 400 and "X-Request-Timeout" in json.loads(bad[2])["error"]
    assert typed[0] == 415
    assert _count(metrics, "429") == 5  # the infer route is another endpoint
    assert _count(metrics, "200") == 1


_TRACE = "ab" * 16
_IDS = ["a" * 128, "a" * 129, "~x=y+z/1:2.3_4-5", "with space", "x!y", "ÿ"]
_TRACES = [f"00-{_TRACE}-{'cd' * 8}-01", f"00-{_TRACE.upper()}-{'cd' * 8}-01",
           f"00-{'0' * 32}-{'cd' * 8}-01", f"00-{_TRACE}-{'0' * 16}-01",
           f"01-{_TRACE}-{'cd' * 8}-01", f"00-{_TRACE}-{'cd' * 7}-01", f"00-{_TRACE}-{'cd' * 8}"]
_TYPES = ["Application/JSON", 'application/vnd.x+json; charset="UTF-8"',
          "application/json ; Charset = utf8", "application/+json",
          "application/json; charset=latin-1", "application/jsonx", "text/json"]


def test_the_front_reads_the_headers_by_the_apps_own_rules(
        tiny_repo: Path, http_front: str) -> None:
    """The headers a refusal reads, each by the app's own rule on both fronts (the native
    front's written without asking Python): a client's request id kept exactly where the
    access log keeps it (`VALID_ID`), a trace continued exactly where `Trace` continues it,
    a content type read as JSON exactly where `_body_kind` reads it (else its 415), a coding
    of identity (in any case, among blanks) read as none."""
    app, entry, server = _served(tiny_repo, http_front, access_log=False)
    with server as base:
        conn = RawConnection(base)
        assert conn.request("POST", URL, BODY, JSON)[0] == 200
        _overloaded(app)
        time.sleep(CALM_GAP_S * 1.2)
        assert conn.request("POST", URL, BODY, JSON)[0] == 429  # (the loop publishes it)
        heads = entry.heads
        ids = [conn.request("POST", URL, BODY, {**JSON, "x-request-id": i}) for i in _IDS]
        traces = [conn.request("POST", URL, BODY, {**JSON, "traceparent": t})
                  for t in _TRACES]
        coded = conn.request("POST", URL, BODY, {**JSON, "content-encoding": " Identity , "})
        if http_front == "native":
            assert entry.heads == heads  # all of them the front's own
        types = [conn.request("POST", URL, BODY, {"content-type": t}) for t in _TYPES]
        conn.close()
    for sent, (status, headers, _) in zip(_IDS, ids, strict=True):
        assert status == 429
        kept = VALID_ID.fullmatch(sent.encode("latin-1")) is not None
        assert (headers["x-request-id"] == sent) is kept, (sent, headers["x-request-id"])
    for sent, (status, headers, _) in zip(_TRACES, traces, strict=True):
        assert status == 429
        continued = Trace(sent).parent_id != ""
        assert headers["traceparent"].startswith(f"00-{_TRACE}-") is continued, (sent, headers)
    assert coded[0] == 429
    for sent, (status, _, body) in zip(_TYPES, types, strict=True):
        scope = {"headers": [(b"content-type", sent.encode())], "path": URL}
        assert status == (415 if isinstance(_body_kind(scope), str) else 429), (sent, body)


class _RuleFront:
    """What a front is given by `FrontRule.publish`."""

    def __init__(self) -> None:
        self.routes: list[dict[str, Any]] = []
        self.states: list[list[float]] = []

    def shed_routes(self, paths: dict[str, Any], **_: Any) -> list[tuple[int, float]]:
        self.routes.append(paths)
        return []

    def shed_state(self, waits: list[float], open_: bool, quiet: float) -> None:
        self.states.append(waits)


def test_the_front_is_given_the_routes_again_when_the_models_change(
        tiny_repo: Path) -> None:
    """The rule's routes go to the front once, and again after the repository's models or
    versions change (a version removed: its paths go); its state every time, a default and
    its pinned version the same model's one estimate."""
    app, _, server = _served(tiny_repo, "uvicorn", access_log=False)  # (no front of its own
    with server:  # publishing beside the test's)
        rule, front = app.entry.front_rule(), _RuleFront()
        _overloaded(app)
        rule.publish(front)
        rule.publish(front)
        assert len(front.routes) == 1 and URL in front.routes[0]
        assert front.states[-1][:2] == [2.0, 2.0]  # (tiny-clf: its default, its version 1)
        rule.app_state.repository.remove(MODEL, 1)
        rule.publish(front)
    assert len(front.routes) == 2 and URL not in front.routes[1]
    assert set(front.routes[1]) < set(front.routes[0])  # (the other model's stay)


def test_the_head_leaves_to_the_app_what_it_answers_first(
        tiny_repo: Path, http_front: str) -> None:
    """Under the same overload, what the full path answers before the model's refusal keeps
    its own answer: a body of a type it does not read (415), one over max_body_bytes by its
    Content-Length (413), no API key (401: nothing about the model shows), a route or model
    it does not serve (404), a GET (405)."""
    app, entry, server = _served(tiny_repo, http_front, api_key="k3y", max_body_bytes=1000)
    key = {**JSON, "authorization": "Bearer k3y"}
    with server as base:
        conn = RawConnection(base)
        assert conn.request("POST", URL, BODY, key)[0] == 200
        _overloaded(app)
        for _ in range(30):  # past this second's access lines: the head answers refusals
            assert conn.request("POST", URL, BODY, key)[0] == 429
        before = entry.calls
        assert conn.request("POST", URL, BODY, {**key, "content-type": "text/plain"})[0] == 415
        assert conn.request("POST", URL, b"x" * 1001, key)[0] == 413
        assert conn.request("POST", URL, BODY, JSON)[0] == 401
        assert conn.request("POST", "/v1/models/nope/classify", BODY, key)[0] == 404
        assert conn.request("GET", URL, b"", key)[0] == 405
        assert entry.calls - before == 5  # each by the full path
        assert conn.request("POST", URL, BODY, key)[0] == 429
        conn.close()


def test_a_body_sent_after_the_refusal_is_dropped_and_the_connection_serves_on(
        tiny_repo: Path, http_front: str) -> None:
    """A refused request whose body comes after its answer (in pieces; on the native front,
    before it), then two requests pipelined in one write: the body is read and dropped, each
    request gets its own answer in order, and the connection stays open."""
    app, entry, server = _served(tiny_repo, http_front, access_log=False)
    with server as base:
        host, port = base.removeprefix("http://").split(":")
        sock = socket.create_connection((host, int(port)), timeout=30)
        batcher = _overloaded(app)
        head = (f"POST {URL} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                f"content-length: {len(BODY)}\r\n\r\n").encode()
        sock.sendall(head)
        if http_front == "uvicorn":  # answered from the head, before the body comes
            first = _read_answer(sock)
            assert first.startswith(b"HTTP/1.1 429 "), first
        for i in range(0, len(BODY), 5):  # the body, after its answer
            sock.sendall(BODY[i:i + 5])
            time.sleep(0.01)
        if http_front == "native":  # (the front reads a body whole, off the interpreter,
            first = _read_answer(sock)  # before the head's decision)
            assert first.startswith(b"HTTP/1.1 429 "), first
        _calm(batcher)
        sock.sendall(head + BODY + head + BODY)
        second, third = _read_answer(sock), _read_answer(sock)
        assert second.startswith(b"HTTP/1.1 200 ") and third.startswith(b"HTTP/1.1 200 ")
        assert entry.calls == 2  # the refusal never reached the app
        sock.close()


def _read_answer(sock: socket.socket) -> bytes:
    """One whole answer (status line, headers, a Content-Length body) off `sock`."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(1)
        assert chunk, "connection closed"
        data += chunk
    size = next(int(line.split(b":", 1)[1]) for line in data.split(b"\r\n")
                if line.lower().startswith(b"content-length:"))
    while len(data) < data.index(b"\r\n\r\n") + 4 + size:
        data += sock.recv(1)
    return data


PACE_S = 0.3


def test_a_request_resent_at_once_after_a_refusal_is_refused_at_the_pace(
        tiny_repo: Path, http_front: str) -> None:
    """Paced refusals (`pace_s`): on one connection, requests resent at once to an overloaded
    model get their 429s one per pace (the same answer each), another connection's first
    request is refused at once, and once the model can take requests they are served at
    once on the paced connection too."""
    app, entry, server = _served(tiny_repo, http_front, pace_s=PACE_S, access_log=False)
    with server as base:
        conn, other = RawConnection(base), RawConnection(base)
        assert conn.request("POST", URL, BODY, JSON)[0] == 200
        assert other.request("POST", URL, BODY, JSON)[0] == 200
        batcher = _overloaded(app)
        start = time.monotonic()
        answers = [conn.request("POST", URL, BODY, {**JSON, "x-request-id": "same-id"})
                   for _ in range(4)]
        took = time.monotonic() - start
        assert [a[0] for a in answers] == [429] * 4
        assert all(a[2] == answers[0][2] and "retry-after" in a[1] for a in answers)
        assert 3 * PACE_S * 0.95 <= took < 3 * PACE_S + 2.0  # the first at once, then paced
        t0 = time.monotonic()
        assert other.request("POST", URL, BODY, JSON)[0] == 429
        assert time.monotonic() - t0 < PACE_S  # not paced: its connection had no refusal
        _calm(batcher)  # the model can take requests again
        t0 = time.monotonic()
        status, _, body = conn.request("POST", URL, BODY, JSON)
        assert status == 200 and b"label" in body
        assert time.monotonic() - t0 < PACE_S  # a request the server takes is not delayed
        conn.close()
        other.close()


def test_a_paced_refusal_is_written_when_the_server_stops(
        tiny_repo: Path, http_front: str) -> None:
    """A 429 due later (paced) when the server stops is written at once: no request is left
    without an answer when the connections close."""
    app, entry, server = _served(tiny_repo, http_front, pace_s=30.0, access_log=False)
    got: dict[str, Any] = {}
    with server as base:
        conn = RawConnection(base)
        assert conn.request("POST", URL, BODY, JSON)[0] == 200
        _overloaded(app)
        assert conn.request("POST", URL, BODY, JSON)[0] == 429
        conn.send("POST", URL, BODY, JSON)  # its 429 is due in 30 s
        conn.sock.settimeout(0.3)
        with pytest.raises(TimeoutError):
            conn.sock.recv(1)  # not answered yet
        conn.sock.settimeout(30)
        reader = threading.Thread(target=lambda: got.update(answer=conn.read_response()))
        reader.start()
        t0 = time.monotonic()
    reader.join(15)  # the server has stopped (leaving the block)
    assert time.monotonic() - t0 < 10
    status, headers, _ = got["answer"]
    assert status == 429 and "retry-after" in headers
    conn.close()
