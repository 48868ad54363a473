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
    """Run `app` (lifespan on) under uvicorn on a free 127.0.0.1 port in a thread; yield its URL.
    An app whose settings say `front="native"` runs in the server's own `DrainingServer`
    with the native front instead."""
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
    state = getattr(getattr(app, "state", None), "seqserve", None)
    if state is not None and state.settings.front == "native":  # the server's own, native
        from seqserve.service.server.shutdown import build_server

        server: Any = build_server(app, state)
        server.grpc = None  # as uvicorn.Server here: HTTP only
    else:
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


class RawConnection:
    """One keep-alive HTTP/1.1 connection on a plain socket: what was sent is exactly what
    the server saw, and a reset or a close after an answer shows (httpx would reconnect)."""

    def __init__(self, url: str, timeout: float = 30.0) -> None:
        host, port = url.removeprefix("http://").split(":")
        self.host = f"{host}:{port}"
        self.sock = socket.create_connection((host, int(port)), timeout=timeout)
        self.buffer = b""

    def request(self, method: str, path: str, body: bytes = b"",
                headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
        """Send one request, read its whole answer: (status, lower-case headers, body)."""
        self.send(method, path, body, headers)
        return self.read_response()

    def send(self, method: str, path: str, body: bytes = b"",
             headers: dict[str, str] | None = None) -> None:
        """Write one request (its answer is read later with `read_response`)."""
        head = {"host": self.host, "content-length": str(len(body)), **(headers or {})}
        lines = [f"{method} {path} HTTP/1.1", *(f"{k}: {v}" for k, v in head.items())]
        self.sock.sendall("\r\n".join(lines).encode() + b"\r\n\r\n" + body)

    def read_response(self) -> tuple[int, dict[str, str], bytes]:
        while b"\r\n\r\n" not in self.buffer:
            self._fill()
        raw_head, self.buffer = self.buffer.split(b"\r\n\r\n", 1)
        status_line, *header_lines = raw_head.decode("latin-1").split("\r\n")
        headers = {}
        for line in header_lines:
            key, _, value = line.partition(":")
            headers[key.strip().lower()] = value.strip()
        if "chunked" in headers.get("transfer-encoding", "").lower():
            return int(status_line.split()[1]), headers, self._read_chunked()
        size = int(headers.get("content-length", "0"))
        while len(self.buffer) < size:
            self._fill()
        body, self.buffer = self.buffer[:size], self.buffer[size:]
        return int(status_line.split()[1]), headers, body

    def _read_chunked(self) -> bytes:
        """A chunked body (a streamed answer: server-sent events), read to its last chunk."""
        body = b""
        while True:
            while b"\r\n" not in self.buffer:
                self._fill()
            size_line, self.buffer = self.buffer.split(b"\r\n", 1)
            size = int(size_line.split(b";")[0], 16)
            while len(self.buffer) < size + 2:
                self._fill()
            body, self.buffer = body + self.buffer[:size], self.buffer[size + 2:]
            if size == 0:  # (no trailers from uvicorn)
                return body

    def _fill(self) -> None:
        chunk = self.sock.recv(65536)
        if not chunk:
            raise ConnectionResetError("the server closed the connection")
        self.buffer += chunk

    def close(self) -> None:
        self.sock.close()
