"""`seqserve serve` as users run it: a supervisor, API processes and (in the engine layout, or
the hybrid one with bundles that keep sessions) one engine process.

Real processes on 127.0.0.1 with the tiny bundles: every task answers through the engine;
/metrics of any API process reports every process; a killed API process is replaced; a dead
engine is restarted (test_engine_restart.py: the rest of it); SIGTERM under load loses
nothing admitted.
"""

from __future__ import annotations

import asyncio
import collections
import json
import os
import re
import shutil
import signal
import time
from pathlib import Path
from typing import Any

import httpx
import load_support
import pytest
from process_support import counts, in_flight, running, serve, wait_ready
from server_support import RawConnection

from seqserve.service.core.process import YOUNG_COLLECTION_THRESHOLD


def classify_on_new_connections(url: str, n: int) -> None:
    """`n` classify requests, a new connection each (so every API process gets some), each a
    200 with its top 2."""
    for i in range(n):
        r = httpx.post(f"{url}/v1/models/tiny-clf/classify",
                       json={"texts": [f"one two {i}"], "top_k": 2}, timeout=30)
        assert r.status_code == 200 and len(r.json()["results"][0]["top_k"]) == 2


def kill_and_replace_an_api_process(server: Any) -> None:
    """SIGKILL one of the two API processes; wait until the supervisor has replaced it and
    the server is ready."""
    victim = min(pid for pid, role in server.children().items() if role == "api")
    os.kill(victim, signal.SIGKILL)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        api = {pid for pid, role in server.children().items() if role == "api"}
        if len(api) == 2 and victim not in api:
            break
        time.sleep(0.1)
    assert len(api) == 2 and victim not in api, api
    wait_ready(server)


def test_every_task_through_the_engine_and_metrics_of_every_process(
        tiny_full_repo: Path) -> None:
    with serve(tiny_full_repo, "--layout", "engine", "--api-workers", "2") as server:
        roles = sorted(server.children().values())
        assert roles == ["api", "api", "engine"], roles
        url = server.url
        n = 24
        classify_on_new_connections(url, n)
        tr = httpx.post(f"{url}/v1/models/tiny-mt/translate",
                        json={"texts": ["one two three"], "n_best": 2,
                              "return_attention": True}, timeout=30).json()["results"][0]
        assert len(tr["hypotheses"]) == 2 and tr["attention"]["weights"]
        tag = httpx.post(f"{url}/v1/models/tiny-tag/tag",
                         json={"texts": ["one hundred and five"]}, timeout=30).json()
        assert [t["token"] for t in tag["results"][0]["tokens"]] == ["one", "hundred", "and",
                                                                     "five"]
        v2 = httpx.post(f"{url}/v2/models/tiny-clf/infer", timeout=30, json={"inputs": [
            {"name": "text", "datatype": "BYTES", "shape": [1], "data": ["one"]}]})
        assert v2.status_code == 200
        bad = httpx.post(f"{url}/v1/models/tiny-clf/classify", json={"texts": ["\x00"]})
        assert bad.status_code == 400
        info = httpx.get(f"{url}/v1/models/tiny-clf").json()["versions"][0]["details"]
        assert info["runtime"] == "onnx" and info["instances"] >= 1
        metrics = httpx.get(f"{url}/metrics").text
    requests = counts(metrics, "seqserve_requests_total", "endpoint")
    assert requests["classify"] == n + 1 and requests["translate"] == 1  # all processes
    rows = counts(metrics, "seqserve_batch_size_count", "model")  # recorded by the engine
    assert rows["tiny-clf"] >= 1 and rows["tiny-tag"] >= 1 and rows["tiny-mt"] >= 1
    ready = counts(metrics, "seqserve_model_ready", "model")
    assert ready == {"tiny-clf": 1.0, "tiny-mt": 1.0, "tiny-tag": 1.0}


def test_the_replicated_layout_serves_every_task_with_no_engine_process(
        tiny_full_repo: Path) -> None:
    """`--layout replicated`: API processes only, each with its own models; every task is
    answered, /metrics of any of them reports all (batches included: recorded in each), and
    SIGTERM stops them all with status 0."""
    with serve(tiny_full_repo, "--layout", "replicated", "--api-workers", "2") as server:
        roles = sorted(server.children().values())
        assert roles == ["api", "api"], roles
        url = server.url
        n = 24
        classify_on_new_connections(url, n)
        tr = httpx.post(f"{url}/v1/models/tiny-mt/translate",
                        json={"texts": ["one two three"], "n_best": 2}, timeout=30)
        assert tr.status_code == 200 and len(tr.json()["results"][0]["hypotheses"]) == 2
        tag = httpx.post(f"{url}/v1/models/tiny-tag/tag",
                         json={"texts": ["one hundred and five"]}, timeout=30)
        assert tag.status_code == 200
        metrics = httpx.get(f"{url}/metrics").text
        server.proc.send_signal(signal.SIGTERM)
        assert server.proc.wait(timeout=30) == 0
    requests = counts(metrics, "seqserve_requests_total", "endpoint")
    assert requests["classify"] == n and requests["translate"] == 1 and requests["tag"] == 1
    batches = counts(metrics, "seqserve_batch_size_count", "model")
    assert batches["tiny-clf"] >= 1 and batches["tiny-tag"] >= 1
    ready = counts(metrics, "seqserve_model_ready", "model")
    assert ready == {"tiny-clf": 1.0, "tiny-mt": 1.0, "tiny-tag": 1.0}


def test_the_replicated_layout_refuses_sessions_it_cannot_keep(tiny_series_repo: Path) -> None:
    """With several API processes each holding its own models, a session's state would live
    in one of them: session requests get a 400 that says so; whole series are served."""
    step = [0.1, 0.2, 0.3]
    with serve(tiny_series_repo, "--layout", "replicated", "--api-workers", "2") as server:
        url = f"{server.url}/v1/models/tiny-series/predict"
        whole = httpx.post(url, json={"series": [[step, step]]}, timeout=30)
        assert whole.status_code == 200, whole.text
        chunk = httpx.post(url, json={"series": [[step]], "session": "s1", "start": True},
                           timeout=30)
        assert chunk.status_code == 400
        assert "replicated layout" in chunk.json()["error"]
        assert "--layout engine" in chunk.json()["error"]


@pytest.fixture(scope="module")
def mixed_repo(tmp_path_factory: pytest.TempPathFactory, tiny_repo: Path,
               tiny_series_repo: Path) -> Path:
    """tiny_repo's classifier and translator plus the stateful tiny-series bundle."""
    import shutil

    repo = tmp_path_factory.mktemp("mixed") / "repo"
    shutil.copytree(tiny_repo, repo)
    shutil.copytree(tiny_series_repo / "tiny-series", repo / "tiny-series")
    return repo


def test_the_default_layout_keeps_sessions_in_an_engine_and_the_rest_in_each_process(
        mixed_repo: Path) -> None:
    """The auto layout on a CPU is hybrid: two API processes, each with its own classifier
    and translator, and one engine process with the bundle that keeps sessions. A session's
    chunks, each on a new connection (so both API processes get some), continue one state,
    also after an API process was killed and replaced; every model is ready in /metrics;
    SIGTERM stops everything with status 0."""
    step = [0.1, 0.2, 0.3]
    with serve(mixed_repo, "--api-workers", "2") as server:
        roles = sorted(server.children().values())
        assert roles == ["api", "api", "engine"], roles
        url = f"{server.url}/v1/models/tiny-series/predict"
        first = httpx.post(url, json={"series": [[step]], "session": "s", "start": True},
                           timeout=30)
        assert first.status_code == 200, first.text
        for i in range(2, 9):
            r = httpx.post(url, json={"series": [[step]], "session": "s"}, timeout=30)
            assert r.status_code == 200 and r.json()["steps"] == i, r.text
        kill_and_replace_an_api_process(server)
        for i in range(9, 13):  # the state lives in the engine: no API process holds it
            r = httpx.post(url, json={"series": [[step]], "session": "s"}, timeout=30)
            assert r.status_code == 200 and r.json()["steps"] == i, r.text
        classify_on_new_connections(server.url, 8)
        tr = httpx.post(f"{server.url}/v1/models/tiny-mt/translate",
                        json={"texts": ["one two three"]}, timeout=30)
        assert tr.status_code == 200, tr.text
        config = httpx.get(f"{server.url}/v1/admin/config", timeout=30).json()
        listed = httpx.get(f"{server.url}/v1/models", timeout=30).json()["models"]
        metrics = httpx.get(f"{server.url}/metrics").text
        server.proc.send_signal(signal.SIGTERM)
        assert server.proc.wait(timeout=30) == 0
    where = {m["name"]: m["versions"][0]["details"]["runs_in"] for m in listed}
    assert where == {"tiny-clf": "api", "tiny-mt": "api", "tiny-series": "engine"}
    engine = config["engine"]
    assert engine["mode"].startswith("hybrid") and engine["options"]["bundles"] == "sessions"
    assert set(engine["models"]) == {"tiny-clf/1", "tiny-mt/1", "tiny-series/1"}
    assert config["api"]["settings"]["layout"] == "hybrid"
    ready = counts(metrics, "seqserve_model_ready", "model")
    assert ready == {"tiny-clf": 1.0, "tiny-mt": 1.0, "tiny-series": 1.0}
    batches = counts(metrics, "seqserve_batch_size_count", "model")
    assert batches["tiny-clf"] >= 1 and batches["tiny-series"] >= 1
    printed = server.output()
    assert re.search(r"^ +layout +hybrid +auto", printed, re.M), printed
    assert re.search(r"^ +max_live_hypotheses +256 +auto", printed, re.M), printed


def test_the_hybrid_layout_starts_no_engine_without_sessions(tiny_repo: Path) -> None:
    with serve(tiny_repo, "--layout", "hybrid", "--api-workers", "2") as server:
        assert sorted(server.children().values()) == ["api", "api"]
        classify_on_new_connections(server.url, 6)
        config = httpx.get(f"{server.url}/v1/admin/config", timeout=30).json()
    assert config["engine"]["mode"] == "in process"


def _link(fd: Path) -> str:
    try:
        return os.readlink(fd)
    except OSError:  # closed meanwhile
        return ""


def connections_held(server: Any) -> dict[int, int]:
    """How many established connections to the server's port each API process holds: the
    socket inodes of /proc/net/tcp, matched to each process's file descriptors."""
    port = int(server.url.rsplit(":", 1)[1])
    inodes = set()
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if int(fields[1].split(":")[1], 16) == port and fields[3] == "01":  # ESTABLISHED
            inodes.add(fields[9])
    held = {}
    for pid, role in server.children().items():
        if role == "api":
            held[pid] = sum(_link(fd).removeprefix("socket:[").rstrip("]") in inodes
                            for fd in Path(f"/proc/{pid}/fd").iterdir())
    return held


def wait_until_both_accept(server: Any, body: bytes) -> None:
    """Wait until each API process has taken a connection (one at a time, both idle: either
    may take it): after a replacement, readiness does not wait for the new process."""
    seen: set[int] = set()
    deadline = time.monotonic() + 60
    while len(seen) < 2 and time.monotonic() < deadline:
        c = RawConnection(server.url)
        assert c.request("POST", "/v1/models/tiny-clf/classify", body)[0] == 200
        seen |= {pid for pid, n in connections_held(server).items() if n}
        c.close()
    assert len(seen) == 2, seen


def test_new_connections_are_shared_evenly_by_the_api_processes(tiny_repo: Path) -> None:
    """A burst of keep-alive connections, opened before any is served, splits evenly over
    the two API processes (each takes a connection only while it holds no more than the
    other), also after an API process was replaced; every one is answered."""
    body = json.dumps({"texts": ["one two"]}).encode()
    with serve(tiny_repo, "--layout", "hybrid", "--api-workers", "2") as server:
        for burst in range(2):
            wait_until_both_accept(server, body)
            assert_a_burst_splits_evenly(server, body)
            if burst == 0:
                kill_and_replace_an_api_process(server)


def test_the_server_is_ready_once_every_api_process_accepts(tiny_repo: Path) -> None:
    """Readiness waits for every API process to accept (each slot reads STARTING until its
    process first accepts): a burst of keep-alive connections opened the moment the server
    says ready splits over both processes (the first process up took all of them, for as
    long as they lived)."""
    body = json.dumps({"texts": ["one two"]}).encode()
    with serve(tiny_repo, "--layout", "hybrid", "--api-workers", "2") as server:
        assert_a_burst_splits_evenly(server, body)


def assert_a_burst_splits_evenly(server: Any, body: bytes) -> None:
    """40 keep-alive connections opened at once, each sending one request before any is
    answered: all answered, held within 2 of each other by the two API processes."""
    conns = [RawConnection(server.url) for _ in range(40)]
    for c in conns:
        c.send("POST", "/v1/models/tiny-clf/classify", body)
    assert all(c.read_response()[0] == 200 for c in conns)
    held = connections_held(server)
    assert len(held) == 2 and sum(held.values()) == 40, held
    assert max(held.values()) - min(held.values()) <= 2, held
    for c in conns:
        c.close()


@pytest.mark.parametrize("layout", ["engine", "replicated"])
def test_a_killed_api_process_is_replaced(tiny_repo: Path, layout: str) -> None:
    """In the replicated layout the new process loads its own models, then serves."""
    with serve(tiny_repo, "--layout", layout, "--api-workers", "2") as server:
        kill_and_replace_an_api_process(server)
        for _ in range(8):
            r = httpx.post(f"{server.url}/v1/models/tiny-clf/classify",
                           json={"texts": ["one"]}, timeout=30)
            assert r.status_code == 200


def test_a_dead_engine_is_restarted(tiny_repo: Path) -> None:
    """(Issue 37: a dead engine used to end the server; now the supervisor restarts it, and
    test_engine_restart.py checks the rest.)"""
    with serve(tiny_repo, "--layout", "engine", "--api-workers", "1") as server:
        engine = next(pid for pid, role in server.children().items() if role == "engine")
        os.kill(engine, signal.SIGKILL)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            roles = {pid: role for pid, role in server.children().items() if pid != engine}
            if "engine" in roles.values():
                break
            time.sleep(0.1)
        assert "engine" in roles.values(), roles
        wait_ready(server)
        classify_on_new_connections(server.url, 2)
        assert server.proc.poll() is None


def test_a_killed_supervisor_leaves_no_process_behind(tiny_repo: Path) -> None:
    """`kill -9` of the supervisor (or the OOM killer): its API processes and engine stop too
    (they drain and exit), so nothing serves unsupervised and the port is free again."""
    with serve(tiny_repo, "--layout", "engine", "--api-workers", "2") as server:
        children = server.children()
        assert sorted(children.values()) == ["api", "api", "engine"], children
        server.proc.kill()
        server.proc.wait(timeout=10)
        deadline = time.monotonic() + 30
        while (alive := [pid for pid in children if running(pid)]) and \
                time.monotonic() < deadline:
            time.sleep(0.1)
        assert not alive, f"still running after the supervisor died: {alive}"
        with pytest.raises(httpx.ConnectError):  # nobody listens on the port any more
            httpx.get(f"{server.url}/v2/health/live", timeout=2)


def test_a_killed_engine_under_load_answers_503_until_its_restart(tiny_repo: Path) -> None:
    """SIGKILL of the engine under load (engine layout: every model runs there): every
    request in flight or sent after it is answered (503 + Retry-After, engine unavailable or
    model not ready; 2xx for what was done already), none reset or left hanging; the
    supervisor restarts the engine and the model answers again, the server never stops."""
    with serve(tiny_repo, "--layout", "engine", "--api-workers", "2") as server:
        result = asyncio.run(load_support.sigkill_engine(server, after_s=2.0))
    assert set(result["at_or_after_kill"]) <= {"2xx", "503"}, result
    assert result["at_or_after_kill"].get("503", 0) >= 10, result
    assert result["max_wait_after_kill_s"] < 3, result  # at once (1 s in quiet runs)
    assert result["served_again_s"] is not None, result
    assert result["exit"] is None, result


@pytest.mark.parametrize("layout", ["engine", "replicated"])
def test_sigterm_under_load_loses_nothing_admitted(tiny_repo: Path, layout: str) -> None:
    """Requests written on open connections before SIGTERM: every one gets its 200 (the
    shutdown delay serves new work as usual); none is reset or left unanswered. In both
    layouts (replicated: each API process drains its own models)."""
    total = 300
    body = json.dumps({"texts": ["one two three"] * 4}).encode()
    with serve(tiny_repo, "--layout", layout, "--api-workers", "2", "--max-batch-size", "1",
               "--queue-size", "2048", "--shutdown-delay-s", "0.5",
               "--max-queue-wait-s", "600", "--request-timeout-s", "600",
               ) as server:  # drain, not admission, here: 1200 rows of batch 1 on 1 instance
        # (replicated) at a cold estimate can exceed the default 30 s deadline and get 429s
        conns = [RawConnection(server.url) for _ in range(total)]
        try:
            for conn in conns:  # each connection accepted and answered once
                assert conn.request("GET", "/v2/health/live")[0] == 200
            for conn in conns:  # every request written before the signal
                conn.send("POST", "/v1/models/tiny-clf/classify", body,
                          {"content-type": "application/json"})
            admitted = 0.0
            deadline = time.monotonic() + 10
            while admitted < 50 and time.monotonic() < deadline:
                admitted = max(admitted, in_flight(server.url))
            server.proc.send_signal(signal.SIGTERM)
            answers = []
            for conn in conns:
                status, headers, _ = conn.read_response()
                answers.append(status)
                assert status != 503 or headers["retry-after"]
        finally:
            for conn in conns:
                conn.close()
        rc = server.proc.wait(timeout=60)
    tally = collections.Counter(answers)
    assert tally == {200: total}, tally
    assert admitted >= 50
    assert rc == 0


@pytest.mark.parametrize("layout", ["engine", "replicated"])
def test_a_rolling_update_under_load_sees_no_error(tiny_repo: Path, layout: str) -> None:
    """SIGTERM under load (keep-alive clients and new connections): during the shutdown
    delay every request, on a kept or a new connection, gets its 2xx (no 503, no reset, no
    hang), readiness is 503; after the delay new connections are refused (not left to hang
    in a listen queue nobody accepts from); the server exits 0. In both layouts."""
    delay = 2.0
    with serve(tiny_repo, "--layout", layout, "--api-workers", "2", "--shutdown-delay-s",
               str(delay)) as server:
        result = asyncio.run(load_support.sigterm(server, delay))
    assert set(result["before"]) == {"2xx"}, result
    assert set(result["delay"]) == {"2xx"}, result
    assert result["delay_fresh"]["2xx"] >= 5, result  # new connections were served too
    assert result["ready_during_delay"] == 503, result
    assert result["new_connection_after_delay"] == {"refused": 1}, result
    assert result["exit"] == 0, result


SAME = [("max_batch_size", "max_batch_size", 1), ("max_batch_tokens", "max_batch_tokens", 1),
        ("max_wait_ms", "max_wait_s", 1000), ("queue_size", "queue_size", 1),
        ("max_tokens", "max_tokens", 1), ("max_live_hypotheses", "max_live_hypotheses", 1),
        ("decode_groups", "decode_groups", 1),
        ("batch_overhead_tokens", "batch_overhead_tokens", 1),
        ("retry_after_s", "retry_after_s", 1), ("max_queue_wait_s", "max_queue_wait_s", 1),
        ("drain_timeout_s", "drain_timeout_s", 1), ("warmup", "warmup", 1)]
"""(setting of the API process, engine option, factor: setting = option x factor)."""


def _check_same_values(config: dict[str, Any]) -> None:
    api, engine = config["api"], config["engine"]
    settings, options = api["settings"], engine["options"]
    assert options == api["engine_options"]
    for setting, option, factor in SAME:
        assert settings[setting] == pytest.approx(options[option] * factor), setting
    for key in ("switch_interval_ms", "log_level"):  # what each process runs with
        assert api["process"][key] == engine["process"][key] == options["process"][key], key
    assert options["process"]["switch_interval_ms"] == settings["switch_interval_ms"]
    # both processes froze their start-up heap once loaded (no full-heap collection pauses)
    assert api["process"]["frozen_objects"] > 10_000 < engine["process"]["frozen_objects"]
    for process in (api["process"], engine["process"]):  # and collect the young less often
        assert process["gc_threshold"][0] == YOUNG_COLLECTION_THRESHOLD
    for name, model in engine["models"].items():  # each model's effective scheduling
        batcher, decode = model["batcher"], model["decode"]
        assert batcher["max_batch_size"] == settings["max_batch_size"], name
        assert batcher["queue_size"] == decode["max_queue"] == settings["queue_size"], name
        assert batcher["max_wait_s"] * 1000 == pytest.approx(settings["max_wait_ms"]), name
        assert decode["max_live_hypotheses"] == settings["max_live_hypotheses"], name
        assert decode["groups"] == settings["decode_groups"], name
        assert model["max_tokens"] <= settings["max_tokens"], name


def test_api_and_engine_processes_report_the_same_effective_values(
        tiny_full_repo: Path) -> None:
    """A server in the engine layout, the other settings at their defaults: GET
    /v1/admin/config shows the API process's settings and the engine process's options,
    which agree value for value, and both processes run with the same switch interval (the
    engine's batch threads too)."""
    from seqserve.service.web.settings import Settings

    with serve(tiny_full_repo, "--layout", "engine") as server:
        config = httpx.get(f"{server.url}/v1/admin/config", timeout=30).json()
        engine_pid = next(p for p, role in server.children().items() if role == "engine")
    api, engine = config["api"], config["engine"]
    assert engine["mode"] == "engine process" and engine["process"]["pid"] == engine_pid
    assert api["process"]["pid"] != engine_pid
    _check_same_values(config)
    for name in ("max_batch_size", "max_batch_tokens", "max_wait_ms", "queue_size",
                 "max_tokens", "switch_interval_ms"):
        assert api["settings"][name] == Settings.model_fields[name].default, name
    assert api["settings"]["decode_groups"] == 2  # auto in the engine layout
    assert api["settings"]["max_live_hypotheses"] == 256  # auto on a CPU
    assert set(engine["models"]) == {"tiny-clf/1", "tiny-mt/1", "tiny-tag/1"}


@pytest.mark.parametrize("flags", [("--api-workers", "0"), ("--api-workers", "1")])
def test_one_process_and_one_api_process_answer_alike(tiny_repo: Path, flags: tuple[str, str],
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """...and both print the speed settings at start, each with where it came from. With
    the auto layout: the one-process server is the engine layout in one process, one API
    process the hybrid layout with no engine (no bundle keeps sessions)."""
    from seqserve.service.server.layout import SPEED_SETTINGS, cores

    monkeypatch.setenv("SEQSERVE_MAX_WAIT_MS", "3")
    body = {"texts": ["one two three", "vingt et un"], "top_k": 3}
    with serve(tiny_repo, *flags, queue_wait=False) as server:  # its default, printed
        r = httpx.post(f"{server.url}/v1/models/tiny-clf/classify", json=body, timeout=30)
        expected_children = 0 if flags[1] == "0" else 1
        assert len(server.children()) == expected_children
        config = httpx.get(f"{server.url}/v1/admin/config", timeout=30).json()
    assert config["engine"]["mode"] == "in process"
    _check_same_values(config)
    assert r.status_code == 200
    scores = [t["probability"] for res in r.json()["results"] for t in res["top_k"]]
    assert len(scores) == 6 and all(0 <= s <= 1 for s in scores)
    printed = server.output()
    block = printed[printed.index("serving settings ("):].splitlines()
    rows = {line.split()[0]: line.split(maxsplit=2)[1:]
            for line in block[1:1 + len(SPEED_SETTINGS)]}
    assert list(rows) == list(SPEED_SETTINGS)
    assert rows["layout"][0] == ("engine" if flags[1] == "0" else "hybrid")
    assert rows["layout"][1].startswith(f"auto: {cores()} cores")
    assert rows["api_workers"] == [flags[1], "cli --api-workers"]
    assert rows["instances"][1].startswith(f"auto: {cores()} cores")
    assert rows["intra_op_threads"] == ["1", "cli --intra-op-threads"]  # process_support's
    assert rows["max_wait_ms"] == ["3.0", "env SEQSERVE_MAX_WAIT_MS"]
    assert rows["max_batch_size"] == ["16", "default"]
    assert rows["max_queue_wait_s"] == ["0.5", "default"]


def test_children_get_the_same_settings() -> None:
    from pydantic import SecretStr

    from seqserve.service.server.supervisor import settings_env
    from seqserve.service.web.settings import Settings

    given = Settings(providers=["A", "B"], truncate=True, max_texts=7, api_workers=3)
    env = settings_env(given)
    assert env["SEQSERVE_PROVIDERS"] == "A,B"
    assert "SEQSERVE_SHUTDOWN_DELAY_S" in env
    child = Settings(**{k.removeprefix("SEQSERVE_").lower(): v for k, v in env.items()
                        if k != "SEQSERVE_PROVIDERS"}, providers=env["SEQSERVE_PROVIDERS"])
    assert child == given
    assert "SEQSERVE_API_KEY" not in settings_env(Settings(api_key=SecretStr("k1\nk2")))
    assert "SEQSERVE_LOG_FORMAT" in settings_env(Settings()) and "SEQSERVE_API_KEY" not in \
        settings_env(Settings())


@pytest.mark.parametrize("given", ["inline", "at-file", "file"])
def test_no_child_gets_the_api_key_in_its_environment(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, given: str) -> None:
    """Before, every child got SEQSERVE_API_KEY (readable in /proc/PID/environ by the same
    user, and in crash reports); now each gets a file's path, the key read from the file."""
    from pydantic import SecretStr

    from seqserve.service.server.supervisor import Supervisor
    from seqserve.service.web.auth import key_matches, load_keys
    from seqserve.service.web.settings import Settings

    key = "s3cret-of-the-operator"
    keys = tmp_path / "keys"
    keys.write_text(key + "\n")
    monkeypatch.setenv("SEQSERVE_API_KEY", key)  # as an operator's environment may hold it
    options = {"inline": {"api_key": SecretStr(key)},
               "at-file": {"api_key": SecretStr(f"@{keys}")},
               "file": {"api_key": None, "api_key_file": keys}}[given]
    sup = Supervisor(Settings(repo=tmp_path, api_workers=2, instances=1, decode_groups=1,
                              **options))
    try:
        env = sup._env()
        assert all(key not in value for value in env.values())
        child = Settings(api_key=None, api_key_file=env["SEQSERVE_API_KEY_FILE"])
        path = Path(env["SEQSERVE_API_KEY_FILE"])
        assert key_matches(key.encode(), load_keys(child.api_key, child.api_key_file))
        if given == "inline":  # written to the server's private folder, for its user only
            assert path.parent == sup.workdir and path.stat().st_mode & 0o077 == 0
    finally:
        shutil.rmtree(sup.workdir, ignore_errors=True)
