"""A flood of huge, unterminated request headers against seqserve checkouts, side by side:
the API process's peak RSS and how long health probes take meanwhile.

    python bench/header_flood.py --repo model_repository before=/tmp/base after=.

Each variant is LABEL=CHECKOUT (served with `python -m seqserve.cli serve`, or an older
checkout's `seqserve.service.cli`, PYTHONPATH=CHECKOUT, one API process and no engine). The
flood: --connections connections each send a request line and one header value of
--megabytes MB that never ends, as fast as the server reads it; meanwhile a prober sends
`GET /v2/health/live` on fresh connections every 0.2 s. Printed per variant: the peak RSS of
the serving process, its RSS before, the bytes the server accepted before it closed each
flooding connection, and the probes' median and worst time.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

CHUNK = b"a" * 65536


def rss_mb(pid: int) -> float:
    """Resident memory of `pid` and its children (the serving processes), in MB."""
    total = 0
    pids = [pid]
    try:
        out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True,
                             text=True).stdout
        pids += [int(p) for p in out.split()]
    except OSError:
        pass
    for p in pids:
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
        except OSError:
            continue
    return total / 1024


async def flood(port: int, megabytes: float, sent: list[int]) -> None:
    """One connection sending an endless header until the server closes it (or the size)."""
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
    except OSError:
        return
    writer.write(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\nX-Flood: ")
    total, limit = 0, int(megabytes * 1e6)
    try:
        while total < limit:
            writer.write(CHUNK)
            await writer.drain()
            total += len(CHUNK)
    except (ConnectionError, OSError):
        pass
    finally:
        sent.append(total)
        writer.close()


async def probe(port: int, stop: asyncio.Event, times: list[float]) -> None:
    while not stop.is_set():
        start = time.monotonic()
        try:
            reader, writer = await asyncio.wait_for(
                asyncio.open_connection("127.0.0.1", port), 10)
            writer.write(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            await asyncio.wait_for(reader.read(), 10)
            writer.close()
            times.append(time.monotonic() - start)
        except (TimeoutError, OSError):
            times.append(float("inf"))
        await asyncio.sleep(0.2)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_live(port: int, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), 1) as s:
                s.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                if b" 200 " in s.recv(200):
                    return
        except OSError:
            pass
        time.sleep(0.2)
    raise RuntimeError("server did not come up")


def run_variant(label: str, checkout: Path, args: argparse.Namespace) -> dict[str, float]:
    port = free_port()
    module = "seqserve.cli" if (checkout / "seqserve" / "cli").is_dir() else \
        "seqserve.service.cli"
    cmd = [sys.executable, "-m", module, "serve", "--repo", str(args.repo), "--port", str(port),
           "--api-workers", "1", "--layout", "replicated", "--log-level", "warning",
           "--no-warmup"]
    proc = subprocess.Popen(cmd, env={**os.environ, "PYTHONPATH": str(checkout)}, cwd=checkout,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_live(port)
        before = rss_mb(proc.pid)
        peak = before
        sent: list[int] = []
        times: list[float] = []

        async def go() -> None:
            nonlocal peak
            stop = asyncio.Event()
            prober = asyncio.create_task(probe(port, stop, times))
            floods = [asyncio.create_task(flood(port, args.megabytes, sent))
                      for _ in range(args.connections)]
            end = time.monotonic() + args.seconds
            while time.monotonic() < end and not all(f.done() for f in floods):
                peak = max(peak, rss_mb(proc.pid))
                await asyncio.sleep(0.05)
            for f in floods:
                f.cancel()
            await asyncio.gather(*floods, return_exceptions=True)
            peak = max(peak, rss_mb(proc.pid))
            stop.set()
            await prober

        asyncio.run(go())
        finite = [t for t in times if t != float("inf")]
        return {"rss_before_mb": before, "rss_peak_mb": peak,
                "accepted_mb_per_connection": statistics.median(sent or [0]) / 1e6,
                "probe_median_ms": 1000 * statistics.median(finite or [float("nan")]),
                "probe_worst_ms": 1000 * max(times or [float("nan")]),
                "probes_failed": float(len(times) - len(finite))}
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("variants", nargs="+", metavar="LABEL=CHECKOUT")
    p.add_argument("--repo", type=Path, default=Path("model_repository"))
    p.add_argument("--connections", type=int, default=32)
    p.add_argument("--megabytes", type=float, default=24.0)
    p.add_argument("--seconds", type=float, default=20.0, help="most time per flood")
    args = p.parse_args()
    args.repo = args.repo.resolve()
    for text in args.variants:
        label, _, checkout = text.partition("=")
        r = run_variant(label, Path(checkout).resolve(), args)
        print(f"{label:10s} RSS {r['rss_before_mb']:.0f} -> peak {r['rss_peak_mb']:.0f} MB; "
              f"accepted {r['accepted_mb_per_connection']:.2f} MB per connection; health "
              f"probe median {r['probe_median_ms']:.1f} ms, worst {r['probe_worst_ms']:.0f} ms, "
              f"failed {r['probes_failed']:.0f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
