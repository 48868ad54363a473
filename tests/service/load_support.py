"""Load on a real `seqserve serve` while something happens to it (SIGTERM to the supervisor,
SIGKILL of the engine), with every answer counted: status, reset, refused or hang.

Clients: `keepalive` loops, each on its own keep-alive connection (a new one after an answer
that said `Connection: close`), plus a request on a new connection every `new_every_s`.
Also runnable, to measure (prints the tallies as JSON):

    PYTHONPATH=$PWD python tests/service/load_support.py sigterm|sigkill-engine --repo REPO
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))

from process_support import Server, serve  # noqa: E402

PATH = "/v1/models/tiny-clf/classify"
BODY = {"texts": ["one two three"]}
HANG_S = 5.0
"""A request with no answer after this long counts as a hang."""


@dataclass
class Shot:
    sent: float
    done: float
    outcome: int | str
    """HTTP status, or "reset" (connection broken mid-request), "refused", "hang"."""
    fresh: bool
    """On a new connection (else on a keep-alive one)."""


@dataclass
class Load:
    url: str
    keepalive: int = 8
    new_every_s: float = 0.1
    shots: list[Shot] = field(default_factory=list)
    stop_at: float = float("inf")
    """time.monotonic() after which no new request is sent."""

    async def _one(self, client: httpx.AsyncClient, fresh: bool) -> None:
        sent = time.monotonic()
        try:
            r = await client.post(PATH, json=BODY)
            outcome: int | str = r.status_code
            if r.status_code in (429, 503):
                assert r.headers.get("retry-after"), r.headers
        except httpx.ConnectError:
            outcome = "refused"
        except httpx.TimeoutException:
            outcome = "hang"
        except httpx.TransportError:
            outcome = "reset"
        self.shots.append(Shot(sent, time.monotonic(), outcome, fresh))

    async def _loop(self) -> None:
        limits = httpx.Limits(max_connections=1, max_keepalive_connections=1)
        async with httpx.AsyncClient(base_url=self.url, timeout=HANG_S, limits=limits) as c:
            while time.monotonic() < self.stop_at:
                await self._one(c, fresh=False)
                if self.shots[-1].outcome in ("refused", "reset", "hang"):
                    await asyncio.sleep(0.05)

    async def _fresh(self) -> None:
        async with httpx.AsyncClient(base_url=self.url, timeout=HANG_S) as c:
            await self._one(c, fresh=True)

    async def run(self) -> None:
        tasks = [asyncio.ensure_future(self._loop()) for _ in range(self.keepalive)]
        while time.monotonic() < self.stop_at:
            tasks.append(asyncio.ensure_future(self._fresh()))
            await asyncio.sleep(self.new_every_s)
        await asyncio.gather(*tasks)


def tally(shots: list[Shot]) -> dict[str, int]:
    out: collections.Counter[str] = collections.Counter()
    for s in shots:
        o = s.outcome
        out["2xx" if isinstance(o, int) and 200 <= o < 300 else str(o)] += 1
    return dict(out)


async def _ready(url: str) -> int | str:
    async with httpx.AsyncClient(timeout=2) as c:
        try:
            return (await c.get(f"{url}/v2/health/ready")).status_code
        except httpx.TransportError as exc:
            return type(exc).__name__


async def sigterm(server: Server, delay_s: float) -> dict[str, Any]:
    """Load, SIGTERM to the supervisor, load through the shutdown delay (new sends stop
    0.3 s before it ends, as the load balancer's would), then one new connection after it."""
    load = Load(server.url)
    runner = asyncio.ensure_future(load.run())
    await asyncio.sleep(1.0)
    server.proc.send_signal(signal.SIGTERM)
    t0 = time.monotonic()
    load.stop_at = t0 + delay_s - 0.3
    await asyncio.sleep(0.2)
    ready = await _ready(server.url)
    await runner
    await asyncio.sleep(max(0.0, t0 + delay_s + 0.5 - time.monotonic()))
    after = Load(server.url, keepalive=0)
    await after._fresh()
    rc = await asyncio.to_thread(server.proc.wait, 60)
    return {"before": tally([s for s in load.shots if s.sent < t0]),
            "delay": tally([s for s in load.shots if s.sent >= t0]),
            "delay_fresh": tally([s for s in load.shots if s.sent >= t0 and s.fresh]),
            "ready_during_delay": ready, "new_connection_after_delay": tally(after.shots),
            "exit": rc, "exit_s": round(time.monotonic() - t0, 2)}


def engine_pid(server: Server) -> int:
    return next(pid for pid, role in server.children().items() if role == "engine")


async def sigkill_engine(server: Server, after_s: float = 2.0) -> dict[str, Any]:
    """Load, SIGKILL of the engine, load for `after_s` more: every answer, how long the
    requests in flight at the kill (or sent after it) waited for theirs, and how long until
    the supervisor's new engine answered a request (the server goes on running)."""
    load = Load(server.url)
    runner = asyncio.ensure_future(load.run())
    await asyncio.sleep(1.0)
    os.kill(engine_pid(server), signal.SIGKILL)
    t0 = time.monotonic()
    load.stop_at = t0 + after_s
    await runner
    back = None
    async with httpx.AsyncClient(base_url=server.url, timeout=HANG_S) as c:
        while back is None and time.monotonic() < t0 + 120 and server.proc.poll() is None:
            if (await c.post(PATH, json=BODY)).status_code == 200:
                back = round(time.monotonic() - t0, 2)
            await asyncio.sleep(0.1)
    late = [s for s in load.shots if s.done >= t0]
    waits = [s.done - max(s.sent, t0) for s in late]
    return {"before": tally([s for s in load.shots if s.done < t0]),
            "at_or_after_kill": tally(late),
            "max_wait_after_kill_s": round(max(waits, default=0.0), 3),
            "served_again_s": back, "exit": server.proc.poll()}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("scenario", choices=["sigterm", "sigkill-engine"])
    parser.add_argument("--repo", required=True)
    parser.add_argument("--api-workers", default="2")
    parser.add_argument("--shutdown-delay-s", type=float, default=2.0)
    args = parser.parse_args()
    flags = ("--api-workers", args.api_workers, "--shutdown-delay-s",
             str(args.shutdown_delay_s))
    with serve(Path(args.repo), *flags) as server:
        if args.scenario == "sigterm":
            result = asyncio.run(sigterm(server, args.shutdown_delay_s))
        else:
            result = asyncio.run(sigkill_engine(server))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
