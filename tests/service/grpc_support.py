"""The server process's own server (`build_server`: uvicorn with graceful drain and the gRPC
front) in a thread, on free 127.0.0.1 ports, for the gRPC tests."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from seqserve.service.server.shutdown import DrainingServer, build_server


@dataclass
class Running:
    server: DrainingServer
    thread: threading.Thread
    url: str
    """The HTTP base URL."""
    grpc: str
    """The gRPC address, host:port."""


@contextlib.contextmanager
def serve_with_grpc(app: Any, timeout_s: float = 60.0) -> Iterator[Running]:
    """`app` (its settings with `grpc_port=0`) served by `build_server` in a thread: HTTP on
    a free port, gRPC on the free port it binds; stopped (drained) on exit."""
    state = app.state.seqserve
    assert state.settings.grpc and state.settings.grpc_port == 0
    server = build_server(app, state)
    server.config.log_level = "warning"
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout_s
    while not (server.started and server.grpc is not None and server.grpc.port):
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("server did not start")
        time.sleep(0.02)
    try:
        yield Running(server, thread, f"http://127.0.0.1:{port}",
                      f"127.0.0.1:{server.grpc.port}")
    finally:
        server.should_exit = True
        thread.join(30)
        sock.close()
