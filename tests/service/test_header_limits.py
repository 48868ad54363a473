"""Limits on request heads against `seqserve serve` with an API process (the flags reach it
through the supervisor): too many header fields or too large a head get a 431, too long a
request target a 414, each a JSON error with `Connection: close` and a closed connection,
before any route or API key check; an unterminated header is cut off at the limit as it
arrives, not read to its end (what grew each API process by the size sent); a chunked body's
trailers are bounded the same way, and so is the time the rest of a body answered before it
arrived may take; heads within the limits are served, keep-alive and pipelined."""

from __future__ import annotations

import gzip
import json
import select
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from process_support import Server, serve
from pydantic import ValidationError

from seqserve.service.web.settings import Settings

KEY = "secret"
FLAGS = ("--api-workers", "1", "--max-headers", "20", "--max-header-bytes", "8192",
         "--max-url-bytes", "1024", "--api-key", KEY, "--header-timeout-s", "2")
CLASSIFY = "/v1/models/tiny-clf/classify"
SENT_AT_MOST = 4 << 20
"""What a client may send of an endless head before it is answered or cut off (the server
reads 256 KiB at a time; the socket buffers hold a few MB)."""


@pytest.fixture(scope="module")
def server(tiny_repo: Path) -> Iterator[Server]:
    with serve(tiny_repo, *FLAGS) as s:
        yield s


def _head(target: str = CLASSIFY, fields: int = 0, method: str = "POST",
          extra: bytes = b"") -> bytes:
    """A request head without its blank line: host and content-length 0, `fields` more."""
    lines = [f"{method} {target} HTTP/1.1", "host: x", "content-length: 0",
             *(f"x-field-{i}: {i}" for i in range(fields))]
    return "\r\n".join(lines).encode() + b"\r\n" + extra


def _exchange(server: Server, payload: bytes, piece: int = 1 << 16) -> tuple[int, bytes]:
    """Send `payload` a piece at a time until the server answers or cuts the connection;
    then read until it closes. Returns how much was sent and what came back."""
    host, port = server.url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)), timeout=10)
    sent, data = 0, b""
    try:
        try:
            while sent < len(payload):
                sock.sendall(payload[sent:sent + piece])
                sent += piece
                if select.select([sock], [], [], 0.01)[0]:
                    break
        except (BrokenPipeError, ConnectionResetError):
            pass
        try:
            while chunk := sock.recv(65536):
                data += chunk
        except ConnectionResetError:
            pass
    finally:
        sock.close()
    return min(sent, len(payload)), data


def _refused(data: bytes, status: int, says: str) -> None:
    head, _, body = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 %d " % status), data[:300]
    assert b"\r\nconnection: close" in head.lower()
    assert says in json.loads(body)["error"]


@pytest.mark.parametrize(("case", "payload", "status", "says"), [
    ("21 header fields", _head(fields=19) + b"\r\n", 431, "max_headers (20)"),
    ("one header field over the head size", _head(extra=b"x-big: " + b"a" * 9000 + b"\r\n")
     + b"\r\n", 431, "max_header_bytes (8192)"),
    ("20 fields over the head size", _head(fields=17, extra=b"x-big: " + b"a" * 8000 + b"\r\n")
     + b"\r\n", 431, "max_header_bytes (8192)"),
    ("request target over max_url_bytes", _head(CLASSIFY + "?q=" + "a" * 1100) + b"\r\n", 414,
     "max_url_bytes (1024)"),
])
def test_heads_over_a_limit_are_refused_before_the_api_key_check(
        server: Server, case: str, payload: bytes, status: int, says: str) -> None:
    """(No Authorization header: the route would answer 401.)"""
    _, data = _exchange(server, payload)
    _refused(data, status, says)


@pytest.mark.parametrize("where", ["header value", "header name", "request target"])
def test_an_endless_head_is_cut_off_as_it_arrives(server: Server, where: str) -> None:
    endless = b"a" * (16 << 20)
    payload = {"header value": _head(extra=b"x-big: " + endless),
               "header name": _head(extra=endless),
               "request target": b"GET /" + endless}[where]
    sent, data = _exchange(server, payload)
    _refused(data, 414 if where == "request target" else 431, "max_")
    assert sent <= SENT_AT_MOST, (where, sent)
    _, data = _exchange(server, _head("/v2/health/live", method="GET") + b"\r\n")
    assert data.startswith(b"HTTP/1.1 200")


def test_trailers_of_a_chunked_body_are_bounded(server: Server) -> None:
    """The body of a request under way, then endless trailers: the connection is closed (no
    answer: the request never completed), and the server serves on."""
    head = (f"POST {CLASSIFY} HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {KEY}\r\n"
            "content-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n").encode()
    body = b'{"texts": ["one two"]}'
    chunked = head + b"%x\r\n" % len(body) + body + b"\r\n0\r\n"
    sent, data = _exchange(server, chunked + b"x-trailer: " + b"a" * (16 << 20))
    assert sent <= SENT_AT_MOST and not data.startswith(b"HTTP/1.1 200"), (sent, data[:300])
    _, data = _exchange(server, chunked + b"x-trailer: 1\r\n\r\n")  # a small trailer: fine
    assert data.startswith(b"HTTP/1.1 200"), data[:300]


def test_the_rest_of_a_body_answered_early_must_come_soon(server: Server) -> None:
    """A body announced over max_body_bytes gets its 413 at once; the rest of it may not
    trickle in for longer than header_timeout_s (2 s here): the connection is closed."""
    head = (f"POST {CLASSIFY} HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {KEY}\r\n"
            "content-type: application/json\r\ncontent-length: 1000000000\r\n\r\n").encode()
    host, port = server.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(head)
        answer = b""
        while b"}" not in answer:
            answer += sock.recv(65536)
        assert answer.startswith(b"HTTP/1.1 413"), answer[:300]
        start = time.monotonic()
        with pytest.raises(OSError):  # the server closed: a reset, then a broken pipe
            while time.monotonic() - start < 20:
                sock.sendall(b"a" * 100)
                time.sleep(0.1)
        assert time.monotonic() - start < 8


def test_heads_within_the_limits_are_served_keep_alive_and_pipelined(server: Server) -> None:
    full = 8192 - len(_head("/v2/health/live", fields=17, method="GET")) - len(b"x: \r\n\r\n")
    within = [_head("/v2/health/live", fields=18, method="GET") + b"\r\n",  # 20 fields
              _head("/v2/health/live", fields=17, method="GET", extra=b"x: " + b"a" * full
                    + b"\r\n") + b"\r\n",  # 8192 bytes
              _head("/v2/health/live?q=" + "a" * (1024 - 18), method="GET") + b"\r\n"]
    assert len(within[1]) == 8192
    body = gzip.compress(b'{"texts": ["one two"]}')
    compressed = (f"POST {CLASSIFY} HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {KEY}\r\n"
                  f"content-encoding: gzip\r\ncontent-length: {len(body)}\r\n\r\n").encode()
    over = _head(fields=30) + b"\r\n"
    # one write, so the last request's head is refused while the others are under way
    _, data = _exchange(server, b"".join(within) + compressed + body + over)
    answers = data.split(b"HTTP/1.1 ")[1:]
    assert [a[:3] for a in answers] == [b"200", b"200", b"200", b"200", b"431"], data[-600:]
    assert json.loads(answers[3].partition(b"\r\n\r\n")[2])["results"]
    _refused(b"HTTP/1.1 " + answers[4], 431, "max_headers (20)")


def test_the_request_target_fits_in_the_head() -> None:
    with pytest.raises(ValidationError, match="max_url_bytes"):
        Settings(max_url_bytes=10_000, max_header_bytes=9_000)
