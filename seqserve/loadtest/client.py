"""HTTP clients for the load generator: a lean HTTP/1.1 keep-alive client and an httpx adapter.

The load tool must be able to outrun the server it measures. httpx costs ~1.5-2 ms of client
CPU per request; `RawClient` (asyncio streams, one request per connection at a time, keep-alive,
Content-Length and chunked bodies) costs a fraction of that, so it is the default. Both raise
errors whose class names follow httpx (ConnectError, ReadTimeout, ...), the kinds the report
counts.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import urlsplit

MAX_HEADER_BYTES = 64 * 1024

OnData = Callable[[bytes], None]
"""Receives a streamed body's pieces as they arrive (server-sent events)."""


class TransportError(Exception):
    """Base of the raw client's errors (the class name is the reported kind)."""


class ConnectError(TransportError):
    """The connection could not be opened."""


class ConnectTimeout(TransportError):
    """Opening the connection took longer than the timeout."""


class ReadTimeout(TransportError):
    """The answer did not arrive within the timeout."""


class ReadError(TransportError):
    """The connection broke while the answer was read."""


class WriteError(TransportError):
    """The connection broke while the request was written."""


class RemoteProtocolError(TransportError):
    """The server answered something that is not HTTP/1.1, or closed mid-answer."""


@dataclass(frozen=True)
class Response:
    status: int
    headers: dict[str, str]
    """Lower-case names; repeated headers joined with ", "."""
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


class Client(Protocol):
    async def post_json(self, path: str, payload: Any, on_data: OnData | None = None
                        ) -> Response: ...
    async def aclose(self) -> None: ...


_Conn = tuple[asyncio.StreamReader, asyncio.StreamWriter]


class _StaleConnection(Exception):
    """A reused keep-alive connection was closed by the server before any answer byte."""


class RawClient:
    """Minimal HTTP/1.1 client over asyncio streams with a bounded keep-alive pool."""

    def __init__(self, base_url: str, max_connections: int, timeout_s: float) -> None:
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"URL must be http(s)://host[:port], got {base_url!r}")
        self.host = parts.hostname
        self.tls = parts.scheme == "https"
        self.port = parts.port or (443 if self.tls else 80)
        self.prefix = parts.path.rstrip("/")
        self.timeout_s = timeout_s
        self._slots = asyncio.Semaphore(max_connections)
        self._idle: list[_Conn] = []
        self._host_header = parts.netloc.encode("ascii")

    async def post_json(self, path: str, payload: Any, on_data: OnData | None = None
                        ) -> Response:
        """POST a JSON body. With `on_data`, a 2xx chunked body goes to it piece by piece as
        it arrives (the returned body is then empty)."""
        body = json.dumps(payload).encode("utf-8")
        head = (
            b"POST " + (self.prefix + path).encode("utf-8") + b" HTTP/1.1\r\nHost: "
            + self._host_header + b"\r\nContent-Type: application/json\r\nAccept: */*\r\n"
            b"Content-Length: " + str(len(body)).encode("ascii") + b"\r\n\r\n"
        )  # fmt: skip
        async with self._slots:
            try:
                async with asyncio.timeout(self.timeout_s):
                    return await self._exchange_with_retry(head + body, on_data)
            except TimeoutError as exc:
                raise ReadTimeout(f"no answer within {self.timeout_s:g} s") from exc

    async def _exchange_with_retry(self, request: bytes, on_data: OnData | None) -> Response:
        if self._idle:
            conn = self._idle.pop()
            try:
                return await self._exchange(conn, request, True, on_data)
            except _StaleConnection:
                pass  # the server closed an idle connection: nothing was processed, resend
        return await self._exchange(await self._connect(), request, False, on_data)

    async def _connect(self) -> _Conn:
        try:
            return await asyncio.open_connection(self.host, self.port, ssl=self.tls or None)
        except TimeoutError as exc:
            raise ConnectTimeout(str(exc)) from exc
        except OSError as exc:
            raise ConnectError(f"{type(exc).__name__}: {exc}") from exc

    async def _exchange(self, conn: _Conn, request: bytes, reused: bool,
                        on_data: OnData | None = None) -> Response:
        reader, writer = conn
        keep = False
        try:
            try:
                writer.write(request)
                await writer.drain()
            except OSError as exc:
                raise (_StaleConnection() if reused else WriteError(str(exc))) from exc
            response, keep = await _read_response(reader, reused, on_data)
            return response
        finally:
            if keep:
                self._idle.append(conn)
            else:
                writer.close()

    async def aclose(self) -> None:
        idle, self._idle = self._idle, []
        for _, writer in idle:
            writer.close()
        for _, writer in idle:
            with contextlib.suppress(OSError):
                await writer.wait_closed()


async def _read_response(reader: asyncio.StreamReader, reused: bool,
                         on_data: OnData | None = None) -> tuple[Response, bool]:
    """(response, keep the connection open)."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError as exc:
        if reused and not exc.partial:
            raise _StaleConnection() from exc
        raise RemoteProtocolError("server closed the connection before answering") from exc
    except asyncio.LimitOverrunError as exc:
        raise RemoteProtocolError("response headers too long") from exc
    except OSError as exc:
        if reused:
            raise _StaleConnection() from exc
        raise ReadError(str(exc)) from exc
    status, headers = _parse_head(head)
    try:
        sink = on_data if 200 <= status < 300 else None
        body, until_eof = await _read_body(reader, headers, sink)
    except asyncio.IncompleteReadError as exc:
        raise RemoteProtocolError("connection closed in the middle of the body") from exc
    except OSError as exc:
        raise ReadError(str(exc)) from exc
    keep = not until_eof and "close" not in headers.get("connection", "").lower()
    return Response(status, headers, body), keep


def _parse_head(head: bytes) -> tuple[int, dict[str, str]]:
    lines = head.decode("latin-1").split("\r\n")
    version, _, rest = lines[0].partition(" ")
    code = rest[:3]
    if not version.startswith("HTTP/1.") or not code.isdigit():
        raise RemoteProtocolError(f"bad status line {lines[0]!r}")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        if not line:
            continue
        name, sep, value = line.partition(":")
        if not sep:
            raise RemoteProtocolError(f"bad header line {line!r}")
        key = name.strip().lower()
        headers[key] = f"{headers[key]}, {value.strip()}" if key in headers else value.strip()
    return int(code), headers


async def _read_body(reader: asyncio.StreamReader, headers: dict[str, str],
                     on_data: OnData | None = None) -> tuple[bytes, bool]:
    """(body, read until EOF); with `on_data` every piece goes there instead."""
    if "chunked" in headers.get("transfer-encoding", "").lower():
        chunks: list[bytes] = []
        while True:
            size_line = await reader.readuntil(b"\r\n")
            try:
                size = int(size_line.split(b";")[0].strip(), 16)
            except ValueError as exc:
                raise RemoteProtocolError(f"bad chunk size {size_line!r}") from exc
            if size == 0:
                while (await reader.readuntil(b"\r\n")) != b"\r\n":
                    pass  # trailers
                return b"".join(chunks), False
            chunk = await reader.readexactly(size)
            if on_data is None:
                chunks.append(chunk)
            else:
                on_data(chunk)
            await reader.readexactly(2)
    if "content-length" in headers:
        try:
            length = int(headers["content-length"])
        except ValueError as exc:
            raise RemoteProtocolError("bad Content-Length") from exc
        body = await reader.readexactly(length)
    else:
        body = await reader.read()
    if on_data is not None:
        on_data(body)
        return b"", "content-length" not in headers
    return body, "content-length" not in headers


class HttpxClient:
    """The same interface over httpx (for comparison; slower per request)."""

    def __init__(self, base_url: str, max_connections: int, timeout_s: float) -> None:
        import httpx

        limits = httpx.Limits(
            max_connections=max_connections, max_keepalive_connections=max_connections
        )
        self._client = httpx.AsyncClient(
            base_url=base_url.rstrip("/"), limits=limits,
            timeout=httpx.Timeout(timeout_s, pool=None), trust_env=False,
        )  # fmt: skip

    async def post_json(self, path: str, payload: Any, on_data: OnData | None = None
                        ) -> Response:
        async with self._client.stream("POST", path, json=payload) as r:
            headers: dict[str, str] = {}
            for key, value in r.headers.multi_items():
                headers[key] = f"{headers[key]}, {value}" if key in headers else value
            if on_data is not None and 200 <= r.status_code < 300:
                async for piece in r.aiter_bytes():
                    on_data(piece)
                return Response(r.status_code, headers, b"")
            return Response(r.status_code, headers, await r.aread())

    async def aclose(self) -> None:
        await self._client.aclose()


CLIENTS: dict[str, type[RawClient] | type[HttpxClient]] = {"raw": RawClient, "httpx": HttpxClient}
"""`--http-client` choices."""


def make_client(kind: str, base_url: str, max_connections: int, timeout_s: float) -> Client:
    try:
        factory = CLIENTS[kind]
    except KeyError:
        raise ValueError(f"http client must be one of {sorted(CLIENTS)}, got {kind!r}") from None
    client: Client = factory(base_url, max_connections, timeout_s)
    return client
