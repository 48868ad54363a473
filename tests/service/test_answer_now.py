"""Requests answered without a task (`HttpLifecycle.answer_now`, `HotPath.begin`,
`lifecycle.begin`): the native front runs a plain route's lifecycle from callbacks. Its
answers are the full path's (uvicorn's front runs the app per request), a client that leaves
drops its work, a bug is one JSON 500 logged once, and the drain waits for them."""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from server_support import RawConnection
from service_fakes import CountingEntry, FakeRuntime, fake_factory, serve_in_thread

from seqserve.service.server.app import create_app
from seqserve.service.web.settings import Settings
from seqserve.service.workers.classifier import ClassifierWorker

MODEL = "tiny-clf"
URL = f"/v1/models/{MODEL}/classify"
JSON = {"content-type": "application/json"}
OWN = ("server-timing", "x-request-id", "traceparent", "date", "server")


def _app(tiny_repo: Path, front: str, runtime: FakeRuntime | None = None,
         **settings: Any) -> tuple[Any, CountingEntry]:
    app = create_app(Settings(repo=tiny_repo, warmup=False, front=front, **settings),
                     fake_factory(runtime or FakeRuntime()))
    entry = CountingEntry(app.entry, now=True)
    app.entry = entry
    return app, entry


def _answers(url: str) -> list[tuple[int, dict[str, str], Any]]:
    """What a client sees of a few plain requests, less the headers that differ per request."""
    out = []
    with httpx.Client(base_url=url, timeout=30) as client:
        for body, headers in (
                ({"texts": ["one two", "three"], "top_k": 2}, {"x-request-id": "mine-1"}),
                ({"texts": ["one"], "return_attention": True}, {}),
                ({"texts": []}, {}),
                ({"texts": ["one"], "top_k": 0}, {}),
                ({"texts": ["one"]}, {"x-request-timeout": "soon"})):
            r = client.post(URL, json=body, headers=headers)
            assert r.headers["x-request-id"] == headers.get("x-request-id", r.headers[
                "x-request-id"])
            assert r.headers["server-timing"].startswith("queue;dur=")
            kept = {k: v for k, v in r.headers.items() if k not in OWN}
            doc = r.json()
            assert doc.pop("request_id", r.headers["x-request-id"]) == r.headers["x-request-id"]
            out.append((r.status_code, kept, doc))
        r = client.post("/v1/models/nope/classify", json={"texts": ["one"]})
        out.append((r.status_code, {}, r.json()["error"]))
    return out


def test_the_native_front_answers_plain_routes_as_the_full_path_does(tiny_repo: Path) -> None:
    app, entry = _app(tiny_repo, "native")
    with serve_in_thread(app) as url:
        native = _answers(url)
        before = entry.calls
        httpx.get(url + "/v2/health/ready", timeout=30)  # (another route: the app runs it)
        with httpx.Client(base_url=url, timeout=30) as client:  # behind a proxy: the full path
            r = client.post(URL, json={"texts": ["one"]},
                            headers={"x-forwarded-for": "10.1.2.3"})
            assert r.status_code == 200
        assert entry.calls == before + 2
        metrics = httpx.get(url + "/metrics", timeout=30).text
    assert entry.now == len(native)  # each plain POST (the proxied one: not)
    app, _ = _app(tiny_repo, "uvicorn")
    with serve_in_thread(app) as url:
        full = _answers(url)
    assert native == full
    assert [a[0] for a in native] == [200, 200, 422, 422, 400, 404]
    counted = {(s.labels["status"], s.labels["endpoint"]): s.value
               for f in text_string_to_metric_families(metrics)
               for s in f.samples if s.name == "seqserve_requests_total"
               and s.labels.get("model") == MODEL}
    assert counted[("200", "classify")] == 3 and counted[("422", "classify")] == 2


@pytest.mark.parametrize(("front", "per_request"), [("native", 1), ("uvicorn", 2)])
def test_the_shed_decision_is_made_once_where_the_body_was_read_first(
        tiny_repo: Path, front: str, per_request: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """The native front reads the whole body before the head's decision, and answers right
    after it: the lifecycle's `admit` does not ask the model's expected wait again. uvicorn
    decides on the head before the body arrives (it may trickle in for seconds): `admit` asks
    again once it is read. The same answers either way (the test above)."""
    from seqserve.service.api import lifecycle

    asked: list[float] = []
    shed_early = lifecycle.shed_early

    def counted(*args: Any, **kwargs: Any) -> None:
        asked.append(time.monotonic())
        shed_early(*args, **kwargs)

    monkeypatch.setattr(lifecycle, "shed_early", counted)
    app, _ = _app(tiny_repo, front, max_queue_wait_s=30.0)
    with serve_in_thread(app) as url, httpx.Client(base_url=url, timeout=30) as client:
        for i in range(5):
            r = client.post(URL, json={"texts": [f"one {i}"]})
            assert r.status_code == 200, r.text
    assert len(asked) == 5 * per_request


def test_a_client_that_leaves_drops_its_work(tiny_repo: Path) -> None:
    runtime = FakeRuntime(delay_s=0.5)
    app, entry = _app(tiny_repo, "native", runtime, max_batch_size=1)
    with serve_in_thread(app) as url:
        host, port = url.removeprefix("http://").split(":")
        body = b'{"texts": ["one two"]}'
        head = (f"POST {URL} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                f"content-length: {len(body)}\r\n\r\n").encode()
        busy = socket.create_connection((host, int(port)))  # holds the one lane 0.5 s
        busy.sendall(head + body)
        time.sleep(0.1)
        left = socket.create_connection((host, int(port)))
        left.sendall(head + body)
        time.sleep(0.1)
        left.close()  # queued behind `busy`: its row is dropped before it runs
        assert busy.recv(65536).startswith(b"HTTP/1.1 200")
        busy.close()
        time.sleep(0.7)
        assert len(runtime.calls) == 1, runtime.calls
        assert entry.now == 2 and app.state.seqserve.admitted == 0
        gauge = [s for f in text_string_to_metric_families(
            httpx.get(url + "/metrics", timeout=30).text) for s in f.samples
            if s.name == "seqserve_in_flight_requests" and s.labels.get("model") == MODEL]
        assert all(s.value == 0 for s in gauge)


def test_a_bug_is_one_json_500_logged_once(tiny_repo: Path, caplog: pytest.LogCaptureFixture,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    calls = 0

    def broken_results(self: Any, *args: Any, **kwargs: Any) -> Any:
        nonlocal calls
        calls += 1
        raise RuntimeError("a bug in the results")

    monkeypatch.setattr(ClassifierWorker, "_result", broken_results)
    caplog.set_level(logging.INFO)
    app, entry = _app(tiny_repo, "native")
    with serve_in_thread(app) as url:
        r = httpx.post(url + URL, json={"texts": ["one"]}, timeout=30)
        again = httpx.post(url + URL, json={"texts": ["two"]}, timeout=30)
    assert r.status_code == again.status_code == 500 and "server bug" in r.json()["error"]
    assert r.json()["request_id"] == r.headers["x-request-id"] and entry.now == 2 and calls == 2
    bugs = [x for x in caplog.records if x.exc_info]
    assert len(bugs) == 2 and all(x.name == "seqserve.access" for x in bugs)
    assert "a bug in the results" in str(bugs[0].exc_info[1])  # type: ignore[index]


def test_a_reply_the_encoder_refuses_is_a_500(tiny_repo: Path, caplog: pytest.LogCaptureFixture,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """A bug found while the answer is built, in the callback that saw the work done (the
    JSON encoder refuses the reply): that request's JSON 500, logged once; the server serves
    on."""
    real = ClassifierWorker._result

    def unencodable(self: Any, *args: Any, **kwargs: Any) -> Any:
        out = real(self, *args, **kwargs)
        out["label"] = object()  # (not JSON)
        return out

    caplog.set_level(logging.INFO)
    app, entry = _app(tiny_repo, "native")
    with serve_in_thread(app) as url:
        monkeypatch.setattr(ClassifierWorker, "_result", unencodable)
        r = httpx.post(url + URL, json={"texts": ["one"]}, timeout=30)
        monkeypatch.undo()
        ok = httpx.post(url + URL, json={"texts": ["one"]}, timeout=30)
    assert r.status_code == 500 and r.json()["request_id"] == r.headers["x-request-id"]
    assert ok.status_code == 200 and entry.now == 2
    assert len([x for x in caplog.records if x.exc_info]) == 1


def test_a_bug_in_the_heads_decision_is_its_own_500(tiny_repo: Path) -> None:
    """A bug before the route (the lifecycle's head decision) is that request's JSON 500;
    the requests of the same loop turn and the connection go on."""
    app, entry = _app(tiny_repo, "native")
    lifecycle = entry.inner
    real = lifecycle._head

    def head(scope: Any, kind: Any, inference: bool) -> Any:
        if scope["state"].get("request_id") == "boom":
            raise RuntimeError("injected bug in the head")
        return real(scope, kind, inference)

    lifecycle._head = head
    with serve_in_thread(app) as url:
        conn = RawConnection(url)
        try:
            body = b'{"texts": ["one"]}'
            for rid in ("boom", "fine"):  # pipelined: one loop turn may take both
                conn.send("POST", URL, body, {**JSON, "x-request-id": rid})
            first, second = conn.read_response(), conn.read_response()
        finally:
            conn.close()
    assert first[0] == 500 and b"server bug" in first[2] and first[1]["x-request-id"] == "boom"
    assert second[0] == 200 and second[1]["x-request-id"] == "fine"
    assert app.state.seqserve.admitted == 0


def test_the_drain_answers_what_it_admitted(tiny_repo: Path) -> None:
    runtime = FakeRuntime(delay_s=0.3)
    app, entry = _app(tiny_repo, "native", runtime, max_batch_size=1, shutdown_delay_s=0.0,
                      drain_timeout_s=10.0, max_queue_wait_s=10.0)
    got: list[int] = []
    with serve_in_thread(app) as url:
        def one() -> None:
            conn = RawConnection(url)
            try:
                status, _, _ = conn.request("POST", URL, b'{"texts": ["one"]}', JSON)
                got.append(status)
            finally:
                conn.close()

        threads = [threading.Thread(target=one) for _ in range(4)]
        for t in threads:
            t.start()
        time.sleep(0.2)  # all four admitted, one running, three queued
        assert entry.now == 4
    for t in threads:
        t.join(30)
    assert got == [200] * 4


def test_watch_settles_once(tiny_repo: Path) -> None:
    """`RequestContext.watch`: results once every future is done; the deadline's error
    otherwise, with the rest cancelled."""
    from seqserve.service.core.errors import DeadlineExceeded
    from seqserve.service.scheduling.base import Timed, Timing
    from seqserve.service.workers.base import RequestContext

    async def main() -> None:
        loop = asyncio.get_running_loop()
        seen: list[Any] = []
        a, b = loop.create_future(), loop.create_future()
        RequestContext(deadline=time.monotonic() + 5).watch(
            [a, b], lambda r, e: seen.append((r, e)))
        a.set_result(Timed(1, Timing(0.1, 0.2, 3, 0)))
        await asyncio.sleep(0)
        assert seen == []
        b.set_result(Timed(2, Timing(0.1, 0.3, 3, 0)))
        await asyncio.sleep(0)
        assert [x.value for x in seen[0][0]] == [1, 2] and seen[0][1] is None
        late = loop.create_future()
        RequestContext(deadline=time.monotonic() + 0.05).watch(
            [late], lambda r, e: seen.append((r, e)))
        await asyncio.sleep(0.1)
        assert late.cancelled() and isinstance(seen[1][1], DeadlineExceeded)
        assert len(seen) == 2

    asyncio.run(main())
