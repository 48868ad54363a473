"""A real uvicorn server in a thread for tests (service and load-tool tests share it)."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any


@contextlib.contextmanager
def serve_app(app: Any, timeout_s: float = 60.0, **config: Any) -> Iterator[str]:
    """Run `app` (lifespan on) under uvicorn on a free 127.0.0.1 port in a thread; yield its URL."""
    import uvicorn

    # proto=IPPROTO_TCP: asyncio sets TCP_NODELAY on accepted sockets only when the listener
    # says so; with proto 0 every response pays Nagle + delayed ACK (~40 ms on Linux).
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    options: dict[str, Any] = {
        "log_level": "warning", "access_log": False, "lifespan": "on",
        "timeout_graceful_shutdown": 5,
    } | config  # fmt: skip
    server = uvicorn.Server(uvicorn.Config(app, **options))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout_s
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("server did not start")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(15)
        sock.close()
