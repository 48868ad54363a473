"""`seqserve serve` in a subprocess for tests: start it, wait until ready, find its children,
stop it (SIGTERM, then kill)."""

from __future__ import annotations

import collections
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families
from service_fakes import SERVE_REPO_WAIT_S, free_port

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Server:
    proc: subprocess.Popen[bytes]
    url: str
    grpc: str = ""
    """The gRPC front's host:port (empty: off, or a port the flags chose)."""

    def children(self) -> dict[int, str]:
        """pid -> role ("engine" | "api") of the supervisor's live children."""
        out = {}
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            with contextlib.suppress(OSError):
                state, ppid = _stat(int(entry.name))
                if ppid == self.proc.pid and state != "Z":
                    cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
                    out[int(entry.name)] = "engine" if "seqserve.service.engine" in cmd else "api"
        return out

    def output(self) -> str:
        return self.proc.stdout.read().decode()[-4000:] if self.proc.stdout else ""  # type: ignore[union-attr]


def _stat(pid: int) -> tuple[str, int]:
    """(state, parent pid) of `pid` from /proc (OSError when there is no such process)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return fields[0], int(fields[1])


def running(pid: int) -> bool:
    """Whether `pid` is a process that has not exited (a zombie has)."""
    try:
        return _stat(pid)[0] != "Z"
    except OSError:
        return False


def wait_ready(server: Server, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.proc.poll() is not None:
            raise AssertionError(f"server exited: {server.output()}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{server.url}/v2/health/ready", timeout=1).status_code == 200:
                return
        time.sleep(0.1)
    raise AssertionError("server not ready in time")


@contextlib.contextmanager
def serve(repo: Path, *flags: str, queue_wait: bool = True) -> Iterator[Server]:
    """`seqserve serve` over `repo` as a subprocess on free ports, one intra-op thread, no
    warm-up, no shutdown delay unless `flags` set one. Its requests may wait
    SERVE_REPO_WAIT_S before admission refuses them, unless `flags` set
    --max-queue-wait-s or `queue_wait` is False (the server's own default): on the 2-core CI
    machine shared with other test workers, a host stall of a second under a test's load got
    a request refused as waiting past the default 0.5 s (a 429 no such test is about)."""
    own_wait = queue_wait and "--max-queue-wait-s" not in flags
    port = free_port()
    grpc_port = port
    while grpc_port == port:  # a free port of its own for gRPC (never Triton's 8001 here)
        grpc_port = free_port()
    own_grpc = not {"--grpc-port", "--no-grpc"} & set(flags)
    env = {**os.environ, "SEQSERVE_LOG_LEVEL": "warning"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "seqserve.cli", "serve", "--repo", str(repo), "--port",
         str(port), "--no-warmup", "--intra-op-threads", "1",
         *(() if "--shutdown-delay-s" in flags else ("--shutdown-delay-s", "0")),
         *(("--max-queue-wait-s", str(SERVE_REPO_WAIT_S)) if own_wait else ()),
         *(("--grpc-port", str(grpc_port)) if own_grpc else ()), *flags],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    server = Server(proc, f"http://127.0.0.1:{port}",
                    f"127.0.0.1:{grpc_port}" if own_grpc else "")
    try:
        wait_ready(server)
        yield server
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def counts(metrics: str, name: str, label: str) -> dict[str, float]:
    out: dict[str, float] = collections.defaultdict(float)
    for family in text_string_to_metric_families(metrics):
        for s in family.samples:
            if s.name == name:
                out[s.labels.get(label, "")] += s.value
    return out


def in_flight(url: str) -> float:
    metrics = httpx.get(f"{url}/metrics", timeout=5).text
    return sum(counts(metrics, "seqserve_in_flight_requests", "model").values())
