"""Benchmark (not a test): load and unload a model version N times in a running server, and
what each process's memory does (issue 34: ONNX Runtime sessions and arenas really freed).

Starts `seqserve serve --model-control explicit` on a copy of `--repo` (`--api-workers 0`:
one process; else the supervisor with its API processes and, in the engine layout, the engine
process), then `--cycles` times: `POST /v2/repository/models/MODEL/load`, `--requests`
requests to it, `POST .../unload`. After each cycle the RSS of every server process (from
/proc) is read; the report is each process's RSS at cycle 5 and at the last, and the growth
in between (the issue's bound: under 10 MB from cycle 5 to 50), plus the load and unload
times the client saw.

    .venv/bin/python bench/model_churn.py --repo model_repository --model numbers-en-fr \\
        --cycles 50 --api-workers 2 --layout hybrid --json bench_results/control.json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def children(pid: int) -> list[int]:
    """`pid` and its child processes."""
    out = [pid]
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(stat[1]) == pid:
                out.append(int(entry.name))
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def request(client: httpx.Client, task: str, model: str) -> None:
    body: dict[str, Any] = {"texts": ["one two three"]}
    r = client.post(f"/v1/models/{model}/{task}", json=body)
    r.raise_for_status()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repo", type=Path, required=True)
    ap.add_argument("--model", required=True, help="the model loaded and unloaded")
    ap.add_argument("--task", default="translate", help="its route: classify, translate, ...")
    ap.add_argument("--cycles", type=int, default=50)
    ap.add_argument("--requests", type=int, default=5, help="requests per cycle")
    ap.add_argument("--api-workers", default="0")
    ap.add_argument("--layout", default="auto")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-control-"))
    repo = work / "repo"
    shutil.copytree(args.repo, repo)
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "seqserve.cli", "serve", "--repo", str(repo), "--port",
         str(port), "--model-control", "explicit", "--no-grpc", "--api-workers",
         args.api_workers, "--layout", args.layout],
        cwd=ROOT, env={**os.environ, "SEQSERVE_LOG_LEVEL": "warning"})
    url = f"http://127.0.0.1:{port}"
    rss: list[dict[int, float]] = []
    load_s: list[float] = []
    unload_s: list[float] = []
    try:
        with httpx.Client(base_url=url, timeout=600) as client:
            deadline = time.monotonic() + 300
            while True:
                try:
                    if client.get("/v2/health/live").status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise SystemExit("the server did not start")
                time.sleep(0.2)
            base = f"/v2/repository/models/{args.model}"
            for cycle in range(args.cycles):
                start = time.perf_counter()
                client.post(f"{base}/load").raise_for_status()
                load_s.append(time.perf_counter() - start)
                for _ in range(args.requests):
                    request(client, args.task, args.model)
                start = time.perf_counter()
                client.post(f"{base}/unload").raise_for_status()
                unload_s.append(time.perf_counter() - start)
                time.sleep(0.2)  # the processes free what they drained
                rss.append({p: rss_mb(p) for p in children(proc.pid)})
                print(f"cycle {cycle + 1}: RSS MB " + ", ".join(
                    f"pid {p} {v:.1f}" for p, v in sorted(rss[-1].items())), flush=True)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
        shutil.rmtree(work, ignore_errors=True)
    first = min(4, len(rss) - 1)
    growth = {pid: rss[-1].get(pid, 0.0) - rss[first][pid] for pid in rss[first]}
    report = {"cycles": args.cycles, "model": args.model, "api_workers": args.api_workers,
              "layout": args.layout,
              "rss_mb_cycle_5": rss[first], "rss_mb_last": rss[-1],
              "growth_mb_cycle_5_to_last": growth,
              "load_s_median": sorted(load_s)[len(load_s) // 2],
              "unload_s_median": sorted(unload_s)[len(unload_s) // 2]}
    print(json.dumps(report, indent=2))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2))
    return 0 if max(growth.values()) < 10 else 1


if __name__ == "__main__":
    sys.exit(main())
