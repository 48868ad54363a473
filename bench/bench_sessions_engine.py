"""Benchmark (not a test): batched session chunks vs one chunk per runtime call, in process.

The demo's stateful forecaster (`co2-forecast`, a sequence-tagger with a state input and
output) behind the model the server builds (`scheduling.models.build_model`: the dynamic
batcher, the session store), no HTTP: `--clients` closed-loop clients each open a session
with `--history` steps, then for `--seconds` send one new step per call in it
(`BatchedModel.submit_session`). Run with the server's batching (max batch `--max-batch`,
`--max-wait-ms`) and with max batch 1 (every chunk its own runtime call), alternating
`--rounds` times; prints chunks/s, p50/p99 ms, process CPU ms per chunk, the ratio, and the
load average. Over HTTP the ~2 ms of a request hides the step (bench/bench_sessions.py).

    .venv/bin/python bench/bench_sessions_engine.py --clients 64 --seconds 5 --rounds 3
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from seqserve.export.manifest import load_bundle  # noqa: E402
from seqserve.export.versions import list_bundles  # noqa: E402
from seqserve.service.runtimes.onnx import OnnxRuntime  # noqa: E402
from seqserve.service.scheduling.batcher import BatcherConfig  # noqa: E402
from seqserve.service.scheduling.config import ModelConfig  # noqa: E402
from seqserve.service.scheduling.models import BatchedModel, build_model  # noqa: E402
from seqserve.service.scheduling.sessions import SessionConfig  # noqa: E402
from seqserve.service.scheduling.work import DecodeConfig  # noqa: E402


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repo", type=Path, default=Path("model_repository"))
    p.add_argument("--model", default="co2-forecast")
    p.add_argument("--clients", type=int, default=64)
    p.add_argument("--history", type=int, default=64, help="steps of each session's first chunk")
    p.add_argument("--seconds", type=float, default=5.0, help="measured per run")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--max-batch", type=int, default=32)
    p.add_argument("--max-wait-ms", type=float, default=2.0)
    p.add_argument("--overhead-tokens", type=float, default=64.0,
                   help="the batcher's fixed cost per batch in tokens (the server's default)")
    p.add_argument("--threads", type=int, default=1, help="ORT intra-op threads")
    return p.parse_args()


def model_for(args: argparse.Namespace, max_batch: int) -> BatchedModel:
    versions = {v: p for name, v, p in list_bundles(args.repo) if name == args.model}
    path = versions[max(versions)]
    manifest = load_bundle(path)
    files = {g: path / str(spec.file("onnx")) for g, spec in manifest.graphs.items()}
    runtime = OnnxRuntime(files, ["CPUExecutionProvider"], args.threads, 1)
    config = ModelConfig(
        batcher=BatcherConfig(max_batch_size=max_batch, max_batch_tokens=max_batch * 256,
                              max_wait_s=args.max_wait_ms / 1000, queue_size=100_000,
                              retry_after_s=1.0, max_queue_wait_s=None,
                              overhead_tokens=args.overhead_tokens),
        decode=DecodeConfig(max_live_hypotheses=1, max_queue=1, max_admit=1, groups=1,
                            retry_after_s=1.0, max_queue_wait_s=None),
        max_tokens=256, warmup=False,
        sessions=SessionConfig(max_sessions=100_000, idle_timeout_s=600.0, retry_after_s=1.0))
    model = build_model(args.model, runtime, manifest, config)
    assert isinstance(model, BatchedModel)
    return model


async def run(args: argparse.Namespace, max_batch: int, label: str) -> dict[str, float]:
    model = model_for(args, max_batch)
    await model.start()
    rng = np.random.default_rng(0)
    far = time.monotonic() + 3600
    sessions = [f"{label}-{i}" for i in range(args.clients)]
    await asyncio.gather(*(model.submit_session(
        rng.standard_normal((args.history, 1)).astype(np.float32), s, True, False, far)
        for s in sessions))
    latencies: list[float] = []
    stop = time.perf_counter() + args.seconds

    async def client(session: str) -> None:
        step = np.ones((1, 1), np.float32)
        while time.perf_counter() < stop:
            t0 = time.perf_counter()
            await model.submit_session(step, session, False, False, far)
            latencies.append(time.perf_counter() - t0)

    start, cpu = time.perf_counter(), time.process_time()
    await asyncio.gather(*(client(s) for s in sessions))
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    await model.stop(5.0)
    lat = np.array(latencies)
    return {"chunks_per_s": len(lat) / wall, "p50_ms": float(np.percentile(lat, 50) * 1e3),
            "p99_ms": float(np.percentile(lat, 99) * 1e3),
            "cpu_ms_per_chunk": cpu / len(lat) * 1e3, "load": os.getloadavg()[0]}


def main() -> None:
    args = parse_args()
    sys.setswitchinterval(0.0005)  # the server's ProcessSettings default
    rows: dict[str, list[dict[str, float]]] = {"batched": [], "one per call": []}
    for r in range(args.rounds):
        order = [("batched", args.max_batch), ("one per call", 1)]
        for label, size in order if r % 2 == 0 else order[::-1]:
            rows[label].append(asyncio.run(run(args, size, f"{label}{r}")))
    print(f"{args.model}: {args.clients} clients, history {args.history}, one step per chunk, "
          f"{args.seconds:.0f} s x {args.rounds} rounds (medians)")
    print(f"{'mode':<14}{'chunks/s':>10}{'p50 ms':>9}{'p99 ms':>9}{'cpu ms/chunk':>14}  load")
    med = {}
    for label, runs in rows.items():
        med[label] = {k: statistics.median(x[k] for x in runs) for k in runs[0]}
        m = med[label]
        loads = ", ".join(f"{x['load']:.1f}" for x in runs)
        print(f"{label:<14}{m['chunks_per_s']:>10.0f}{m['p50_ms']:>9.2f}{m['p99_ms']:>9.2f}"
              f"{m['cpu_ms_per_chunk']:>14.3f}  {loads}")
    ratios = [b["chunks_per_s"] / o["chunks_per_s"]
              for b, o in zip(rows["batched"], rows["one per call"], strict=True)]
    print(f"batched / one per call chunks/s: {statistics.median(ratios):.2f}x "
          f"(rounds {', '.join(f'{x:.2f}' for x in ratios)})")


if __name__ == "__main__":
    main()
