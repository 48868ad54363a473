"""A dead engine process is restarted, and nothing else stops (issue 37).

Real processes on 127.0.0.1 (hybrid layout: two API processes with the classifier and the
translator each, one engine process with the stateful tiny-series bundle). SIGKILL of the
engine under load: the classifier answers on with only 2xx, the session model answers 503 +
Retry-After (and its model-ready endpoint says not ready) until the supervisor's new engine
is up, the server's readiness stays true, a session the dead engine held answers 404 naming
the restart, and new sessions work again. Crash loops per role (issue 50): a crash-looping
engine is restarted with backoff while the other models serve on; the fifth death of an API
process within 30 s ends the server non-zero.
"""

from __future__ import annotations

import os
import shutil
import signal
import threading
import time
from collections import Counter
from pathlib import Path

import httpx
import pytest
from process_support import counts, serve

from seqserve.service.server.supervisor import ENGINE_BACKOFF_MAX_S, engine_backoff_s

STEP = [0.1, 0.2, 0.3]


@pytest.fixture(scope="module")
def session_repo(tmp_path_factory: pytest.TempPathFactory, tiny_repo: Path,
                 tiny_series_repo: Path) -> Path:
    """tiny_repo's classifier and translator plus the stateful tiny-series bundle."""
    repo = tmp_path_factory.mktemp("restart") / "repo"
    shutil.copytree(tiny_repo, repo)
    shutil.copytree(tiny_series_repo / "tiny-series", repo / "tiny-series")
    return repo


def engine_of(server: object) -> int | None:
    found = [pid for pid, role in server.children().items()  # type: ignore[attr-defined]
             if role == "engine"]
    return found[0] if found else None


class Load:
    """Classify requests on keep-alive connections and session chunks, in threads, until
    `stop`; every answer's status (and Retry-After of every 503) tallied per kind."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.stop = threading.Event()
        self.tally: dict[str, Counter[str]] = {"classify": Counter(), "session": Counter()}
        self.no_retry_after = 0
        self.threads = [threading.Thread(target=self._classify, daemon=True) for _ in range(3)]
        self.threads.append(threading.Thread(target=self._session, daemon=True))

    def __enter__(self) -> Load:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(30)

    def _note(self, kind: str, r: httpx.Response) -> None:
        self.tally[kind][str(r.status_code)] += 1
        if r.status_code == 503 and not r.headers.get("retry-after"):
            self.no_retry_after += 1

    def _classify(self) -> None:
        with httpx.Client(timeout=30) as client:
            i = 0
            while not self.stop.is_set():
                i += 1
                try:
                    r = client.post(f"{self.url}/v1/models/tiny-clf/classify",
                                    json={"texts": [f"one two {i}"]})
                except httpx.HTTPError as exc:
                    self.tally["classify"][type(exc).__name__] += 1
                    continue
                self._note("classify", r)

    def _session(self) -> None:
        with httpx.Client(timeout=30) as client:
            i = 0
            while not self.stop.is_set():
                i += 1  # one-shot chunks: they need no session to survive
                try:
                    r = client.post(f"{self.url}/v1/models/tiny-series/predict",
                                    json={"series": [[STEP]], "session": f"load-{i}",
                                          "start": True, "end": True})
                except httpx.HTTPError as exc:
                    self.tally["session"][type(exc).__name__] += 1
                    continue
                self._note("session", r)
                time.sleep(0.01)


def test_a_killed_engine_is_restarted_and_the_other_models_answer_on(
        session_repo: Path) -> None:
    with serve(session_repo, "--layout", "hybrid", "--api-workers", "2") as server:
        url = server.url
        chunk = f"{url}/v1/models/tiny-series/predict"
        first = httpx.post(chunk, json={"series": [[STEP]], "session": "kept", "start": True},
                           timeout=30)
        assert first.status_code == 200, first.text
        old = engine_of(server)
        assert old is not None
        with Load(url) as load:
            time.sleep(1.0)
            os.kill(old, signal.SIGKILL)
            not_ready = server_ready = None
            model_ready: Counter[int] = Counter()
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                r = httpx.get(f"{url}/v2/models/tiny-series/ready", timeout=10)
                model_ready[r.status_code] += 1
                if r.status_code == 503 and not_ready is None:
                    not_ready = r
                    server_ready = httpx.get(f"{url}/v2/health/ready", timeout=10).status_code
                new = engine_of(server)
                if r.status_code == 200 and not_ready is not None and new not in (None, old):
                    break
                time.sleep(0.05)
            time.sleep(1.0)  # load on the restarted engine too
        assert server.proc.poll() is None, server.output()
        assert not_ready is not None, model_ready
        assert not_ready.json()["ready"] is False
        assert server_ready == 200  # the server stays in its load balancer
        assert model_ready[200] >= 1, model_ready
        # the dead engine's session is gone, and the answer says why
        lost = httpx.post(chunk, json={"series": [[STEP]], "session": "kept"}, timeout=30)
        assert lost.status_code == 404, lost.text
        assert "engine process restarted" in lost.json()["error"], lost.text
        again = httpx.post(chunk, json={"series": [[STEP]], "session": "kept", "start": True},
                           timeout=30)
        assert again.status_code == 200, again.text
        second = httpx.post(chunk, json={"series": [[STEP]], "session": "kept"}, timeout=30)
        assert second.status_code == 200 and second.json()["steps"] == 2, second.text
        assert httpx.get(f"{url}/v2/health/ready", timeout=10).status_code == 200
        server.proc.send_signal(signal.SIGTERM)
        assert server.proc.wait(timeout=60) == 0
    session = _others_served_while_sessions_503(load)
    assert session["200"] >= 2, load.tally
    assert load.no_retry_after == 0, load.tally


def test_a_crash_looping_engine_is_restarted_with_backoff_and_the_others_serve_on(
        session_repo: Path) -> None:
    """Six engine kills in a row: the server does not exit, the classifier (run by the API
    processes) answers 200 throughout, the session model 503 + Retry-After while the engine
    is down (the index says why) and 200 again once the kills stop."""
    # a request may wait up to 30 s (not 0.5): the restarts' model loads can stall an API
    # process on a busy machine, and CI once refused a classify as waiting too long (a 429
    # this test is not about)
    with serve(session_repo, "--layout", "hybrid", "--api-workers", "2",
               "--engine-restart-backoff-s", "0.2", "--max-queue-wait-s", "30") as server:
        url = server.url
        with Load(url) as load:
            killed: list[int] = []
            index = None
            deadline = time.monotonic() + 120
            while len(killed) < 6 and time.monotonic() < deadline:
                assert server.proc.poll() is None, server.output()
                pid = engine_of(server)
                if pid is not None and pid not in killed:
                    killed.append(pid)
                    os.kill(pid, signal.SIGKILL)
                    if len(killed) == 6:  # the longest backoff yet: 0.2 x 2^4 = 3.2 s
                        time.sleep(0.5)
                        index = httpx.post(f"{url}/v2/repository/index", json={},
                                           timeout=10).json()
                time.sleep(0.05)
            assert len(killed) == 6, killed
            chunk = {"series": [[STEP]], "session": "after", "start": True, "end": True}
            back = None
            while time.monotonic() < deadline:
                back = httpx.post(f"{url}/v1/models/tiny-series/predict", json=chunk,
                                  timeout=30)
                if back.status_code == 200:
                    break
                assert back.status_code == 503 and back.headers.get("retry-after"), back.text
                time.sleep(0.1)
            assert back is not None and back.status_code == 200, back.text if back else None
            time.sleep(0.5)
        assert server.proc.poll() is None, server.output()
        rows = {r["name"]: r for r in index or []}
        assert rows["tiny-series"]["state"] == "UNAVAILABLE", index
        assert "crash loop" in rows["tiny-series"]["reason"], index
        assert "--engine-restart-backoff-s" in rows["tiny-series"]["reason"], index
        assert rows["tiny-clf"]["state"] == "READY", index
        metrics = httpx.get(f"{url}/metrics", timeout=10).text
        assert counts(metrics, "seqserve_engine_restarts_total", "reason") == {"exit": 6.0}
        server.proc.send_signal(signal.SIGTERM)
        assert server.proc.wait(timeout=60) == 0
    _others_served_while_sessions_503(load)
    assert load.no_retry_after == 0, load.tally


def test_engine_backoff_doubles_from_the_second_death_and_is_capped() -> None:
    assert [engine_backoff_s(n, 0.5) for n in range(1, 6)] == [0.0, 0.5, 1.0, 2.0, 4.0]
    assert engine_backoff_s(40, 0.5) == ENGINE_BACKOFF_MAX_S
    assert engine_backoff_s(10_000, 1.0) == ENGINE_BACKOFF_MAX_S


def test_five_api_process_deaths_in_thirty_seconds_end_the_server_non_zero(
        session_repo: Path) -> None:
    """The API processes keep the crash-loop rule that ends the server."""
    with serve(session_repo, "--layout", "hybrid", "--api-workers", "2") as server:
        killed: set[int] = set()
        deadline = time.monotonic() + 60
        while server.proc.poll() is None and time.monotonic() < deadline:
            for pid, role in server.children().items():
                if role == "api" and pid not in killed and len(killed) < 5:
                    killed.add(pid)
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.05)
        code = server.proc.wait(timeout=60)
        assert code != 0, server.output()
        assert len(killed) == 5, killed
        assert "5 deaths of API processes" in server.output()
        assert not server.children()


def _others_served_while_sessions_503(load: Load) -> Counter[str]:
    """The classifier answered 200 throughout (the other models never stopped) while the
    session model answered 200 or 503, some 503; the session model's tally."""
    classify, session = load.tally["classify"], load.tally["session"]
    assert set(classify) == {"200"}, load.tally
    assert classify["200"] >= 20, load.tally
    assert set(session) <= {"200", "503"}, load.tally
    assert session["503"] >= 1, load.tally
    return session
