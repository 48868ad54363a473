"""The API process's own CPU per request, in-process and deterministic: no HTTP, no engine.

`bench/overhead.py` measures the API process under wrk; its figure moves with the machine's
load and includes uvicorn's protocol and the ZeroMQ send. This drives the app's ASGI entry
(behind uvicorn's ProxyHeadersMiddleware, as uvicorn runs it) directly with `--concurrency`
clients that each send classify requests one after another, on uvloop, and answers every
engine request at once from a fake engine client: the real `EngineClient` with its socket
replaced by an in-loop reply (the real reply message, decoded by the real client code; the
logits are zeros). The models' states are the ones a real engine reports (the bundles of
`--repo` are loaded here once, the way the engine loads them). What is left is exactly our
per-request Python: middleware, validation, tokenization, the request context and wait,
result building, answer encoding, metrics and the access log (written to /dev/null).

    python bench/api_overhead.py --repo model_repository --model langid
    python bench/api_overhead.py ... --profile 40      # + cProfile's top frames (tottime)

Prints CPU microseconds per request (process time per round of `--requests` requests; the best
and the median of `--rounds`): on a shared machine the best round is the figure to compare
before and after a change (neighbours only ever add to it).
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import json
import logging
import os
import pstats
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repo", type=Path, default=Path("model_repository"))
    p.add_argument("--model", default="langid")
    p.add_argument("--requests", type=int, default=2000, help="requests per round")
    p.add_argument("--rounds", type=int, default=25)
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--profile", type=int, default=0, help="print this many cProfile rows")
    p.add_argument("--access-log", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--disconnect-future", action=argparse.BooleanOptionalAction, default=True,
                   help="the scope's disconnect future, as our uvicorn protocol sets it")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    multiproc = tempfile.mkdtemp(prefix="api_overhead_prom_")
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = multiproc  # as the supervisor sets it
    os.environ["SEQSERVE_REPO"] = str(a.repo)
    os.environ["SEQSERVE_ACCESS_LOG"] = "true" if a.access_log else "false"
    import uvloop

    return uvloop.run(run(a))


async def run(a: argparse.Namespace) -> int:
    from uvicorn.middleware.proxy_headers import ProxyHeadersMiddleware

    from bench.peers.texts import langid_rows, workloads
    from seqserve.service.core.metrics import Metrics
    from seqserve.service.engine import protocol as p
    from seqserve.service.engine.client import EngineClient
    from seqserve.service.engine.server import EngineServer
    from seqserve.service.server.app import create_app
    from seqserve.service.server.composition import engine_options
    try:
        from seqserve.service.web.http_protocol import DISCONNECT
    except ImportError:  # an older checkout (A/B runs): no disconnect future
        DISCONNECT = None  # noqa: N806
    from seqserve.service.web.settings import Settings

    settings = Settings()
    settings.process_settings().apply()
    logging.getLogger().handlers[0].setStream(open(os.devnull, "w"))  # noqa: SIM115
    engine = EngineServer(engine_options(settings), Metrics())
    await engine.load()
    classes = {s.name: len(s.manifest["labels"]) for s in engine.engine.models() if s.manifest}

    class FakeEngine(EngineClient):
        """The real client; its messages are answered in this loop (see the module doc)."""

        async def start(self) -> None:
            self.loop = asyncio.get_running_loop()

        def _send(self, msg: p.ToEngine) -> None:
            p.encoder.encode([msg])  # what the real send encodes (a turn's list; here one)
            if isinstance(msg, p.Hello):
                reply: Any = p.State(engine.engine.models(),
                                     engine_options(settings).to_dict(), {})
            elif isinstance(msg, p.SubmitRows):
                lengths = memoryview(msg.lengths).cast("i").tolist()
                logits = p.Array("float32", [classes[msg.model]], bytes(4 * classes[msg.model]))
                reply = p.Rows(msg.id, [[logits, p.Array("float32", [n], bytes(4 * n))]
                                        for n in lengths],
                               [(0.001, 0.002, len(lengths), 0)] * len(lengths), 0.001)
            else:
                return
            frame = p.encoder.encode([reply])
            self.loop.call_soon(self._on_frames, [frame])

    app = create_app(settings, engine=FakeEngine("inproc://none"))
    entry = ProxyHeadersMiddleware(app, trusted_hosts="127.0.0.1")
    work = workloads(langid_rows())["short"]
    path = f"/v1/models/{a.model}/classify"
    answered: dict[int, int] = {}

    async def one(g: int) -> None:
        body = json.dumps({"texts": [work.text(g)]}).encode()
        scope = {
            "type": "http", "asgi": {"version": "3.0", "spec_version": "2.4"},
            "http_version": "1.1", "server": ("127.0.0.1", 8000),
            "client": ("127.0.0.1", 40000 + g % 64), "scheme": "http", "method": "POST",
            "root_path": "", "path": path, "raw_path": path.encode(), "query_string": b"",
            "headers": [(b"host", b"127.0.0.1:8000"), (b"content-type", b"application/json"),
                        (b"content-length", str(len(body)).encode())],
            "state": {},
        }
        if a.disconnect_future and DISCONNECT:  # as our uvicorn protocol gives every request
            scope["extensions"] = {DISCONNECT: asyncio.get_running_loop().create_future()}
        sent = False
        gone = asyncio.get_running_loop().create_future()

        async def receive() -> dict[str, Any]:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            await gone
            return {"type": "http.disconnect"}

        async def send(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                answered[message["status"]] = answered.get(message["status"], 0) + 1

        await entry(scope, receive, send)  # type: ignore[arg-type]
        gone.cancel()

    async def client(first: int, n: int) -> None:
        for i in range(n):
            await one(first + i * a.concurrency)

    async def load(n: int, base: int) -> float:
        each = n // a.concurrency
        start = time.process_time()
        await asyncio.gather(*(client(base + c, each) for c in range(a.concurrency)))
        return (time.process_time() - start) / (each * a.concurrency)

    import gc
    gc_time: list[Any] = [0.0, 0.0, [0, 0, 0], [0.0, 0.0, 0.0], [0, 0, 0]]

    def on_gc(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            gc_time[1] = time.thread_time()
        else:
            g = info["generation"]
            gc_time[0] += time.thread_time() - gc_time[1]
            gc_time[3][g] += time.thread_time() - gc_time[1]
            gc_time[2][g] += 1
            gc_time[4][g] += info["collected"]
    gc.callbacks.append(on_gc)
    async with app.router.lifespan_context(app):
        await load(2000, 10**6)  # warm-up
        gc_time[:] = [0.0, 0.0, [0, 0, 0], [0.0, 0.0, 0.0], [0, 0, 0]]
        figures = []
        for r in range(a.rounds):
            figures.append(await load(a.requests, r * a.requests))
        if a.profile:
            prof = cProfile.Profile()
            prof.enable()
            await load(a.requests // 2, 5 * 10**6)
            prof.disable()
            pstats.Stats(prof).sort_stats("tottime").print_stats(a.profile)
    print(f"answers by status: {dict(sorted(answered.items()))}")
    gc_s, _, counts, by_gen, collected = gc_time
    print(f"garbage collector: {gc_s:.3f} CPU s ({counts} collections, CPU s by generation "
          f"{[round(x, 3) for x in by_gen]}, collected {collected}; "
          f"{len(gc.get_objects())} objects tracked)")
    figures.sort()
    print(f"best {figures[0] * 1e6:.1f}, median {figures[len(figures) // 2] * 1e6:.1f} CPU "
          f"us/request ({a.rounds} rounds of {a.requests} requests, {a.concurrency} "
          f"concurrent, access log {a.access_log}); load average {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
