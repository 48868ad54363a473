"""`seqserve serve` serves gRPC beside HTTP in its real process layouts: the one-process server
(`--api-workers 0`) and two API processes (the replicated layout), each of which binds the
gRPC port (SO_REUSEPORT: two listening sockets on one port); `--no-grpc` binds none. The
supervisor's SIGTERM stops it cleanly (status 0). A gRPC port another server listens on,
even with SO_REUSEPORT, fails the start in both layouts (never a shared port)."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from process_support import ROOT, serve
from service_fakes import free_port

grpcclient = pytest.importorskip("tritonclient.grpc")

MODEL = "tiny-clf"


def listeners(port: int) -> int:
    """Listening TCP sockets on `port`, from /proc/net/tcp and tcp6 (grpc listens on
    127.0.0.1 as an IPv4-mapped IPv6 socket)."""
    count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            if state == "0A" and int(local.rsplit(":", 1)[1], 16) == port:
                count += 1
    return count


def infer(address: str) -> np.ndarray:
    client = grpcclient.InferenceServerClient(url=address)
    assert client.is_server_ready() and client.is_model_ready(MODEL)
    inp = grpcclient.InferInput("text", [2], "BYTES")
    inp.set_data_from_numpy(np.array(["one two", "cent"], dtype=object))
    probs: np.ndarray = client.infer(MODEL, [inp]).as_numpy("probabilities")
    client.close()
    return probs


@pytest.mark.parametrize("flags", [("--api-workers", "0"),
                                   ("--api-workers", "2", "--layout", "replicated")],
                         ids=["one-process", "two-api-processes"])
def test_every_api_process_serves_grpc(tiny_repo: Path, flags: tuple[str, ...]) -> None:
    with serve(tiny_repo, *flags) as server:
        port = int(server.grpc.rsplit(":", 1)[1])
        want = 2 if "2" in flags else 1
        deadline = time.monotonic() + 60  # ready once one API process is: the other loads
        while listeners(port) < want and time.monotonic() < deadline:
            time.sleep(0.1)
        assert listeners(port) == want
        first = infer(server.grpc)
        for _ in range(5):  # new connections, spread over the processes by the kernel
            assert np.array_equal(infer(server.grpc), first)
        server.proc.send_signal(signal.SIGTERM)
        assert server.proc.wait(timeout=30) == 0, server.output()
    assert listeners(port) == 0


def test_no_grpc_binds_nothing(tiny_repo: Path) -> None:
    with serve(tiny_repo, "--api-workers", "0", "--no-grpc", "--grpc-port", "1") as server:
        assert server.grpc == "" and listeners(1) == 0


@pytest.mark.parametrize("workers", ["0", "2"])
def test_a_grpc_port_another_server_holds_fails_the_start(tiny_repo: Path,
                                                          workers: str) -> None:
    with socket.socket() as other:  # another server's listener, with SO_REUSEPORT as grpc's
        other.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        other.bind(("127.0.0.1", 0))
        other.listen()
        port = other.getsockname()[1]
        run = subprocess.run(
            [sys.executable, "-m", "seqserve.cli", "serve", "--repo", str(tiny_repo), "--port",
             str(free_port()), "--grpc-port", str(port), "--api-workers", workers,
             "--layout", "replicated", "--no-warmup", "--log-level", "warning"],
            cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert listeners(port) == 1  # its own only
    assert run.returncode != 0
    assert f"cannot bind 127.0.0.1:{port}" in run.stderr, run.stderr[-2000:]
