"""HTTP clients for the load generator: a lean HTTP/1.1 keep-alive client and an httpx adapter.

The load tool must be able to outrun the server it measures. httpx costs ~1.5-2 ms of client
CPU per request; `RawClient` (asyncio protocols, one request per connection at a time,
keep-alive, Content-Length and chunked bodies) costs a fraction of that, so it is the
default. Both raise errors whose class names follow httpx (ConnectError, ReadTimeout, ...),
the kinds the report counts.
"""

from __future__ import annotations

import asyncio
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


class _StaleConnection(Exception):
    """A reused keep-alive connection was closed by the server before any answer byte."""


class _Connection(asyncio.Protocol):
    """One keep-alive HTTP/1.1 connection as an asyncio protocol, one exchange at a time:
    `exchange` writes a request and returns a future of its response, parsed from the bytes
    as they arrive (Content-Length, chunked, or until the connection closes). A protocol
    rather than asyncio streams: a stream's reader and writer cost several awaits and
    futures per response (py-spy of a generator at 1,300 requests/s: docs/performance.md
    section 20)."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.buf = bytearray()
        self.waiter: asyncio.Future[tuple[Response, bool]] | None = None
        self.on_data: OnData | None = None
        self.reused = False
        self.got_bytes = False
        self.status = 0
        self.headers: dict[str, str] | None = None
        self.length: int | None = None  # body bytes still to read (Content-Length mode)
        self.chunked = False
        self.chunk_left: int | None = None  # chunked: bytes left of the current chunk + CRLF
        self.trailers = False
        self.body: list[bytes] = []

    # -- asyncio.Protocol ------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        if self.waiter is None or self.waiter.done():
            return  # nothing asked for: a server's stray bytes, dropped
        self.got_bytes = True
        self.buf += data
        try:
            self._parse()
        except TransportError as exc:
            self._fail(exc)

    def eof_received(self) -> bool | None:
        self.closed = True
        if self.waiter is not None and not self.waiter.done():
            if self.headers is not None and self.length is None and not self.chunked:
                self._finish(until_eof=True)  # a body delimited by the connection's end
            elif self.reused and not self.got_bytes:
                self._fail(_StaleConnection())
            elif self.headers is None:
                self._fail(RemoteProtocolError("server closed the connection before answering"))
            else:
                self._fail(RemoteProtocolError("connection closed in the middle of the body"))
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.waiter is not None and not self.waiter.done():
            if self.reused and not self.got_bytes:
                self._fail(_StaleConnection())
            elif self.headers is not None and self.length is None and not self.chunked:
                self._finish(until_eof=True)
            else:
                self._fail(ReadError(str(exc) if exc else "connection lost"))

    # -- one exchange ----------------------------------------------------------------------

    def exchange(self, request: bytes, reused: bool, on_data: OnData | None
                 ) -> asyncio.Future[tuple[Response, bool]]:
        """Write `request`; the future's result is (response, keep the connection)."""
        assert self.transport is not None
        loop = asyncio.get_running_loop()
        self.waiter = loop.create_future()
        self.on_data, self.reused, self.got_bytes = on_data, reused, False
        self.buf.clear()
        self.headers, self.length, self.chunked, self.chunk_left = None, None, False, None
        self.trailers, self.body = False, []
        if self.closed or self.transport.is_closing():
            self._fail(_StaleConnection() if reused else WriteError("connection closed"))
        else:
            self.transport.write(request)
        return self.waiter

    def _fail(self, exc: Exception) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(exc)
        self.close()

    def close(self) -> None:
        self.closed = True
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()

    def _finish(self, until_eof: bool = False) -> None:
        headers = self.headers or {}
        body = b"".join(self.body)
        keep = not until_eof and not self.closed \
            and "close" not in headers.get("connection", "").lower()
        if self.sink is not None:
            if body:
                self.sink(body)
            body = b""
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result((Response(self.status, headers, body), keep))

    @property
    def sink(self) -> OnData | None:
        """Where a 2xx streamed body's pieces go (None: kept in the response)."""
        return self.on_data if 200 <= self.status < 300 else None

    def _take(self, piece: bytes) -> None:
        if piece:
            sink = self.sink
            if sink is not None and self.chunked:
                sink(piece)  # each chunk as it arrives
            else:
                self.body.append(piece)

    def _parse(self) -> None:
        buf = self.buf
        if self.headers is None:
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                if len(buf) > MAX_HEADER_BYTES:
                    raise RemoteProtocolError("response headers too long")
                return
            self.status, self.headers = _parse_head(bytes(buf[:end + 4]))
            del buf[:end + 4]
            if "chunked" in self.headers.get("transfer-encoding", "").lower():
                self.chunked = True
            elif "content-length" in self.headers:
                try:
                    self.length = int(self.headers["content-length"])
                except ValueError as exc:
                    raise RemoteProtocolError("bad Content-Length") from exc
        if self.length is not None:
            if len(buf) >= self.length:
                self._take(bytes(buf[:self.length]))
                del buf[:self.length]
                self._finish()
            return
        if not self.chunked:  # until the connection closes
            self._take(bytes(buf))
            buf.clear()
            return
        while True:
            if self.trailers:
                end = buf.find(b"\r\n")
                if end < 0:
                    return
                line = bytes(buf[:end])
                del buf[:end + 2]
                if not line:
                    self._finish()
                    return
                continue
            if self.chunk_left is None:
                end = buf.find(b"\r\n")
                if end < 0:
                    return
                try:
                    size = int(bytes(buf[:end]).split(b";")[0].strip(), 16)
                except ValueError as exc:
                    raise RemoteProtocolError(f"bad chunk size {bytes(buf[:end])!r}") from exc
                del buf[:end + 2]
                if size == 0:
                    self.trailers = True
                    continue
                self.chunk_left = size + 2  # the chunk and its CRLF
            take = min(self.chunk_left - 2, len(buf))
            if take > 0:
                self._take(bytes(buf[:take]))
                del buf[:take]
                self.chunk_left -= take
            if self.chunk_left > 2:
                return
            if len(buf) < 2:
                return
            del buf[:2]
            self.chunk_left = None


class RawClient:
    """Minimal HTTP/1.1 client (asyncio protocols) with a bounded keep-alive pool."""

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
        self._idle: list[_Connection] = []
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
        while self._idle:
            conn = self._idle.pop()
            if conn.closed:
                continue
            try:
                return await self._exchange(conn, request, True, on_data)
            except _StaleConnection:
                break  # the server closed an idle connection: nothing was processed, resend
        return await self._exchange(await self._connect(), request, False, on_data)

    async def _connect(self) -> _Connection:
        loop = asyncio.get_running_loop()
        try:
            _, conn = await loop.create_connection(_Connection, self.host, self.port,
                                                   ssl=self.tls or None)
        except TimeoutError as exc:
            raise ConnectTimeout(str(exc)) from exc
        except OSError as exc:
            raise ConnectError(f"{type(exc).__name__}: {exc}") from exc
        return conn

    async def _exchange(self, conn: _Connection, request: bytes, reused: bool,
                        on_data: OnData | None = None) -> Response:
        keep = False
        try:
            response, keep = await conn.exchange(request, reused, on_data)
            return response
        finally:
            if keep:
                self._idle.append(conn)
            else:
                conn.close()

    async def aclose(self) -> None:
        idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()


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
