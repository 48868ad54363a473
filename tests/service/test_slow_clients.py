"""Slow or lying clients against `seqserve serve`: a short Content-Length, a stalled body, a
slowloris, an idle socket each get a 408 and a closed connection within their timeout; a
draining server closes every connection after its answer."""

from __future__ import annotations

import json
import signal
import socket
import time
from pathlib import Path

import pytest
from process_support import Server, serve

TIMEOUTS = ("--header-timeout-s", "1", "--body-timeout-s", "1", "--keepalive-timeout-s", "1")


def _answer(server: Server, payload: bytes, wait: float = 10) -> tuple[float, bytes]:
    """Seconds until the server answered and closed, and what it sent."""
    host, port = server.url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)), timeout=wait)
    start = time.monotonic()
    data = b""
    try:
        sock.sendall(payload)
        while chunk := sock.recv(65536):  # until the server closes
            data += chunk
    finally:
        sock.close()
    return time.monotonic() - start, data


HEAD = (b"POST /v1/models/tiny-clf/classify HTTP/1.1\r\nhost: x\r\n"
        b"content-type: application/json\r\n")


@pytest.mark.parametrize(("case", "payload"), [
    ("content-length longer than the body", HEAD + b"content-length: 100\r\n\r\n{\"texts\":"),
    ("headers then no body", HEAD + b"content-length: 50\r\n\r\n"),
    ("slowloris: headers never end", HEAD + b"content-len"),
    ("a connection that sends nothing", b""),
])
def test_slow_or_lying_clients_get_408_and_a_closed_connection(tiny_repo: Path, case: str,
                                                               payload: bytes) -> None:
    with serve(tiny_repo, "--api-workers", "1", *TIMEOUTS) as server:
        seconds, data = _answer(server, payload)
    assert data.startswith(b"HTTP/1.1 408"), (case, data[:200])
    assert b"connection: close" in data.lower()
    assert json.loads(data.split(b"\r\n\r\n", 1)[1])["error"]
    assert seconds < 8, (case, seconds)  # the timeout is 1 s; never the client's pace


def test_an_idle_keep_alive_connection_is_closed(tiny_repo: Path) -> None:
    request = (b"GET /v2/health/live HTTP/1.1\r\nhost: x\r\n\r\n")
    with serve(tiny_repo, "--api-workers", "1", *TIMEOUTS) as server:
        seconds, data = _answer(server, request)
    assert data.startswith(b"HTTP/1.1 200") and seconds < 8


def test_answers_while_draining_close_the_connection(tiny_repo: Path) -> None:
    """During the shutdown delay readiness is false, new work is served as usual, and every
    answer says Connection: close, so no client reuses a connection that is about to go."""
    body = json.dumps({"texts": ["one two"]}).encode()
    with serve(tiny_repo, "--api-workers", "1", "--shutdown-delay-s", "3") as server:
        server.proc.send_signal(signal.SIGTERM)
        time.sleep(0.5)
        _, ready = _answer(server, b"GET /v2/health/ready HTTP/1.1\r\nhost: x\r\n\r\n")
        _, late = _answer(server, HEAD + f"content-length: {len(body)}\r\n\r\n".encode() + body)
        code = server.proc.wait(timeout=30)
    assert ready.startswith(b"HTTP/1.1 503") and b"connection: close" in ready.lower()
    assert late.startswith(b"HTTP/1.1 200")
    assert b"connection: close" in late.lower()
    assert code == 0
