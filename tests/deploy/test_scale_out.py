"""Scale-out without sticky routing (issue 36), shown with real processes: two `seqserve
serve` replicas with the same bundle and state secret (one in the engine layout, where the
state crosses into the engine process; one a single process) behind nginx round robin with
no affinity. The bundles are built in the test session (tests/conftest.py): tiny-series, a
stateful GRU sequence-tagger (3 features, normalisation and output scale), and endless-lm, a
tiny LM that never draws eos. A client streams a generated 250-step series (far beyond the
bundle's limits.max_steps for one request) in chunks carried by state tokens: the chunks
alternate replicas, one replica is killed mid-way (SIGKILL) and the client goes on through
the balancer with nothing lost; the outputs equal one whole-series request (the first
max_steps steps), a server-held session on one replica over the whole series and the eager
module over the whole series, within 1e-5. An endless-lm generation carried in turns the
same way (greedy) equals one uninterrupted generation.

nginx is Debian's (`deploy/install-test-tools.sh` installs it); the test skips, saying so,
only when the binary is missing."""

from __future__ import annotations

import contextlib
import json
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from process_support import Server, serve
from series_support import SCALE, GRUForecaster, eager_series, init, raw_series
from service_fakes import free_port

MODEL = "tiny-series"
LM = "endless-lm"
STEPS = 250


def _nginx() -> str:
    found = shutil.which("nginx") or next(
        (p for p in ("/usr/sbin/nginx", "/usr/local/sbin/nginx") if Path(p).exists()), None)
    if found is None:
        pytest.skip("nginx is not installed (deploy/install-test-tools.sh installs Debian's "
                    "nginx): the scale-out test needs a real load balancer")
    return found


NGINX_CONF = """
daemon off;
master_process on;
worker_processes 1;
pid {dir}/nginx.pid;
error_log stderr warn;
events {{ worker_connections 64; }}
http {{
    access_log off;
    client_body_temp_path {dir}/body;
    proxy_temp_path {dir}/proxy;
    fastcgi_temp_path {dir}/fastcgi;
    uwsgi_temp_path {dir}/uwsgi;
    scgi_temp_path {dir}/scgi;
    upstream replicas {{
        # round robin, no affinity (no ip_hash, no hash on a session header)
        server 127.0.0.1:{a} max_fails=1 fail_timeout=60s;
        server 127.0.0.1:{b} max_fails=1 fail_timeout=60s;
    }}
    server {{
        listen 127.0.0.1:{port};
        client_max_body_size 16m;
        location / {{
            proxy_pass http://replicas;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_next_upstream error timeout;
            add_header X-Upstream $upstream_addr always;
        }}
    }}
}}
"""


@contextlib.contextmanager
def balancer(tmp: Path, replicas: list[str]) -> Iterator[str]:
    """nginx round robin over the replicas' URLs on a free port; yields its URL."""
    binary = _nginx()
    port = free_port()
    a, b = (u.rsplit(":", 1)[1] for u in replicas)
    conf = tmp / "nginx.conf"
    conf.write_text(NGINX_CONF.format(dir=tmp, a=a, b=b, port=port))
    proc = subprocess.Popen([binary, "-p", str(tmp), "-e", "stderr", "-c", str(conf)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 20
        while True:
            if proc.poll() is not None:
                out = proc.stdout.read().decode() if proc.stdout else ""
                raise AssertionError(f"nginx exited: {out}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{url}/v2/health/ready", timeout=1).status_code == 200:
                    break
            assert time.monotonic() < deadline, "nginx did not answer in time"
            time.sleep(0.05)
        yield url
    finally:
        proc.send_signal(signal.SIGQUIT)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory, tiny_series_repo: Path) -> Path:
    """A copy of the session's tiny-series bundle (the shared folder is never changed)."""
    repo = tmp_path_factory.mktemp("scale-out") / "repo"
    shutil.copytree(tiny_series_repo / MODEL, repo / MODEL)
    return repo


@pytest.fixture(scope="module")
def max_steps(repo: Path) -> int:
    """The bundle's limit on one request's steps (limits.max_steps in its manifest)."""
    manifest = json.loads((repo / MODEL / "1" / "manifest.json").read_text())
    steps = int(manifest["limits"]["max_steps"])
    assert 2 <= steps < STEPS // 8, steps  # many chunks, a kill mid-way
    return steps


@pytest.fixture(scope="module")
def series() -> np.ndarray:
    """A raw 3-feature series of STEPS steps, (250, 3)."""
    return raw_series(np.random.default_rng(2284), STEPS)


def _post(url: str, body: dict[str, Any], retries: int = 3) -> tuple[dict[str, Any], str]:
    """One predict through `url`: its answer and the replica that gave it. A 502/503 (a
    replica that died while nginx had the request) is retried: the token makes it safe."""
    for attempt in range(retries + 1):  # nginx passes a refused connection on by itself
        r = httpx.post(f"{url}/v1/models/{MODEL}/predict", json=body, timeout=60)
        if r.status_code in (502, 503, 504) and attempt < retries:
            time.sleep(0.2)
            continue
        assert r.status_code == 200, r.text
        out: dict[str, Any] = r.json()
        return out, r.headers.get("x-upstream", "")
    raise AssertionError("unreachable")


def _session_reference(url: str, series: np.ndarray, chunk: int) -> np.ndarray:
    """The whole series through a server-held session on one replica, `chunk` steps a
    request (the bundle's step limit)."""
    outs = []
    for a in range(0, len(series), chunk):
        b = min(a + chunk, len(series))
        body = {"series": [series[a:b].tolist()], "session": "reference", "start": a == 0,
                "end": b == len(series)}
        r = httpx.post(f"{url}/v1/models/{MODEL}/predict", json=body, timeout=60)
        assert r.status_code == 200, r.text
        outs.append(np.asarray(r.json()["results"][0]["outputs"]))
    return np.concatenate(outs)


def _close(got: np.ndarray, want: np.ndarray) -> None:
    assert got.shape == want.shape
    assert np.abs(got - want).max() <= 1e-5 * max(1.0, float(np.abs(want).max()))


def test_a_series_carried_by_tokens_survives_round_robin_and_a_dead_replica(
        repo: Path, series: np.ndarray, max_steps: int, tmp_path: Path) -> None:
    _nginx()
    secret = tmp_path / "state-secret"
    secret.write_text("scale-out-test-secret-0123456789abcdef\n")
    flags = ("--state-secret-file", str(secret), "--no-grpc")
    with serve(repo, *flags, "--layout", "engine", "--api-workers", "1") as engine, \
            serve(repo, *flags, "--api-workers", "0") as single:
        replicas: list[Server] = [engine, single]
        lb_dir = tmp_path / "nginx"
        lb_dir.mkdir()
        with balancer(lb_dir, [s.url for s in replicas]) as lb:
            whole = httpx.post(f"{engine.url}/v1/models/{MODEL}/predict",
                               json={"series": [series[:max_steps].tolist()]}, timeout=60)
            assert whole.status_code == 200, whole.text
            reference = _session_reference(engine.url, series, max_steps)
            token: str | None = None
            outs, seen = [], []
            # chunks of max_steps - 1: they end at other places than the session's
            chunk = max_steps - 1
            chunks = list(range(0, len(series), chunk))
            killed_at = len(chunks) // 2
            for i, a in enumerate(chunks):
                if i == killed_at:  # mid-way: the single-process replica dies at once
                    single.proc.kill()
                    single.proc.wait(10)
                b = min(a + chunk, len(series))
                body: dict[str, Any] = {"series": [series[a:b].tolist()],
                                        "return_state": True}
                if token is not None:
                    body["state"] = token
                answer, upstream = _post(lb, body)
                assert answer["steps"] == b, answer["steps"]
                token = answer["results"][0]["state"]
                outs.append(np.asarray(answer["results"][0]["outputs"]))
                seen.append(upstream)
    before, after = seen[:killed_at], seen[killed_at:]
    ports = {u.rsplit(":", 1)[1] for u in (engine.url, single.url)}
    assert {s.rsplit(":", 1)[-1] for s in before} == ports, before
    assert all(x != y for x, y in zip(before, before[1:], strict=False)), before  # alternating
    survivor = engine.url.rsplit(":", 1)[1]
    assert all(s.rsplit(":", 1)[-1] == survivor for s in after), after
    # one request went to the dead replica first; nginx passed it on (upstream "dead, alive")
    assert sum("," in s for s in after) == 1, after
    got = np.concatenate(outs)  # (STEPS, 1)
    _close(got[:max_steps], np.asarray(whole.json()["results"][0]["outputs"]))
    _close(got, reference)
    # the whole series at once, which no single request may send: the eager module that
    # tests/series_support.py pack_tiny_series packed, from zero state
    _close(got, eager_series(init(GRUForecaster()), series, scale=SCALE))


def _generate(url: str, body: dict[str, Any]) -> tuple[dict[str, Any], str]:
    for attempt in range(4):  # a 502/503 while a replica dies: the token makes a retry safe
        r = httpx.post(f"{url}/v1/models/{LM}/generate", json=body, timeout=120)
        if r.status_code in (502, 503, 504) and attempt < 3:
            time.sleep(0.2)
            continue
        assert r.status_code == 200, r.text
        out: dict[str, Any] = r.json()
        return out, r.headers.get("x-upstream", "")
    raise AssertionError("unreachable")


def test_a_generation_carried_in_turns_survives_round_robin_and_a_dead_replica(
        tmp_path: Path, endless_lm_repo: Path) -> None:
    """endless-lm (never draws eos, max 48 tokens), greedy: four turns of 6 tokens, each
    continuing the last turn's token on the next replica (one killed after the second
    turn), equal one 24-token generation."""
    _nginx()
    repo = tmp_path / "repo"
    shutil.copytree(endless_lm_repo / LM, repo / LM)
    secret = tmp_path / "state-secret"
    secret.write_text("scale-out-test-secret-0123456789abcdef\n")
    flags = ("--state-secret-file", str(secret), "--no-grpc")
    prompt = "twenty one"
    options = {"temperature": 0, "logprobs": True, "max_new_tokens": 6}
    with serve(repo, *flags, "--layout", "engine", "--api-workers", "1") as engine, \
            serve(repo, *flags, "--api-workers", "0") as single:
        lb_dir = tmp_path / "nginx"
        lb_dir.mkdir()
        with balancer(lb_dir, [engine.url, single.url]) as lb:
            whole, _ = _generate(engine.url, {"prompt": prompt, **options,
                                              "max_new_tokens": 24})
            want = whole["results"][0]["tokens"]
            # endless-lm never draws eos: all 24 tokens, within its 48-token limit
            assert len(want) == 24 and whole["results"][0]["finish_reason"] == "length", whole
            got: list[str] = []
            seen = []
            token: str | None = None
            for turn in range(4):
                if turn == 2:
                    single.proc.kill()
                    single.proc.wait(10)
                body: dict[str, Any] = {"prompt": prompt if token is None else "",
                                        **options, "return_state": True}
                if token is not None:
                    body["state"] = token
                answer, upstream = _generate(lb, body)
                result = answer["results"][0]
                got += result["tokens"]
                token = result["state"]
                seen.append(upstream)
                if result["finish_reason"] != "length":
                    break
    assert got == want[: len(got)] and len(got) == len(want), (got, want)
    assert len({s.split(",")[0] for s in seen[:2]}) == 2, seen  # both replicas answered
