"""A stub seqserve server for the load tool's tests: real uvicorn on 127.0.0.1, in a thread.

The model name in the URL picks the behaviour:
  fast      classify after 5 ms, Server-Timing queue/compute
  serial    one request at a time (concurrency limit 1), 50 ms each: overloads at > 20 req/s
  shed      always 429 with Retry-After: 1
  flaky     every third request 503 with Retry-After: 0, the rest like `fast`
  broken    500 with a JSON body
  chunked   like `fast`, the body streamed in chunks (Transfer-Encoding: chunked)
  close     like `fast`, with Connection: close (the server closes after each answer)
Translate answers one result per text with `tokens` (the words reversed, one per token).
"""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from server_support import serve_app

SERIAL_DELAY_S = 0.05
FAST_DELAY_S = 0.005


@dataclass
class StubServer:
    url: str
    calls: Counter[str] = field(default_factory=Counter)
    """Requests seen per model name."""


def _timing(queue_s: float, compute_s: float) -> dict[str, str]:
    return {"Server-Timing": f"queue;dur={queue_s * 1e3:.3f}, compute;dur={compute_s * 1e3:.3f}"}


def make_stub_app(calls: Counter[str]) -> FastAPI:
    app = FastAPI()
    serial = asyncio.Semaphore(1)

    async def _work(name: str) -> tuple[float, float]:
        """(queue_s, compute_s) of a simulated model call."""
        t0 = time.perf_counter()
        if name == "serial":
            async with serial:
                t1 = time.perf_counter()
                await asyncio.sleep(SERIAL_DELAY_S)
        else:
            t1 = time.perf_counter()
            await asyncio.sleep(FAST_DELAY_S)
        return t1 - t0, time.perf_counter() - t1

    def _refusal(name: str) -> JSONResponse | None:
        calls[name] += 1
        if name == "shed":
            return JSONResponse({"detail": "overloaded"}, 429, headers={"Retry-After": "1"})
        if name == "flaky" and calls[name] % 3 == 0:
            return JSONResponse({"detail": "busy"}, 503, headers={"Retry-After": "0"})
        if name == "broken":
            return JSONResponse({"detail": "fault"}, 500)
        return None

    @app.post("/v1/models/{name}/classify")
    async def classify(name: str, request: Request) -> Any:
        texts = (await request.json())["texts"]
        if (refused := _refusal(name)) is not None:
            return refused
        queue_s, compute_s = await _work(name)
        results = [{"label": "en", "score": min(1.0, len(t) / 100)} for t in texts]
        headers = _timing(queue_s, compute_s)
        if name == "chunked":
            raw = json.dumps({"results": results}).encode()
            parts = [raw[: len(raw) // 2], raw[len(raw) // 2 :]]
            return StreamingResponse(iter(parts), media_type="application/json", headers=headers)
        if name == "close":
            headers["Connection"] = "close"
        return JSONResponse({"results": results}, headers=headers)

    @app.post("/v1/models/{name}/translate")
    async def translate(name: str, request: Request) -> Any:
        body = await request.json()
        if (refused := _refusal(name)) is not None:
            return refused
        queue_s, compute_s = await _work(name)
        results = []
        for text in body["texts"]:
            words = text.split()[::-1]
            results.append({"translation": " ".join(words), "tokens": words, "score": -1.0})
        return JSONResponse({"results": results}, headers=_timing(queue_s, compute_s))

    return app


@pytest.fixture(scope="session")
def stub_server() -> Iterator[StubServer]:
    """The stub app under uvicorn on a free 127.0.0.1 port, shared by the load tool's tests."""
    calls: Counter[str] = Counter()
    with serve_app(make_stub_app(calls)) as url:
        yield StubServer(url, calls)


@pytest.fixture
def texts_file(tmp_path: Any) -> Any:
    """A texts file with a spread of lengths."""
    lines = [" ".join(f"w{j}" for j in range(1 + (i * 7) % 23)) for i in range(40)]
    path = tmp_path / "texts.txt"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


@pytest.fixture
def closed_port() -> int:
    """A 127.0.0.1 port nothing listens on (bound and released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
