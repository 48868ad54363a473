"""Server processes: SIGTERM under load loses nothing; the ONNX path runs without torch."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import httpx
from service_fakes import free_port

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
MODEL = "tiny-clf"


def _wait_ready(proc: subprocess.Popen[bytes], base: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"server exited: {proc.stdout.read().decode()[-3000:]}")  # type: ignore[union-attr]
        try:
            if httpx.get(f"{base}/v2/health/ready", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise AssertionError("server not ready in time")


def _in_flight(base: str) -> float:
    for line in httpx.get(f"{base}/metrics", timeout=5).text.splitlines():
        if line.startswith(f'seqserve_in_flight_requests{{model="{MODEL}"}}'):
            return float(line.split()[-1])
    return 0.0


SLOW_SERVER = """
import sys
sys.path.insert(0, {here!r})
from service_fakes import FakeRuntime, fake_factory
from seqserve.service.server.app import create_app
from seqserve.service.web.settings import Settings
from seqserve.service.server.shutdown import build_server
settings = Settings(repo={repo!r}, port={port}, grpc_port=0, warmup=False, max_batch_size=16,
                    max_wait_ms=0,
                    queue_size=512, drain_timeout_s=20, shutdown_delay_s=1.5, log_level="warning")
app = create_app(settings, fake_factory(FakeRuntime(delay_s=1.0)))
build_server(app, app.state.seqserve).run()
print("EXITED CLEANLY", flush=True)
"""


def test_sigterm_under_load_loses_no_admitted_request(tiny_repo: Path) -> None:
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    script = SLOW_SERVER.format(here=str(HERE), repo=str(tiny_repo), port=port)
    proc = subprocess.Popen([sys.executable, "-c", textwrap.dedent(script)], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        _wait_ready(proc, base)

        async def scenario() -> tuple[list[int], list[int | str], int, float]:
            limits = httpx.Limits(max_connections=100)
            async with httpx.AsyncClient(base_url=base, timeout=30, limits=limits) as c:
                admitted = [asyncio.ensure_future(c.post(f"/v1/models/{MODEL}/classify",
                                                         json={"texts": [f"one {i}"]}))
                            for i in range(64)]
                deadline = time.monotonic() + 60
                while (n := await asyncio.to_thread(_in_flight, base)) < 64:
                    # the metrics poll runs off the loop, so the 64 requests keep being sent
                    assert time.monotonic() < deadline, f"only {n} of 64 requests in flight"
                    assert not any(f.done() for f in admitted), [
                        f.result().status_code for f in admitted if f.done()
                        and not f.exception()]
                    await asyncio.sleep(0.02)
                proc.send_signal(signal.SIGTERM)
                t0 = time.monotonic()
                await asyncio.sleep(0.1)
                ready = httpx.get(f"{base}/v2/health/ready", timeout=5).status_code
                # new work on new connections during the shutdown delay: served as usual,
                # each answer closing its connection (sent at once: a refusal would fail them)
                async with httpx.AsyncClient(base_url=base, timeout=30) as fresh:
                    late = await asyncio.gather(*(
                        fresh.post(f"/v1/models/{MODEL}/classify", json={"texts": ["late"]})
                        for _ in range(3)))
                done = await asyncio.gather(*admitted)
                await asyncio.sleep(max(0.0, t0 + 2.0 - time.monotonic()))
                try:  # after the delay: the listener is closed
                    httpx.get(f"{base}/v2/health/live", timeout=5)
                    after = "answered"
                except httpx.ConnectError:
                    after = "refused"
                return [r.status_code for r in done], late, ready, t0, after

        codes, late, ready, t0, after = asyncio.run(scenario())
        rc = proc.wait(timeout=30)
        exit_s = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            proc.kill()
    out = proc.stdout.read().decode()  # type: ignore[union-attr]
    assert codes == [200] * 64, out[-2000:]
    assert ready == 503
    assert [r.status_code for r in late] == [200] * 3
    assert all(r.headers["connection"] == "close" for r in late)
    assert after == "refused"
    assert rc == 0 and "EXITED CLEANLY" in out, out[-2000:]
    assert exit_s < 20


BLOCK_TORCH = """
import importlib.abc, sys
class _NoTorch(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            raise ImportError("torch is blocked in this test")
        return None
sys.meta_path.insert(0, _NoTorch())
"""


def test_onnx_serving_path_runs_without_torch(tiny_repo: Path, tmp_path: Path) -> None:
    (tmp_path / "sitecustomize.py").write_text(BLOCK_TORCH)
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}",
           "SEQSERVE_WARMUP": "false", "SEQSERVE_LOG_LEVEL": "warning"}
    check = subprocess.run([sys.executable, "-c", "import torch"], env=env, capture_output=True)
    assert check.returncode != 0 and b"blocked" in check.stderr  # the blocker works
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen(
        [sys.executable, "-m", "seqserve.cli", "serve", "--repo", str(tiny_repo),
         "--port", str(port), "--grpc-port", "0"], cwd=ROOT, env=env, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT)
    try:
        _wait_ready(proc, base)
        r = httpx.post(f"{base}/v1/models/{MODEL}/classify",
                       json={"texts": ["one two", "vingt"], "return_attention": True}, timeout=30)
        assert r.status_code == 200, r.text
        assert len(r.json()["results"]) == 2
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
