"""The load tool's HTTP/1.1 client: bodies, keep-alive, broken servers, and httpx parity."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from seqserve.loadtest.client import (
    ConnectError,
    HttpxClient,
    RawClient,
    ReadTimeout,
    RemoteProtocolError,
)
from seqserve.loadtest.config import LoadConfig
from seqserve.loadtest.runner import run_load
from seqserve.loadtest.texts import TextSampler, load_text_file
from seqserve.models.errors import UserError

pytestmark = pytest.mark.timeout(60)
BODY = {"texts": ["one two three"]}


async def _post_many(client: Any, path: str, n: int) -> list[Any]:
    try:
        return [await client.post_json(path, BODY) for _ in range(n)]
    finally:
        await client.aclose()


@pytest.mark.parametrize("model", ["fast", "chunked", "close"])
def test_raw_client_reads_every_body_framing(stub_server: Any, model: str) -> None:
    client = RawClient(stub_server.url, max_connections=2, timeout_s=10)
    responses = asyncio.run(_post_many(client, f"/v1/models/{model}/classify", 4))
    assert [r.status for r in responses] == [200] * 4
    assert all(r.json()["results"][0]["label"] == "en" for r in responses)
    assert all("compute;dur=" in r.headers["server-timing"] for r in responses)
    assert stub_server.calls[model] >= 4


def test_raw_client_matches_httpx(stub_server: Any) -> None:
    raw = asyncio.run(_post_many(RawClient(stub_server.url, 1, 10), "/v1/models/shed/classify", 1))
    ref = asyncio.run(
        _post_many(HttpxClient(stub_server.url, 1, 10), "/v1/models/shed/classify", 1)
    )
    assert raw[0].status == ref[0].status == 429
    assert raw[0].headers["retry-after"] == ref[0].headers["retry-after"] == "1"
    assert raw[0].json() == ref[0].json()


def test_raw_client_reconnects_after_the_server_drops_idle_connections() -> None:
    from conftest import make_stub_app
    from server_support import serve_app

    calls: Counter[str] = Counter()

    async def scenario(url: str) -> list[int]:
        client = RawClient(url, max_connections=1, timeout_s=10)
        try:
            first = await client.post_json("/v1/models/fast/classify", BODY)
            await asyncio.sleep(1.5)  # past the server's 1 s keep-alive: it closed the socket
            second = await client.post_json("/v1/models/fast/classify", BODY)
            return [first.status, second.status]
        finally:
            await client.aclose()

    with serve_app(make_stub_app(calls), timeout_keep_alive=1) as url:
        assert asyncio.run(scenario(url)) == [200, 200]
    assert calls["fast"] == 2  # the resend went to a fresh connection, nothing was sent twice


async def _with_tcp_server(
    handler: Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]],
    client_call: Callable[[str], Awaitable[Any]],
) -> Any:
    server = await asyncio.start_server(handler, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        return await client_call(f"http://127.0.0.1:{port}")
    finally:
        server.close()
        await server.wait_closed()


def _raw_server(reply: bytes, hang_s: float = 0.0) -> Any:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        if hang_s:
            await asyncio.sleep(hang_s)
        writer.write(reply)
        await writer.drain()
        writer.close()

    return handler


@pytest.mark.parametrize(
    ("reply", "error"),
    [
        (b'HTTP/1.1 200 OK\r\nContent-Length: 50\r\n\r\n{"partial"', RemoteProtocolError),
        (b"SSH-2.0-OpenSSH\r\n\r\n", RemoteProtocolError),
        (b"", RemoteProtocolError),
    ],
)
def test_raw_client_names_protocol_errors(reply: bytes, error: type[Exception]) -> None:
    async def call(url: str) -> None:
        client = RawClient(url, 1, timeout_s=5)
        try:
            await client.post_json("/x", BODY)
        finally:
            await client.aclose()

    with pytest.raises(error):
        asyncio.run(_with_tcp_server(_raw_server(reply), call))


def test_raw_client_times_out_and_the_runner_counts_it(texts_file: Path) -> None:
    """A server that never answers within the timeout: ReadTimeout, counted by kind."""
    reply = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}"

    async def call(url: str) -> Any:
        from seqserve.loadtest.runner import arun_load

        cfg = LoadConfig(url, "m", rate=20.0, requests=4, duration_s=None, timeout_s=0.3)
        return await arun_load(cfg, TextSampler(load_text_file(texts_file)))

    start = time.perf_counter()
    result = asyncio.run(_with_tcp_server(_raw_server(reply, hang_s=2.0), call))
    assert result.summary["errors_by_kind"] == {"ReadTimeout": 4}
    assert result.summary["sent"] == 4 and result.summary["ok"] == 0
    assert time.perf_counter() - start < 30  # bounded by the timeout, not the server
    assert issubclass(ReadTimeout, Exception) and issubclass(ConnectError, Exception)


def test_httpx_client_option_gives_the_same_counts(stub_server: Any, texts_file: Path) -> None:
    totals = {}
    for kind in ("raw", "httpx"):
        cfg = LoadConfig(stub_server.url, "fast", "translate", concurrency=2, requests=20,
                         duration_s=None, http_client=kind)  # fmt: skip
        s = run_load(cfg, TextSampler(load_text_file(texts_file), seed=4)).summary
        totals[kind] = (s["sent"], s["ok"], s["generated_tokens"])
    # Same seed, same texts, and the stub's tokens are a function of the text: equal totals.
    assert totals["raw"] == totals["httpx"] and totals["raw"][1] == 20
    with pytest.raises(UserError, match="http_client"):
        LoadConfig(stub_server.url, "fast", rate=1.0, http_client="curl")
    with pytest.raises(ValueError, match="URL"):
        RawClient("ftp://x", 1, 1.0)


def test_raw_client_parses_answers_that_arrive_a_byte_at_a_time() -> None:
    """The response parser works on whatever pieces arrive: a chunked stream (with a chunk
    extension and a trailer) and a Content-Length answer sent one byte per write reach
    `on_data` and the body whole, and the connection is reused for the next exchange."""
    chunked = (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
               b"6;ext=1\r\ndata: \r\n3\r\nabc\r\n0\r\nX-Trailer: t\r\n\r\n")
    plain = b'HTTP/1.1 201 Created\r\nContent-Length: 11\r\nX-A: 1\r\nX-A: 2\r\n\r\n{"ok": [1]}'
    connections = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(1)
        for reply in (chunked, plain):
            head = await reader.readuntil(b"\r\n\r\n")
            length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
            await reader.readexactly(length)
            for i in range(len(reply)):
                writer.write(reply[i:i + 1])
                await writer.drain()
                await asyncio.sleep(0)
        writer.close()

    async def call(url: str) -> Any:
        client = RawClient(url, 1, timeout_s=10)
        pieces: list[bytes] = []
        try:
            streamed = await client.post_json("/x", BODY, pieces.append)
            whole = await client.post_json("/x", BODY)
            return streamed, b"".join(pieces), whole
        finally:
            await client.aclose()

    streamed, pieces, whole = asyncio.run(_with_tcp_server(handler, call))
    assert (streamed.status, streamed.body, pieces) == (200, b"", b"data: abc")
    assert (whole.status, whole.json(), whole.headers["x-a"]) == (201, {"ok": [1]}, "1, 2")
    assert connections == [1]  # one connection, kept alive
