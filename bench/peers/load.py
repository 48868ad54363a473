"""Closed-loop load: C keep-alive connections, one new text per request, for D seconds.

Two clients drive the same numbering of texts (texts.py):
- wrk (default): C, multi-threaded; compose.lua builds each body from the workload's data file.
- python: an asyncio HTTP/1.1 client in this process, for machines without wrk (and the
  smoke test); on a 2-core box it is itself a bottleneck well below wrk (the harness measures
  both clients' ceilings against a trivial server).
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bench.peers.texts import Workload

LUA = Path(__file__).with_name("compose.lua")


@dataclass
class LoadResult:
    """What one load run measured (latencies in ms)."""

    requests: int
    seconds: float
    p50_ms: float
    p90_ms: float
    p99_ms: float
    max_ms: float
    errors: dict[str, int] = field(default_factory=dict)
    """Non-2xx answers ("status") and transport failures, by kind; zeros left out."""

    @property
    def rps(self) -> float:
        return self.requests / self.seconds if self.seconds else 0.0

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "rps": round(self.rps, 1)}


@dataclass(frozen=True)
class Load:
    """One closed-loop run's shape: where, how many connections, how long, which texts."""

    url: str
    path: str
    workload: Workload
    data_file: Path
    """The workload's data file for compose.lua (Workload.data_file)."""
    start: int
    """The first text number of this run."""
    seconds: float
    connections: int = 64
    threads: int = 2
    """wrk threads."""
    timeout_s: float = 30.0


def wrk_path() -> str | None:
    return shutil.which("wrk")


def run_wrk(load: Load) -> LoadResult:
    """Run wrk with compose.lua and read the JSON line its done() prints."""
    exe = wrk_path()
    if exe is None:
        raise RuntimeError("wrk is not installed (apt-get install wrk), or pass --client python")
    threads = max(1, min(load.threads, load.connections))
    cmd = [exe, "-t", str(threads), "-c", str(load.connections),
           "-d", f"{max(1, round(load.seconds))}s", "--timeout", f"{int(load.timeout_s)}s",
           "-s", str(LUA), load.url, "--", str(load.data_file), str(load.start), load.path,
           str(threads)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=load.seconds + 120)
    line = next((x for x in out.stdout.splitlines() if x.startswith("PEERS_JSON ")), None)
    if out.returncode != 0 or line is None:
        raise RuntimeError(f"wrk failed ({out.returncode}): {out.stderr.strip() or out.stdout}")
    r = json.loads(line.removeprefix("PEERS_JSON "))
    errors = {k: int(r[k]) for k in ("status", "connect", "read", "write", "timeout") if r[k]}
    return LoadResult(requests=int(r["requests"]), seconds=r["duration_us"] / 1e6,
                      p50_ms=r["p50_us"] / 1e3, p90_ms=r["p90_us"] / 1e3,
                      p99_ms=r["p99_us"] / 1e3, max_ms=r["max_us"] / 1e3, errors=errors)


def run_python(load: Load) -> LoadResult:
    """The same load from an asyncio client in this process."""
    return asyncio.run(_python_load(load))


async def _python_load(load: Load) -> LoadResult:
    host, port = load.url.removeprefix("http://").split(":")
    lat: list[float] = []
    errors: dict[str, int] = {}
    begin = time.perf_counter()
    stop_at = begin + load.seconds

    async def connection(c: int) -> None:
        try:
            reader, writer = await asyncio.open_connection(host, int(port))
        except OSError:
            errors["connect"] = errors.get("connect", 0) + 1
            return
        k = 0
        try:
            while time.perf_counter() < stop_at:
                text = load.workload.text(load.start + k * load.connections + c)
                k += 1
                body = json.dumps({"texts": [text]}).encode()
                t0 = time.perf_counter()
                writer.write(f"POST {load.path} HTTP/1.1\r\nHost: {host}:{port}\r\n"
                             "Content-Type: application/json\r\n"
                             f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
                status = await asyncio.wait_for(_read_response(reader), load.timeout_s)
                lat.append(time.perf_counter() - t0)
                if not 200 <= status < 300:
                    errors["status"] = errors.get("status", 0) + 1
        except (OSError, asyncio.IncompleteReadError, TimeoutError):
            errors["read"] = errors.get("read", 0) + 1
        finally:
            writer.close()

    await asyncio.gather(*(connection(c) for c in range(load.connections)))
    elapsed = time.perf_counter() - begin
    ms = sorted(x * 1e3 for x in lat) or [0.0]

    def pct(q: float) -> float:
        return ms[min(len(ms) - 1, int(q / 100 * len(ms)))]

    return LoadResult(requests=len(lat), seconds=elapsed, p50_ms=pct(50), p90_ms=pct(90),
                      p99_ms=pct(99), max_ms=ms[-1], errors=errors)


async def _read_response(reader: asyncio.StreamReader) -> int:
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":")[1])
    await reader.readexactly(length)
    return int(head.split(b" ", 2)[1])


def run_load(client: str, load: Load) -> LoadResult:
    """Drive `load` with the named client ("wrk" or "python")."""
    return run_wrk(load) if client == "wrk" else run_python(load)
