"""Overload, deadlines, runtime faults and disconnects, with a fake runtime behind the app."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from server_support import RawConnection
from service_fakes import FakeRuntime, fake_factory, serve_in_thread, served

from seqserve.service.scheduling.batcher import Batcher
from seqserve.service.server.app import create_app
from seqserve.service.web.front_rule import FrontRule
from seqserve.service.web.http_protocol import guarded_protocol
from seqserve.service.web.settings import Settings

MODEL = "tiny-clf"
URL = f"/v1/models/{MODEL}/classify"


def _app(tiny_repo: Path, runtime: FakeRuntime, **settings: Any) -> Any:
    return create_app(Settings(repo=tiny_repo, warmup=False, **settings), fake_factory(runtime))


def _batcher(app: Any) -> Batcher[Any, Any]:
    batcher: Batcher[Any, Any] = served(app, MODEL).batcher
    return batcher


async def _fire(base: str, bodies: list[dict[str, Any]], timeout: float = 30
                ) -> list[httpx.Response | Exception]:
    async with httpx.AsyncClient(base_url=base, timeout=timeout,
                                 limits=httpx.Limits(max_connections=200)) as c:
        return list(await asyncio.gather(*(c.post(URL, json=b) for b in bodies),
                                         return_exceptions=True))


def test_overload_yields_429_and_queue_stays_bounded(tiny_repo: Path) -> None:
    runtime = FakeRuntime(delay_s=0.1)
    app = _app(tiny_repo, runtime, max_batch_size=2, queue_size=4, max_texts=4, max_wait_ms=0,
               retry_after_s=2)
    with serve_in_thread(app) as base:
        rs = asyncio.run(_fire(base, [{"texts": ["one two"]}] * 40))
        depth_seen = _batcher(app).max_depth_seen
    codes = [r.status_code for r in rs if isinstance(r, httpx.Response)]
    assert len(codes) == 40 and set(codes) <= {200, 429}
    assert codes.count(429) > 0 and codes.count(200) >= 4
    for r in rs:
        assert isinstance(r, httpx.Response)
        if r.status_code == 429:
            assert r.headers["retry-after"] == "2" and "queue is full" in r.json()["error"]
    assert depth_seen <= 4


def test_deadline_passed_gives_504(tiny_repo: Path) -> None:
    runtime = FakeRuntime(delay_s=0.4)
    app = _app(tiny_repo, runtime, max_batch_size=1, request_timeout_s=0.2, max_wait_ms=0)
    with serve_in_thread(app) as base:
        rs = asyncio.run(_fire(base, [{"texts": ["one"]}] * 3))
        for r in rs:
            assert isinstance(r, httpx.Response) and r.status_code == 504
            assert "deadline" in r.json()["error"]
        runtime.delay_s = 0.0
        time.sleep(0.5)  # let the batch in compute finish
        for _ in range(50):  # 429 while the slow spell is fresh (0.4 s a row > 0.2 s), then
            ok = httpx.post(base + URL, json={"texts": ["one"]}, timeout=10)  # a probe
            if ok.status_code != 429:
                break
            time.sleep(0.1)
        assert ok.status_code == 200
    assert len(runtime.calls) <= 2 + 1  # rows queued behind the slow batch were dropped


def test_runtime_fault_fails_only_its_batch(tiny_repo: Path) -> None:
    runtime = FakeRuntime(delay_s=0.05)
    runtime.fail_next = 1
    app = _app(tiny_repo, runtime, max_batch_size=3, max_wait_ms=0)
    with serve_in_thread(app) as base:
        rs = asyncio.run(_fire(base, [{"texts": ["one two"]}] * 9))
        after = httpx.post(base + URL, json={"texts": ["one"]}, timeout=10)
    codes = [r.status_code for r in rs if isinstance(r, httpx.Response)]
    failed_rows = runtime.calls[0][0]
    assert codes.count(500) == failed_rows and codes.count(200) == 9 - failed_rows
    assert all("inference failed" in r.json()["error"] for r in rs
               if isinstance(r, httpx.Response) and r.status_code == 500)
    assert after.status_code == 200


@pytest.mark.parametrize("protocol", ["uvicorn", "seqserve"])
def test_client_disconnect_leaves_no_queued_work(tiny_repo: Path, protocol: str) -> None:
    """Under uvicorn's own protocol a task per request waits for `http.disconnect`; under
    the server's (`guarded_protocol`) the scope's disconnect future says it."""
    runtime = FakeRuntime(delay_s=0.5)
    app = _app(tiny_repo, runtime, max_batch_size=1, max_wait_ms=0)
    config = {"http": guarded_protocol(30.0)} if protocol == "seqserve" else {}
    with serve_in_thread(app, **config) as base:

        async def scenario() -> None:
            async with httpx.AsyncClient(base_url=base, timeout=10) as c:
                busy = asyncio.ensure_future(c.post(URL, json={"texts": ["one"]}))
                await asyncio.sleep(0.15)  # the first request is computing
                gone = await _fire(base, [{"texts": ["two three"]}] * 5, timeout=0.1)
                assert all(isinstance(g, httpx.TimeoutException) for g in gone)
                await asyncio.sleep(0.1)
                assert _batcher(app).depth == 0  # dropped as soon as the clients left
                assert (await busy).status_code == 200

        asyncio.run(scenario())
        time.sleep(0.2)
        assert len(runtime.calls) == 1
        text = httpx.get(base + "/metrics").text
    assert 'seqserve_queue_depth{model="tiny-clf"} 0.0' in text
    assert 'seqserve_requests_total{endpoint="classify",model="tiny-clf",status="499"}' in text


def test_admission_by_expected_wait_and_request_deadlines(tiny_repo: Path) -> None:
    """Once a batch's cost is measured, requests that would wait past max_queue_wait_s, or
    whose own deadline (X-Request-Timeout, OIP `timeout`) is shorter than their expected wait
    plus compute, get 429 + Retry-After at once; a malformed deadline is a 400."""
    runtime = FakeRuntime(delay_s=0.1)
    app = _app(tiny_repo, runtime, max_batch_size=1, max_wait_ms=0, queue_size=64,
               max_queue_wait_s=0.25)
    with serve_in_thread(app) as base, httpx.Client(base_url=base, timeout=30) as c:
        assert c.post(URL, json={"texts": ["one"]}).status_code == 200  # measures 0.1 s/row
        short = c.post(URL, json={"texts": ["one"]}, headers={"X-Request-Timeout": "0.05"})
        assert short.status_code == 429 and short.headers["retry-after"]
        assert "left" in short.json()["error"]
        bad = c.post(URL, json={"texts": ["one"]}, headers={"X-Request-Timeout": "soon"})
        assert bad.status_code == 400 and "X-Request-Timeout" in bad.json()["error"]
        oip = c.post(f"/v2/models/{MODEL}/infer", json={
            "inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": ["one"]}],
            "parameters": {"timeout": 1000}})  # microseconds: 1 ms
        assert oip.status_code == 429
        rs = asyncio.run(_fire(base, [{"texts": ["one two"]}] * 12))  # 1.2 s of work at once
    codes = [r.status_code for r in rs if isinstance(r, httpx.Response)]
    assert len(codes) == 12 and set(codes) <= {200, 429}
    assert codes.count(200) >= 1 and codes.count(429) >= 6  # a few admitted, most refused
    refused = [r for r in rs if isinstance(r, httpx.Response) and r.status_code == 429]
    assert all(r.headers["retry-after"] for r in refused)


def test_an_api_process_refuses_beyond_max_in_flight(tiny_repo: Path) -> None:
    runtime = FakeRuntime(delay_s=0.3)
    app = _app(tiny_repo, runtime, max_batch_size=8, max_wait_ms=50, max_in_flight=2,
               max_queue_wait_s=30)
    body = json.dumps({"texts": ["one"]}).encode()
    with serve_in_thread(app) as base:
        conns = [RawConnection(base) for _ in range(6)]
        try:
            for conn in conns:  # open and answered once: every request below is written
                assert conn.request("GET", "/v2/health/live")[0] == 200
            for conn in conns:  # all six written while the first ones compute (0.3 s)
                conn.send("POST", URL, body, {"content-type": "application/json"})
            answers = [conn.read_response() for conn in conns]
        finally:
            for conn in conns:
                conn.close()
        health = httpx.get(f"{base}/v2/health/ready", timeout=10)  # not inference: open
    codes = [status for status, _, _ in answers]
    assert codes.count(200) >= 2 and codes.count(429) >= 1 and set(codes) <= {200, 429}
    _, headers, refused = next(a for a in answers if a[0] == 429)
    assert "max_in_flight" in json.loads(refused)["error"] and headers["retry-after"]
    assert health.status_code == 200


def test_max_in_flight_counts_requests_whose_bodies_still_arrive(tiny_repo: Path) -> None:
    """Requests whose headers came but whose bodies have not count against max_in_flight:
    with two such slow bodies open, a third request gets 429 at once; the two, completed,
    are answered 200."""
    app = _app(tiny_repo, FakeRuntime(), max_in_flight=2, body_timeout_s=30)
    body = json.dumps({"texts": ["one"]}).encode()
    head = (f"POST {URL} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\n\r\n").encode()
    with serve_in_thread(app) as base:
        slow = [RawConnection(base) for _ in range(2)]
        third = RawConnection(base)
        try:
            for conn in slow:
                assert conn.request("GET", "/v2/health/live")[0] == 200
                conn.sock.sendall(head + body[:5])  # headers and the start of the body
            serving = app.entry  # the request lifecycle
            deadline = time.monotonic() + 10
            while serving.admitted < 2 and time.monotonic() < deadline:  # both headers seen
                time.sleep(0.01)
            status, headers, refused = third.request("POST", URL, body,
                                                     {"content-type": "application/json"})
            for conn in slow:
                conn.sock.sendall(body[5:])
            answers = [conn.read_response()[0] for conn in slow]
        finally:
            for conn in [*slow, third]:
                conn.close()
    assert status == 429 and headers["retry-after"], (status, refused)
    assert "max_in_flight" in json.loads(refused)["error"]
    assert answers == [200, 200]


def test_an_overloaded_model_refuses_before_the_body_is_read(tiny_repo: Path) -> None:
    """When the model's expected wait already exceeds what any request may wait, the refusal
    comes before the body is parsed or tokenized (the cheap 429 under overload): a body that
    would be a 4xx gets the 429 too, a model in another state or another route is
    untouched; once the queue drains, the same bodies get their own answers."""
    runtime = FakeRuntime()
    app = _app(tiny_repo, runtime, max_queue_wait_s=0.5)
    with serve_in_thread(app) as base, httpx.Client(base_url=base, timeout=30) as c:
        assert c.post(URL, json={"texts": ["one"]}).status_code == 200
        batcher = _batcher(app)
        batcher.expected_wait = lambda: 2.0  # type: ignore[method-assign]
        calls = len(runtime.calls)
        bad_json = c.post(URL, content=b"{not json", headers={"content-type": "application/json"})
        bad_body = c.post(URL, json={"texts": 5})
        fine = c.post(URL, json={"texts": ["one"]})
        other = c.post("/v1/models/no-such-model/classify", json={"texts": ["one"]})
        for r in (bad_json, bad_body, fine):
            assert r.status_code == 429, r.text
            assert "overloaded: expected queue wait 2.000 s" in r.json()["error"]
            assert float(r.headers["retry-after"]) >= 2
        assert len(runtime.calls) == calls  # nothing computed
        assert other.status_code == 404
        del batcher.expected_wait  # the instance's override: the class's estimate again
        time.sleep(FrontRule.MAX_AGE_S * 1.2)  # (as the native front's refusals see it)
        assert c.post(URL, content=b"{not json",
                      headers={"content-type": "application/json"}).status_code in (400, 422)
        assert c.post(URL, json={"texts": 5}).status_code == 422
        assert c.post(URL, json={"texts": ["one"]}).status_code == 200
