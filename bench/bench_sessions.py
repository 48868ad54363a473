"""Stateful sessions vs resending the history, and batched sessions vs one per runtime call.

A stateful forecaster (a length-aware 2-layer GRU of 64, one feature, a per-step head: the
shape of the demo's co2-forecast, random weights: the serving cost does not depend on them)
is packed here as a sequence-tagger and served by `seqserve serve` (1 API process + engine).
`--clients` concurrent closed-loop clients (httpx, one connection each) each hold one series
of `--history` steps and then, for `--seconds`:

- **sessions**: send one new step per request in their session (the history went in once,
  in the session's first chunk, before the clock starts);
- **resend**: send the whole history plus the new step each request (what a stateless server
  forces: the history is recomputed every time);
- **sessions, one per call**: as sessions, with the server's `--max-batch-size 1` (every
  session's step is its own runtime call).

Printed per history: requests/s, p50/p99 latency (ms), the ratios sessions / resend and
batched / one per call, CPU ms per request of the server's processes (from /proc), and the
load average. Not a timed test: a benchmark, figures go to docs/performance.md.

    python bench/bench_sessions.py --histories 64 512 --clients 64 --seconds 15
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.serving import wait_ready  # noqa: E402

MODEL = "bench-forecast"


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--histories", type=int, nargs="+", default=[64, 512])
    p.add_argument("--clients", type=int, default=64)
    p.add_argument("--seconds", type=float, default=15.0)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--out", type=Path, default=ROOT / "bench_results" / "sessions")
    p.add_argument("--skip-one-per-call", action="store_true",
                   help="leave out the --max-batch-size 1 run")
    return p.parse_args()


def pack_model(repo: Path, hidden: int, max_steps: int) -> None:
    import torch
    from torch import Tensor, nn

    import seqserve.pack

    class Forecaster(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.rnn = seqserve.pack.length_aware(nn.GRU(1, hidden, 2, batch_first=True))
            self.head = nn.Linear(hidden, 1)

        def forward(self, x: Tensor, lengths: Tensor, state: Tensor) -> tuple[Tensor, Tensor]:
            h0 = state.reshape(state.shape[0], 2, hidden).transpose(0, 1).contiguous()
            y, h_n = self.rnn(x, lengths, h0)
            return self.head(y), h_n.transpose(0, 1).reshape(state.shape[0], -1)

    torch.manual_seed(0)
    seqserve.pack.sequence_tagger(
        Forecaster().eval(), features=1, outputs=1, repo=repo, name=MODEL, version=1,
        normalization={"mean": [350.0], "std": [15.0]},
        output_scale={"mean": [0.0], "std": [1.0]}, max_steps=max_steps, progress=False)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_server(repo: Path, max_steps: int,
                 extra: list[str]) -> tuple[str, subprocess.Popen[bytes]]:

    port = free_port()
    cmd = [sys.executable, "-m", "seqserve.cli", "serve", "--repo", str(repo),
           "--port", str(port), "--log-level", "warning", "--max-tokens", str(max_steps),
           "--max-sessions", "4096", *extra]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    wait_ready(url, proc)
    print("server:", " ".join(cmd), file=sys.stderr)
    return url, proc


def stop_server(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the supervisor (it drains its processes), its whole group if it hangs."""
    proc.terminate()
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        os.killpg(os.getpgid(proc.pid), signal.SIGKILL)
        proc.wait()


def tree_cpu_s(pid: int) -> float:
    """User + system seconds of `pid` and its live descendants."""
    tick = os.sysconf("SC_CLK_TCK")
    total, todo = 0.0, [pid]
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            children.setdefault(int(fields[1]), []).append(int(entry))
    while todo:
        p = todo.pop()
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / tick
        todo += children.get(p, [])
    return total


def series(rng: np.random.Generator, steps: int) -> list[list[float]]:
    t = np.arange(steps)
    values = 350 + 3 * np.sin(2 * np.pi * t / 52) + rng.normal(0, 0.3, steps)
    return [[round(float(v), 3)] for v in values]


async def client(url: str, mode: str, index: int, history: int, stop_at: list[float],
                 latencies: list[float], errors: list[int]) -> None:
    import httpx

    rng = np.random.default_rng(index)
    path = f"{url}/v1/models/{MODEL}/predict"
    async with httpx.AsyncClient(timeout=60, limits=httpx.Limits(max_connections=1)) as http:
        past = series(rng, history)
        session = f"bench-{index}"
        while mode == "sessions":  # the history, once (429 under the start-up burst: retry)
            r = await http.post(path, json={"series": [past], "session": session,
                                            "start": True})
            if r.status_code != 429:
                r.raise_for_status()
                break
            await asyncio.sleep(float(r.headers.get("retry-after", "0.2")))
        while not stop_at:  # every client's history is in before the clock starts
            await asyncio.sleep(0.01)
        while time.monotonic() < stop_at[0]:
            step = series(rng, 1)
            if mode == "sessions":
                body: dict[str, Any] = {"series": [step], "session": session}
            else:
                past = [*past[1:], *step]  # the last `history` steps, resent
                body = {"series": [past]}
            t0 = time.perf_counter()
            r = await http.post(path, json=body)
            if r.status_code == 200:
                latencies.append(time.perf_counter() - t0)
            else:
                errors.append(r.status_code)


async def drive(url: str, mode: str, clients: int, history: int, seconds: float,
                pid: int) -> dict[str, Any]:
    latencies: list[float] = []
    errors: list[int] = []
    stop_at: list[float] = []
    tasks = [asyncio.create_task(client(url, mode, i, history, stop_at, latencies, errors))
             for i in range(clients)]
    await asyncio.sleep(0.5 if mode != "sessions" else 0.5 + clients * history / 20000)
    cpu0, t0 = tree_cpu_s(pid), time.monotonic()
    stop_at.append(t0 + seconds)
    await asyncio.gather(*tasks)
    wall = time.monotonic() - t0
    cpu = tree_cpu_s(pid) - cpu0
    done = len(latencies)
    lat = np.array(latencies) * 1000 if latencies else np.array([float("nan")])
    return {"mode": mode, "history": history, "requests": done, "errors": len(errors),
            "error_codes": sorted(set(errors)), "rps": done / wall,
            "p50_ms": float(np.percentile(lat, 50)), "p99_ms": float(np.percentile(lat, 99)),
            "cpu_ms_per_request": 1000 * cpu / max(done, 1), "load": os.getloadavg()[0]}


def show(row: dict[str, Any]) -> None:
    print(f"  {row['label']:<24} history {row['history']:>4}: {row['rps']:8.1f} req/s  "
          f"p50 {row['p50_ms']:7.1f} ms  p99 {row['p99_ms']:8.1f} ms  "
          f"server CPU {row['cpu_ms_per_request']:6.2f} ms/req  errors {row['errors']} "
          f"{row['error_codes']}  load {row['load']:.1f}", flush=True)


def main() -> int:
    args = parse_args()
    max_steps = max(args.histories) + 8
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="bench-sessions-") as tmp:
        repo = Path(tmp) / "repo"
        print(f"packing a stateful GRU forecaster (2x{args.hidden}) ...", file=sys.stderr)
        pack_model(repo, args.hidden, max_steps)
        runs = [("batched", []), ("one per call", ["--max-batch-size", "1"])]
        for label, extra in runs[:1] if args.skip_one_per_call else runs:
            url, proc = start_server(repo, max_steps, extra)
            try:
                for history in args.histories:
                    modes = ["sessions", "resend"] if label == "batched" else ["sessions"]
                    for mode in modes:
                        row = asyncio.run(drive(url, mode, args.clients, history, args.seconds,
                                                proc.pid))
                        row["label"] = f"{mode}, {label}"
                        show(row)
                        rows.append(row)
            finally:
                stop_server(proc)
    print("\nratios:")
    for history in args.histories:
        got = {r["label"]: r for r in rows if r["history"] == history}
        s, r = got.get("sessions, batched"), got.get("resend, batched")
        one = got.get("sessions, one per call")
        if s and r:
            print(f"  history {history}: sessions / resend = {s['rps'] / r['rps']:.2f}x req/s, "
                  f"p99 {s['p99_ms']:.1f} vs {r['p99_ms']:.1f} ms (target >= 10x at 512)")
        if s and one:
            print(f"  history {history}: batched sessions / one per call = "
                  f"{s['rps'] / one['rps']:.2f}x req/s (target >= 3x)")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(rows, indent=2))
    print(f"raw results: {args.out / 'results.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
