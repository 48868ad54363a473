"""A trivial HTTP/1.1 server for the load tool's own ceiling: it reads each request and sends
a fixed classify-shaped answer, with no model and no framework.

    python trivial_server.py PORT [--record FILE]

--record writes each request body, one per line, to FILE (the harness's tests use it to see
which texts the load tool sent). uvloop is used when it is installed.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import sys
from typing import IO, Any

ANSWER = b'{"results":[{"label":"x","score":1.0}]}'
RESPONSE = (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
            + str(len(ANSWER)).encode() + b"\r\n\r\n" + ANSWER)


class Trivial(asyncio.Protocol):
    """Parses just enough HTTP (headers end, content-length) to answer each request."""

    def __init__(self, record: IO[bytes] | None) -> None:
        self.buffer = b""
        self.record = record
        self.transport: Any = None

    def connection_made(self, transport: Any) -> None:  # uvloop's is no asyncio.Transport
        self.transport = transport
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        out = []
        while True:
            end = self.buffer.find(b"\r\n\r\n")
            if end < 0:
                break
            size = 0
            for line in self.buffer[:end].lower().split(b"\r\n"):
                if line.startswith(b"content-length:"):
                    size = int(line[15:])
            if len(self.buffer) < end + 4 + size:
                break
            if self.record is not None:
                self.record.write(self.buffer[end + 4: end + 4 + size] + b"\n")
            self.buffer = self.buffer[end + 4 + size:]
            out.append(RESPONSE)
        if out and self.transport is not None:
            self.transport.write(b"".join(out))


async def main(port: int, record: IO[bytes] | None) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: Trivial(record), "127.0.0.1", port, backlog=1024)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    try:
        import uvloop
        uvloop.install()
    except ImportError:
        pass
    path = sys.argv[3] if sys.argv[2:3] == ["--record"] else None
    with contextlib.ExitStack() as stack:
        record = stack.enter_context(open(path, "ab", buffering=0)) if path else None
        asyncio.run(main(int(sys.argv[1]), record))
