"""A hung engine is detected (issue 50): the engine layout (every model in the engine
process), the engine stopped with SIGSTOP. Within --engine-hang-timeout-s and a margin the
requests it holds and new ones answer 503 + Retry-After (no stall), readiness says not ready,
the supervisor kills the hung engine and starts another, the models answer 200 again, and
seqserve_engine_restarts_total says reason="hang"."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from pathlib import Path

import httpx
from process_support import counts, running, serve
from test_engine_restart import engine_of

HANG_S = 2.0
MARGIN_S = 3.0


def test_a_stopped_engine_is_answered_503_then_killed_and_restarted(tiny_repo: Path) -> None:
    with serve(tiny_repo, "--layout", "engine", "--api-workers", "1",
               "--engine-hang-timeout-s", str(HANG_S)) as server:
        url = f"{server.url}/v1/models/tiny-clf/classify"
        body = {"texts": ["one two"]}
        assert httpx.post(url, json=body, timeout=30).status_code == 200
        old = engine_of(server)
        assert old is not None
        os.kill(old, signal.SIGSTOP)
        try:
            began = time.monotonic()
            stalled = httpx.post(url, json=body, timeout=60)  # sent to the stopped engine
            waited = time.monotonic() - began
            assert stalled.status_code == 503, stalled.text
            assert stalled.headers.get("retry-after"), stalled.headers
            assert waited < HANG_S + MARGIN_S, waited
            statuses: list[int] = []
            ready: set[int] = set()
            deadline = time.monotonic() + 90
            while time.monotonic() < deadline:
                t0 = time.monotonic()
                r = httpx.post(url, json=body, timeout=60)
                statuses.append(r.status_code)
                if r.status_code == 503:
                    assert r.headers.get("retry-after"), r.headers
                    assert time.monotonic() - t0 < MARGIN_S  # at once, not a stall
                    ready.add(httpx.get(f"{server.url}/v2/health/ready",
                                        timeout=10).status_code)
                if r.status_code == 200:
                    break
                time.sleep(0.1)
            assert statuses[-1] == 200, statuses
            assert set(statuses) <= {200, 503}, statuses
            assert not running(old)  # killed, though stopped
            assert engine_of(server) not in (None, old)
            assert 503 in ready or not ready, ready  # not ready while the engine is away
            metrics = httpx.get(f"{server.url}/metrics", timeout=10).text
            restarts = counts(metrics, "seqserve_engine_restarts_total", "reason")
            assert restarts == {"hang": 1.0}, restarts
            assert server.proc.poll() is None, server.output()
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.kill(old, signal.SIGKILL)


def _timing(value: str) -> dict[str, float]:
    """Server-Timing's durations in seconds by name."""
    out = {}
    for part in value.split(","):
        name, _, dur = part.strip().partition(";dur=")
        out[name] = float(dur) / 1000
    return out


def test_a_stall_shorter_than_the_hang_timeout_shows_in_the_queue_time(tiny_repo: Path) -> None:
    """An engine stopped for less than --engine-hang-timeout-s: the request it held is
    answered once the engine goes on, and its Server-Timing queue (and the queue metric)
    tell the wait the client saw, not the engine's own report of its queue."""
    stall_s = 1.5
    with serve(tiny_repo, "--layout", "engine", "--api-workers", "1",
               "--engine-hang-timeout-s", "30") as server:
        url = f"{server.url}/v1/models/tiny-clf/classify"
        body = {"texts": ["one two"]}
        assert httpx.post(url, json=body, timeout=30).status_code == 200
        engine = engine_of(server)
        assert engine is not None
        os.kill(engine, signal.SIGSTOP)
        try:
            with httpx.Client(timeout=60) as client:
                began = time.monotonic()
                pending = client.build_request("POST", url, json=body)
                threading.Timer(stall_s, os.kill, (engine, signal.SIGCONT)).start()
                answer = client.send(pending)
                waited = time.monotonic() - began
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.kill(engine, signal.SIGCONT)
    assert answer.status_code == 200, answer.text
    timing = _timing(answer.headers["server-timing"])
    assert waited >= stall_s and timing["queue"] >= stall_s * 0.8, (waited, timing)
    assert timing["queue"] + timing["compute"] <= timing["total"] + 0.01, timing
