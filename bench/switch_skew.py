"""Benchmark (not a test): how long two API processes may answer unpinned requests with
different default versions during a swap (issue 34: the switch is per API process).

Serves a copy of `--repo` with `--layout hybrid --api-workers N --model-control explicit`,
keeps `--clients` threads sending classify requests on new connections (spread over the API
processes by SO_REUSEPORT) and recording (start, end, version) of each, then `--swaps` times
publishes a new version (a hidden copy renamed into place) and loads it. For each swap the
window is the latest start of a request answered by the old version minus the earliest end of
one answered by the new version: positive when a client got the old version after another
client had already got the new one (0: none did).

    .venv/bin/python bench/switch_skew.py --repo model_repository --model langid --swaps 5
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from model_churn import free_port  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repo", type=Path, required=True)
    ap.add_argument("--model", default="langid")
    ap.add_argument("--swaps", type=int, default=5)
    ap.add_argument("--clients", type=int, default=6)
    ap.add_argument("--api-workers", default="2")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-skew-"))
    repo = work / "repo"
    shutil.copytree(args.repo, repo)
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "seqserve.cli", "serve", "--repo", str(repo), "--port",
         str(port), "--model-control", "explicit", "--load-model", args.model, "--no-grpc",
         "--layout", "hybrid", "--api-workers", args.api_workers],
        cwd=ROOT, env={**os.environ, "SEQSERVE_LOG_LEVEL": "warning"})
    url = f"http://127.0.0.1:{port}"
    seen: list[tuple[float, float, int]] = []
    stop = threading.Event()
    lock = threading.Lock()

    def client() -> None:
        while not stop.is_set():
            start = time.monotonic()
            try:
                r = httpx.post(f"{url}/v1/models/{args.model}/classify",
                               json={"texts": ["vingt et un"]}, timeout=30)
            except httpx.HTTPError:
                continue
            if r.status_code == 200:
                with lock:
                    seen.append((start, time.monotonic(), int(r.json()["version"])))

    windows: list[float] = []
    try:
        deadline = time.monotonic() + 300
        while True:
            try:
                if httpx.get(f"{url}/v2/health/ready", timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline or proc.poll() is not None:
                raise SystemExit("the server did not start")
            time.sleep(0.2)
        threads = [threading.Thread(target=client, daemon=True) for _ in range(args.clients)]
        for t in threads:
            t.start()
        folder = repo / args.model
        old = max(int(p.name) for p in folder.iterdir() if p.name.isdigit())
        for _ in range(args.swaps):
            time.sleep(1.0)
            new = old + 1
            shutil.copytree(folder / str(old), folder / f".tmp-{new}")
            (folder / f".tmp-{new}").rename(folder / str(new))
            with lock:
                seen.clear()
            httpx.post(f"{url}/v2/repository/models/{args.model}/load",
                       timeout=300).raise_for_status()
            time.sleep(1.0)
            with lock:
                got = list(seen)
            last_old = max((s for s, _, v in got if v == old), default=None)
            first_new = min((e for _, e, v in got if v == new), default=None)
            window = 0.0 if last_old is None or first_new is None else max(
                0.0, last_old - first_new)
            windows.append(window)
            print(f"v{old} -> v{new}: {len(got)} answers, window {window * 1000:.2f} ms",
                  flush=True)
            old = new
        stop.set()
        for t in threads:
            t.join(30)
    finally:
        stop.set()
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
        shutil.rmtree(work, ignore_errors=True)
    print(json.dumps({"swaps": len(windows), "window_ms": [round(w * 1000, 2) for w in windows],
                      "max_ms": round(max(windows) * 1000, 2)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
