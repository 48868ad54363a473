"""A tiny asyncio driver for seqserve.service.server._front: the bridge the server would use.

    python native/echo_front.py PORT        # serve the echo routes until interrupted

Routes (all answer JSON unless noted):
  /echo          {"method", "path", "query", "body", "headers"} of the request
  /slow?ms=N     the same, N milliseconds later
  /never         never answered (the client's disconnect shows up in `gone`)
  /sse           text/event-stream: three events 20 ms apart, via start/send/end
  /close         answered with `connection: close`
"""

from __future__ import annotations

import asyncio
import json
import socket
import sys
import threading
from typing import Any

from seqserve.service.server._front import Front

_JSON = [(b"content-type", b"application/json")]


def listen(host: str = "127.0.0.1", port: int = 0, backlog: int = 1024) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(backlog)
    return sock


class EchoDriver:
    """Answers the front's requests from an asyncio loop, woken by the front's eventfd."""

    def __init__(self, front: Front, loop: asyncio.AbstractEventLoop) -> None:
        self.front = front
        self.loop = loop
        self.gone: list[int] = []
        self.taken: list[tuple[Any, ...]] = []
        self.keep = False  # keep taken requests in self.taken (tests)
        loop.add_reader(front.fileno(), self.on_ready)

    def on_ready(self) -> None:
        f = self.front
        gone = f.gone()
        if gone:
            self.gone.extend(gone)
        answers = []
        while True:
            batch = f.take(256)
            if not batch:
                break
            for req in batch:
                if self.keep:
                    self.taken.append(req)
                rid, method, path, query, headers, body, client, received, _whole = req
                if path == "/echo":
                    answers.append((rid, 200, _JSON, self.echo(req)))
                elif path == "/slow":
                    ms = int(dict(p.split(b"=") for p in query.split(b"&") if p).get(b"ms", b"100"))
                    self.loop.call_later(ms / 1000, f.respond, rid, 200, _JSON, self.echo(req))
                elif path == "/never":
                    pass
                elif path == "/sse":
                    self.loop.create_task(self.sse(rid))
                elif path == "/close":
                    answers.append((rid, 200, _JSON + [(b"connection", b"close")], self.echo(req)))
                else:
                    body = json.dumps({"error": "not found", "status": 404}).encode()
                    answers.append((rid, 404, _JSON, body))
            if len(batch) < 256:
                break
        if answers:
            f.respond_many(answers)

    @staticmethod
    def echo(req: tuple[Any, ...]) -> bytes:
        rid, method, path, query, headers, body, client, received, _whole = req
        return json.dumps(
            {
                "method": method,
                "path": path,
                "query": query.decode("latin-1"),
                "body": body.decode("latin-1"),
                "headers": [[k.decode("latin-1"), v.decode("latin-1")] for k, v in headers],
            }
        ).encode()

    async def sse(self, rid: int) -> None:
        f = self.front
        head = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]
        if not f.start(rid, 200, head):
            return
        for i in range(3):
            if not f.send(rid, f"data: {i}\n\n".encode()):
                return
            await asyncio.sleep(0.02)
        f.end(rid)


class LoopThread:
    """An asyncio loop in a thread with an EchoDriver on it (tests)."""

    def __init__(self, front: Front) -> None:
        self.loop = asyncio.new_event_loop()
        ready = threading.Event()
        self.driver: EchoDriver | None = None

        def run() -> None:
            asyncio.set_event_loop(self.loop)
            self.driver = EchoDriver(front, self.loop)
            ready.set()
            self.loop.run_forever()

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()
        ready.wait()

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


def main() -> None:
    port = int(sys.argv[1]) if len(sys.argv) > 1 else 8000
    threads = int(sys.argv[2]) if len(sys.argv) > 2 else 1
    sock = listen(port=port)
    front = Front(sock.fileno(), threads=threads)
    loop = asyncio.new_event_loop()
    EchoDriver(front, loop)
    print(f"native front on 127.0.0.1:{port}", flush=True)
    try:
        loop.run_forever()
    except KeyboardInterrupt:
        pass
    finally:
        front.close(1.0)


if __name__ == "__main__":
    main()
