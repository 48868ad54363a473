"""Stateful sessions of feature-sequence bundles (issue 21), on real servers with bundles packed
from tutorial-style modules initialised here (tests/series_support.py): a series sent in chunks
through a session equals the whole series sent at once (1e-5), for a GRU tagger and an LSTM
classifier, alone and with many clients' sessions in one batch; 409 for a second chunk in
flight, 404 for an unknown, ended or expired session, 429 beyond max_sessions, 400 for a
bundle without state; OIP's Triton parameters; through the engine process, where the state
survives the API process's restart. The store's rules alone: tests/service/scheduling/
test_session_store.py."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from series_support import (
    NORM,
    SCALE,
    GRUForecaster,
    LSTMSensorClassifier,
    TutorialLSTMTagger,
    eager_series,
    init,
    raw_series,
)
from service_fakes import serve_in_thread

import seqserve.pack
from seqserve.service.runtimes import load_runtime

GRID = {"batch_sizes": (1, 3), "lengths": (1, 7)}
LABELS = ["idle", "walk", "run"]


class Gate:
    """Holds the runtime's next call while `hold` is set (until `release`), and records the
    batch size of every feature-sequence call."""

    def __init__(self) -> None:
        self.hold = threading.Event()
        self.entered = threading.Event()
        self.opened = threading.Event()
        self.batches: list[int] = []

    def reset(self) -> None:
        self.hold.clear()
        self.entered.clear()
        self.opened.clear()
        self.batches.clear()

    def release(self) -> None:
        self.hold.clear()
        self.opened.set()


class GatedRuntime:
    def __init__(self, inner: Any, gate: Gate) -> None:
        self.inner, self.gate = inner, gate
        self.name, self.providers = inner.name, inner.providers

    def run(self, graph: str, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        self.gate.batches.append(len(inputs["lengths"]))
        if self.gate.hold.is_set():
            self.gate.entered.set()
            self.gate.opened.wait(30)
        out: dict[str, np.ndarray] = self.inner.run(graph, inputs)
        return out


@pytest.fixture(scope="module")
def packed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    repo = tmp_path_factory.mktemp("sessions") / "repo"
    gru = init(GRUForecaster())
    seqserve.pack.sequence_tagger(gru, features=3, outputs=1, normalization=NORM,
                                  output_scale=SCALE, repo=repo, name="gru", max_steps=32,
                                  progress=False, grid=GRID)
    lstm = init(LSTMSensorClassifier(), seed=1)
    seqserve.pack.sequence_classifier(lstm, features=3, labels=LABELS, normalization=NORM,
                                      repo=repo, name="lstm", max_steps=32, progress=False,
                                      grid=GRID)
    seqserve.pack.sequence_tagger(init(TutorialLSTMTagger(), seed=2), features=3, outputs=1,
                                  repo=repo, name="stateless", max_steps=32, progress=False,
                                  grid=GRID)
    return {"repo": repo, "gru": gru, "lstm": lstm}


def _server(repo: Path, gate: Gate | None = None, **overrides: Any
            ) -> contextlib.AbstractContextManager[str]:
    from seqserve.service.server.app import create_app
    from seqserve.service.web.settings import Settings

    settings = Settings(repo=repo, intra_op_threads=1, warmup=False, max_texts=8,
                        max_queue_wait_s=30.0, **overrides)
    def gated(spec: Any, path: Path, manifest: Any) -> Any:
        runtime = load_runtime(spec, path, manifest)
        return runtime if gate is None else GatedRuntime(runtime, gate)

    return serve_in_thread(create_app(settings, runtime_factory=gated))


@pytest.fixture(scope="module")
def gate() -> Gate:
    return Gate()


@pytest.fixture(scope="module")
def server(packed: dict[str, Any], gate: Gate) -> Iterator[str]:
    with _server(packed["repo"], gate) as url:
        yield url


@pytest.fixture()
def fresh_gate(gate: Gate) -> Iterator[Gate]:
    gate.reset()
    yield gate
    gate.release()
    gate.reset()


def _chunk(url: str, model: str, steps: np.ndarray, session: str, start: bool = False,
           end: bool = False, **extra: Any) -> httpx.Response:
    body = {"series": [steps.tolist()], "session": session, "start": start, "end": end, **extra}
    return httpx.post(f"{url}/v1/models/{model}/predict", json=body, timeout=60)


def _stream(url: str, model: str, series: np.ndarray, cuts: list[int], session: str
            ) -> list[dict[str, Any]]:
    """The series sent as chunks split at `cuts`; each chunk's answer."""
    bounds = [0, *cuts, len(series)]
    answers = []
    for i, (a, b) in enumerate(zip(bounds, bounds[1:], strict=False)):
        r = _chunk(url, model, series[a:b], session, start=i == 0,
                   end=i == len(bounds) - 2)
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["session"] == session and body["steps"] == b
        assert body["results"][0]["steps"] == b - a
        answers.append(body["results"][0])
    return answers


def _close(got: np.ndarray, want: np.ndarray) -> None:
    assert got.shape == want.shape
    assert np.abs(got - want).max() <= 1e-5 * max(1.0, float(np.abs(want).max()))


def _check_gru(packed: dict[str, Any], series: np.ndarray, answers: list[dict[str, Any]]
               ) -> None:
    got = np.concatenate([np.asarray(a["outputs"]) for a in answers])  # (T, 1)
    _close(got, eager_series(packed["gru"], series, scale=SCALE))


@pytest.mark.parametrize("cuts", [[5, 6, 17], [1], [31]])
def test_gru_chunks_equal_the_whole_series(server: str, packed: dict[str, Any],
                                           cuts: list[int]) -> None:
    series = raw_series(np.random.default_rng(len(cuts)), 32)
    answers = _stream(server, "gru", series, cuts, f"gru-{cuts}")
    _check_gru(packed, series, answers)
    whole = httpx.post(f"{server}/v1/models/gru/predict", json={"series": [series.tolist()]},
                       timeout=30).json()["results"][0]["outputs"]
    got = np.concatenate([np.asarray(a["outputs"]) for a in answers])
    _close(got, np.asarray(whole))


def test_lstm_chunks_equal_the_whole_series(server: str, packed: dict[str, Any]) -> None:
    """A many-to-one LSTM ((h, c) flattened into one state row): each chunk's answer is the
    classifier's answer on the whole series up to that chunk's end."""
    series = raw_series(np.random.default_rng(7), 30)
    cuts = [4, 5, 19]
    answers = _stream(server, "lstm", series, cuts, "lstm-1")
    for end, answer in zip([*cuts, 30], answers, strict=True):
        want = eager_series(packed["lstm"], series[:end])  # (3,)
        _close(np.asarray(answer["outputs"]), want)
        assert answer["label"] == LABELS[int(np.argmax(want))]


def test_an_ended_or_unknown_session_is_404_saying_to_restart(server: str) -> None:
    x = raw_series(np.random.default_rng(1), 3)
    r = _chunk(server, "gru", x, "never-started")
    assert r.status_code == 404
    assert "unknown" in r.json()["error"] and "start" in r.json()["error"]
    assert _chunk(server, "gru", x, "ends", start=True, end=True).status_code == 200
    assert _chunk(server, "gru", x, "ends").status_code == 404
    assert _chunk(server, "gru", x, "ends", start=True).status_code == 200  # restartable


def test_start_on_a_live_session_restarts_it(server: str, packed: dict[str, Any]) -> None:
    series = raw_series(np.random.default_rng(2), 12)
    assert _chunk(server, "gru", series[:7], "again", start=True).json()["steps"] == 7
    answers = _stream(server, "gru", series, [4], "again")  # start=True: from zeros
    _check_gru(packed, series, answers)


def test_a_second_chunk_in_flight_is_409(server: str, fresh_gate: Gate,
                                         packed: dict[str, Any]) -> None:
    series = raw_series(np.random.default_rng(3), 10)
    fresh_gate.hold.set()
    with ThreadPoolExecutor(1) as pool:
        first = pool.submit(_chunk, server, "gru", series[:6], "busy", True)
        assert fresh_gate.entered.wait(30)
        second = _chunk(server, "gru", series[6:], "busy")
        assert second.status_code == 409, second.text
        assert "in flight" in second.json()["error"]
        fresh_gate.release()
        assert first.result(30).status_code == 200
    last = _chunk(server, "gru", series[6:], "busy", end=True)  # the refused chunk, again
    assert last.status_code == 200 and last.json()["steps"] == 10
    got = np.concatenate([np.asarray(first.result().json()["results"][0]["outputs"]),
                          np.asarray(last.json()["results"][0]["outputs"])])
    _close(got, eager_series(packed["gru"], series, scale=SCALE))


def test_many_clients_sessions_share_batches(server: str, fresh_gate: Gate,
                                             packed: dict[str, Any]) -> None:
    """Six sessions' chunks queue behind a held batch, then run as one batch of six rows
    (each from its own state); every session equals its whole series."""
    rng = np.random.default_rng(5)
    series = [raw_series(rng, 20) for _ in range(6)]
    first = [_chunk(server, "gru", s[:3], f"many-{i}", start=True) for i, s in
             enumerate(series)]
    assert all(r.status_code == 200 for r in first)
    fresh_gate.hold.set()
    with ThreadPoolExecutor(7) as pool:
        blocker = pool.submit(_chunk, server, "gru", series[0][:2], "blocker", True, True)
        assert fresh_gate.entered.wait(30)
        fresh_gate.batches.clear()
        second = [pool.submit(_chunk, server, "gru", s[3:11], f"many-{i}")
                  for i, s in enumerate(series)]
        deadline = time.monotonic() + 30
        while _queue_depth(server, "gru") < 6 and time.monotonic() < deadline:
            time.sleep(0.02)
        fresh_gate.release()
        assert blocker.result(30).status_code == 200
        seconds = [f.result(30) for f in second]
    assert all(r.status_code == 200 for r in seconds), [r.text for r in seconds]
    assert fresh_gate.batches[:1] == [6]
    with ThreadPoolExecutor(6) as pool:  # the rest, concurrently, with different lengths
        thirds = list(pool.map(lambda i: _chunk(server, "gru", series[i][11 : 12 + i],
                                                f"many-{i}", end=True), range(6)))
    for i, s in enumerate(series):
        parts = [first[i], seconds[i], thirds[i]]
        assert thirds[i].json()["steps"] == 12 + i
        got = np.concatenate([np.asarray(r.json()["results"][0]["outputs"]) for r in parts])
        _close(got, eager_series(packed["gru"], s[: 12 + i], scale=SCALE))


def _queue_depth(url: str, model: str) -> float:
    from process_support import counts

    return counts(httpx.get(f"{url}/metrics", timeout=5).text, "seqserve_queue_depth",
                  "model").get(model, 0.0)


def test_session_id_from_the_header_and_a_stateless_bundle(server: str) -> None:
    x = raw_series(np.random.default_rng(6), 4)
    r = httpx.post(f"{server}/v1/models/gru/predict", headers={"X-Session-Id": "hdr"},
                   json={"series": [x.tolist()], "start": True}, timeout=30)
    assert r.status_code == 200 and r.json()["session"] == "hdr" and r.json()["steps"] == 4
    r = httpx.post(f"{server}/v1/models/gru/predict", headers={"X-Session-Id": "hdr"},
                   json={"series": [x.tolist()], "session": "other"}, timeout=30)
    assert r.status_code == 400 and "differ" in r.json()["error"]
    r = _chunk(server, "stateless", x, "s1", start=True)
    assert r.status_code == 400 and "serves no sessions" in r.json()["error"]
    r = httpx.post(f"{server}/v1/models/gru/predict",
                   json={"series": [x.tolist()], "end": True}, timeout=30)
    assert r.status_code == 400 and "session" in r.json()["error"]


def test_oip_sequence_parameters(server: str, packed: dict[str, Any]) -> None:
    series = raw_series(np.random.default_rng(8), 9)
    outs = []
    for i, (a, b) in enumerate([(0, 4), (4, 9)]):
        params: dict[str, Any] = {"sequence_id": 2**63 + 5, "sequence_start": i == 0,
                                  "sequence_end": i == 1}
        body = {"parameters": params, "inputs": [
            {"name": "features", "datatype": "FP32", "shape": [1, b - a, 3],
             "data": series[a:b].reshape(-1).tolist()}]}
        r = httpx.post(f"{server}/v2/models/gru/infer", json=body, timeout=30)
        assert r.status_code == 200, r.text
        answer = r.json()
        assert answer["parameters"] == {"sequence_id": 2**63 + 5, "sequence_steps": b}
        outs.append(np.asarray(answer["outputs"][0]["data"]).reshape(b - a, 1))
    _close(np.concatenate(outs), eager_series(packed["gru"], series, scale=SCALE))
    bad = httpx.post(f"{server}/v2/models/gru/infer", timeout=30, json={
        "parameters": {"sequence_id": "x", "sequence_start": "yes"},
        "inputs": [{"name": "features", "datatype": "FP32", "shape": [1, 1, 3],
                    "data": [1.0, 2.0, 3.0]}]})
    assert bad.status_code == 400 and "sequence_start" in bad.json()["error"]
    gone = httpx.post(f"{server}/v2/models/gru/infer", timeout=30, json={
        "parameters": {"sequence_id": "nobody"},
        "inputs": [{"name": "features", "datatype": "FP32", "shape": [1, 1, 3],
                    "data": [1.0, 2.0, 3.0]}]})
    assert gone.status_code == 404 and "unknown" in gone.json()["error"]


def _metric(url: str, name: str, model: str) -> float:
    from process_support import counts

    return counts(httpx.get(f"{url}/metrics", timeout=5).text, name, "model").get(model, 0.0)


def test_max_sessions_is_429_never_an_eviction(packed: dict[str, Any]) -> None:
    x = raw_series(np.random.default_rng(9), 2)
    with _server(packed["repo"], max_sessions=2) as url:
        assert _chunk(url, "gru", x, "a", start=True).status_code == 200
        assert _chunk(url, "gru", x, "b", start=True).status_code == 200
        full = _chunk(url, "gru", x, "c", start=True)
        assert full.status_code == 429 and "max_sessions" in full.json()["error"]
        assert full.headers["retry-after"]
        assert _chunk(url, "gru", x, "a").json()["steps"] == 4  # a and b live on
        assert _chunk(url, "gru", x, "b", end=True).status_code == 200
        assert _chunk(url, "gru", x, "c", start=True).status_code == 200  # b's slot
        assert _metric(url, "seqserve_live_sessions", "gru") == 2
        config = httpx.get(f"{url}/v1/admin/config", timeout=5).json()
        assert "max_sessions" in str(config) and "session_idle_timeout_s" in str(config)
        lifetime = _metric(url, "seqserve_session_lifetime_seconds_count", "gru")
        assert lifetime == 1


def test_idle_sessions_expire(packed: dict[str, Any]) -> None:
    x = raw_series(np.random.default_rng(10), 2)
    with _server(packed["repo"], session_idle_timeout_s=0.2) as url:
        assert _chunk(url, "gru", x, "idle", start=True).status_code == 200
        deadline = time.monotonic() + 30
        while (_metric(url, "seqserve_expired_sessions_total", "gru") < 1
               and time.monotonic() < deadline):
            time.sleep(0.05)
        assert _metric(url, "seqserve_expired_sessions_total", "gru") == 1
        assert _metric(url, "seqserve_live_sessions", "gru") == 0
        r = _chunk(url, "gru", x, "idle")
        assert r.status_code == 404 and "expired" in r.json()["error"]


def test_sessions_live_in_the_engine_and_survive_an_api_restart(packed: dict[str, Any]
                                                                 ) -> None:
    from process_support import serve, wait_ready

    series = raw_series(np.random.default_rng(11), 20)
    with serve(packed["repo"], "--layout", "engine", "--api-workers", "1") as server:
        first = _chunk(server.url, "gru", series[:8], "engine", start=True)
        assert first.status_code == 200, first.text
        victim = next(pid for pid, role in server.children().items() if role == "api")
        os.kill(victim, signal.SIGKILL)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            apis = [pid for pid, role in server.children().items() if role == "api"]
            if apis and victim not in apis:
                break
            time.sleep(0.1)
        wait_ready(server)
        last = _chunk(server.url, "gru", series[8:], "engine", end=True)
        assert last.status_code == 200, last.text
        assert last.json()["steps"] == 20
        _check_gru(packed, series, [first.json()["results"][0], last.json()["results"][0]])
        assert _chunk(server.url, "gru", series[:1], "engine").status_code == 404


def test_sessions_per_key_are_bounded(packed: dict[str, Any], tmp_path: Path) -> None:
    """--max-sessions-per-key: one API key (or, without keys, one client address) cannot take
    every slot of the session table: its sessions beyond the quota get 429 naming the quota,
    another key still gets slots, an ended session frees one; /metrics counts the refusals."""
    keys = tmp_path / "keys"
    keys.write_text("key-of-alice-0123\nkey-of-bob-456789\n")
    steps = np.zeros((2, 3), np.float32)

    def chunk(url: str, key: str, session: str, **flags: Any) -> httpx.Response:
        body = {"series": [steps.tolist()], "session": session, **flags}
        return httpx.post(f"{url}/v1/models/gru/predict", json=body, timeout=60,
                          headers={"Authorization": f"Bearer {key}"})

    with _server(packed["repo"], max_sessions_per_key=2, api_key_file=keys) as url:
        alice, bob = "key-of-alice-0123", "key-of-bob-456789"
        assert [chunk(url, alice, f"a{i}", start=True).status_code for i in range(2)] == \
            [200, 200]
        refused = chunk(url, alice, "a2", start=True)
        assert refused.status_code == 429 and "Retry-After" in refused.headers
        assert "max_sessions_per_key" in refused.json()["error"]
        assert chunk(url, alice, "a0").status_code == 200  # its live sessions go on
        assert chunk(url, alice, "a1", start=True).status_code == 200  # a restart: no new slot
        assert chunk(url, bob, "b0", start=True).status_code == 200  # another key: its own
        assert chunk(url, alice, "a0", end=True).status_code == 200
        assert chunk(url, alice, "a2", start=True).status_code == 200  # a slot freed
        assert chunk(url, alice, "once", start=True, end=True).status_code == 200  # no slot
        metrics = httpx.get(f"{url}/metrics", timeout=10).text
        assert 'reason="quota"' in metrics
    with _server(packed["repo"], max_sessions_per_key=1) as url:  # no keys: per address
        ok = _chunk(url, "gru", steps, "c0", start=True)
        assert ok.status_code == 200
        assert _chunk(url, "gru", steps, "c1", start=True).status_code == 429
