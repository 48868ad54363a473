"""Classifier serving benchmark (not a test): batching on vs off against this machine's limits.

    python bench/bench_classify.py make-bundle --repo /tmp/bench_repo      # canonical, untrained
    python bench/bench_classify.py run --repo model_repository --model langid
    python bench/bench_classify.py gpu-check --repo model_repository --model langid  # GPU box

`run` measures, in one go and under the same load (C concurrent keep-alive connections, one
text of 10-60 words per request, a raw asyncio HTTP/1.1 client to keep client cost small):

1. floor:    a no-op FastAPI endpoint (parses the same JSON, answers a small JSON) = HTTP floor
2. compute:  bare ONNX Runtime on the same model, sequences/s at its best batch size
3. on:       `seqserve serve` with batching (max batch B)
4. off:      `seqserve serve` with max batch 1

and prints req/s, p50/p99, mean batch size, padding ratio (computed tokens / real tokens),
the ceiling 1 / (1/floor + 1/compute) and the ratios against the targets.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

NOOP_APP = """
from fastapi import FastAPI
from pydantic import BaseModel
class Body(BaseModel):
    texts: list[str]
app = FastAPI(telemetry={"tracing": False, "metrics": False, "logs": False,
                         "operation_spans": False})  # as seqserve's app
@app.post("/v1/models/{name}/classify")
async def noop(name: str, body: Body) -> dict:
    return {"model": name, "results": [{"label": "x", "score": 1.0} for _ in body.texts]}
@app.get("/v2/health/ready")
async def ready() -> dict:
    return {"ready": True}
"""


# ---- load generation -------------------------------------------------------------------


def request_texts(n: int, seed: int = 0) -> list[str]:
    """n texts of 10-60 words drawn from the built-in langid data."""
    from seqserve.models.data.registry import generate

    ds = generate("langid", size=2000, seed=seed)
    words = [w for ex in ds.splits["train"] for w in str(ex["text"]).split()]
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        start = rng.randrange(len(words) - 60)
        out.append(" ".join(words[start: start + rng.randint(10, 60)]))
    return out


def _request(host: str, port: int, path: str, text: str) -> bytes:
    body = json.dumps({"texts": [text]}).encode()
    head = (f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode()
    return head + body


async def _one_connection(host: str, port: int, payloads: list[bytes], lat: list[float],
                          codes: dict[int, int], stop_at: float) -> None:
    reader, writer = await asyncio.open_connection(host, port)
    i = 0
    while time.perf_counter() < stop_at:
        t0 = time.perf_counter()
        writer.write(payloads[i % len(payloads)])
        i += 1
        head = await reader.readuntil(b"\r\n\r\n")
        status = int(head.split(b" ", 2)[1])
        length = 0
        for line in head.split(b"\r\n"):
            if line.lower().startswith(b"content-length:"):
                length = int(line.split(b":")[1])
        await reader.readexactly(length)
        lat.append(time.perf_counter() - t0)
        codes[status] = codes.get(status, 0) + 1
    writer.close()


def load(host: str, port: int, path: str, texts: list[str], concurrency: int,
         seconds: float) -> dict[str, Any]:
    """Closed-loop load for `seconds`; returns req/s, latencies (s), time and status counts."""
    lat: list[float] = []
    codes: dict[int, int] = {}

    async def main() -> float:
        shards = [[_request(host, port, path, t) for t in texts[c::concurrency]]
                  for c in range(concurrency)]
        start = time.perf_counter()
        stop = start + seconds
        await asyncio.gather(*(_one_connection(host, port, s, lat, codes, stop) for s in shards))
        return time.perf_counter() - start

    elapsed = asyncio.run(main())
    return {"rps": len(lat) / elapsed, "lat": lat, "seconds": elapsed, "codes": codes}


# ---- servers ---------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_ready(port: int, proc: subprocess.Popen[bytes], timeout: float = 300) -> None:
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"server exited with {proc.returncode}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/v2/health/ready", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise SystemExit("server did not become ready")


def start(cmd: list[str], port: int, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(cmd, cwd=ROOT, env={**os.environ, **(env or {})},
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_ready(port, proc)
    return proc


def stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()


def scrape(port: int) -> dict[str, float]:
    """Sums of the batch histograms for every model."""
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name in ("seqserve_batch_size_sum", "seqserve_batch_size_count",
                          "seqserve_batch_tokens_sum"):
                out[s.name] = out.get(s.name, 0.0) + s.value
    return out


def serve_cmd(args: argparse.Namespace, port: int, max_batch: int) -> list[str]:
    return [sys.executable, "-m", "seqserve.cli", "serve", "--repo", str(args.repo),
            "--port", str(port), "--max-batch-size", str(max_batch),
            "--max-wait-ms", str(args.max_wait_ms), "--intra-op-threads", str(args.threads),
            "--queue-size", "1024", "--log-level", "warning",
            "--max-batch-tokens", str(args.max_batch_tokens)]


def noop_cmd(port: int) -> list[str]:
    return [sys.executable, "-m", "uvicorn", "noop_app:app", "--port", str(port),
            "--log-level", "warning", "--no-access-log"]


def merge(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """Rounds of one phase into one result (rates over total time, latencies pooled)."""
    lat = sorted(x for p in parts for x in p["lat"])
    seconds = sum(p["seconds"] for p in parts)
    codes: dict[int, int] = {}
    for p in parts:
        for k, v in p["codes"].items():
            codes[k] = codes.get(k, 0) + v
    return {"rps": len(lat) / seconds, "p50_ms": lat[len(lat) // 2] * 1000,
            "p99_ms": lat[min(len(lat) - 1, int(len(lat) * 0.99))] * 1000, "codes": codes}


def batch_stats(before: dict[str, float], after: dict[str, float], mean_tokens: float
                ) -> dict[str, float]:
    d = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after}
    batches = max(d.get("seqserve_batch_size_count", 0.0), 1.0)
    rows = d.get("seqserve_batch_size_sum", 0.0)
    real = rows * mean_tokens  # the client cycles through the texts uniformly
    return {"mean_batch": rows / batches,
            "padding_ratio": d.get("seqserve_batch_tokens_sum", 0.0) / max(real, 1.0)}


def compute_phase(args: argparse.Namespace, ids: list[list[int]]) -> dict[str, Any]:
    """Bare ORT sequences/s per batch size, rows in arrival order and rows grouped by length
    (sorted: no padding to speak of); the best of all is the compute rate."""
    import numpy as np
    import onnxruntime as ort

    from seqserve.export.manifest import load_bundle
    from seqserve.export.versions import list_bundles

    path = max((p for n, _, p in list_bundles(args.repo) if n == args.model), key=str)
    manifest = load_bundle(path)
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = args.threads
    onnx_file = manifest.graphs["classifier"].onnx
    if onnx_file is None:
        raise SystemExit(f"{path}: bundle has no ONNX graph")
    sess = ort.InferenceSession(str(path / onnx_file), opts, providers=["CPUExecutionProvider"])
    rates: dict[str, float] = {}
    for order, rows_all in (("arrival", ids), ("sorted", sorted(ids, key=len))):
        for bs in (1, 8, 16, 32, 64):
            if order == "sorted" and bs == 1:
                continue
            done, start, i = 0, time.perf_counter(), 0
            while time.perf_counter() - start < max(1.0, args.seconds / 3):
                rows = [rows_all[(i + k) % len(rows_all)] for k in range(bs)]
                i += bs
                lengths = np.array([len(r) for r in rows], dtype=np.int64)
                x = np.zeros((bs, int(lengths.max())), dtype=np.int64)
                for k, r in enumerate(rows):
                    x[k, : len(r)] = r
                sess.run(None, {"input_ids": x, "lengths": lengths})
                done += bs
            rates[f"{order} b{bs}"] = done / (time.perf_counter() - start)
    best = max(rates, key=lambda b: rates[b])
    return {"rates": rates, "best_batch": best, "rate": rates[best]}


def run(args: argparse.Namespace) -> None:
    from seqserve.export.manifest import load_bundle
    from seqserve.export.versions import list_bundles
    from seqserve.models.text.tokenizer import Tokenizer

    path = max((p for n, _, p in list_bundles(args.repo) if n == args.model), key=str)
    tok = Tokenizer.load(path / load_bundle(path).tokenizer.file)
    texts = request_texts(2048)
    ids = [tok.encode(t) for t in texts]
    lengths = [len(i) for i in ids]
    mean = sum(lengths) / len(lengths)
    print(f"model {args.model} ({path}); {len(texts)} texts, mean {mean:.1f} tokens "
          f"(min {min(lengths)}, max {max(lengths)}); {args.concurrency} connections, "
          f"{args.rounds} rounds x {args.seconds:.0f}s per phase, phases interleaved", flush=True)
    print("bare ONNX Runtime ...", flush=True)
    compute = compute_phase(args, ids)
    ports = {"floor": free_port(), "on": free_port(), "off": free_port()}
    procs = []
    url_path = f"/v1/models/{args.model}/classify"
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "noop_app.py").write_text(NOOP_APP)
        try:
            procs.append(start(noop_cmd(ports["floor"]), ports["floor"], {"PYTHONPATH": tmp}))
            procs.append(start(serve_cmd(args, ports["on"], args.max_batch_size), ports["on"]))
            procs.append(start(serve_cmd(args, ports["off"], 1), ports["off"]))
            for port in ports.values():  # warm every path once
                load("127.0.0.1", port, url_path, texts, args.concurrency, 1.0)
            parts: dict[str, list[dict[str, Any]]] = {k: [] for k in ports}
            stats: dict[str, list[dict[str, float]]] = {"on": [], "off": []}
            for r in range(args.rounds):
                for name, port in ports.items():
                    before = scrape(port) if name != "floor" else {}
                    parts[name].append(load("127.0.0.1", port, url_path, texts,
                                            args.concurrency, args.seconds))
                    if name != "floor":
                        stats[name].append(batch_stats(before, scrape(port), mean))
                print(f"  round {r + 1}/{args.rounds}: " + ", ".join(
                    f"{k} {v[-1]['rps']:.0f} req/s" for k, v in parts.items()), flush=True)
        finally:
            for p in procs:
                stop(p)
    results = {k: merge(v) for k, v in parts.items()}
    for name in ("on", "off"):
        n = len(stats[name])
        results[name]["mean_batch"] = sum(s["mean_batch"] for s in stats[name]) / n
        results[name]["padding_ratio"] = sum(s["padding_ratio"] for s in stats[name]) / n
    report(results["floor"], compute, results["on"], results["off"])


def report(floor: dict[str, Any], compute: dict[str, Any], on: dict[str, Any],
           off: dict[str, Any]) -> None:
    ceiling = 1 / (1 / floor["rps"] + 1 / compute["rate"])
    print()
    print(f"{'phase':<22}{'req/s':>9}{'p50 ms':>9}{'p99 ms':>9}{'batch':>8}{'pad':>7}  codes")
    print(f"{'no-op FastAPI floor':<22}{floor['rps']:>9.0f}{floor['p50_ms']:>9.1f}"
          f"{floor['p99_ms']:>9.1f}{'':>8}{'':>7}  {floor['codes']}")
    for name, r in (("batching on", on), ("batching off", off)):
        print(f"{name:<22}{r['rps']:>9.0f}{r['p50_ms']:>9.1f}{r['p99_ms']:>9.1f}"
              f"{r['mean_batch']:>8.1f}{r['padding_ratio']:>7.2f}  {r['codes']}")
    rates = ", ".join(f"{b}: {v:.0f}" for b, v in compute["rates"].items())
    print(f"bare ONNX Runtime seq/s: {rates} (best: {compute['best_batch']})")
    print(f"ceiling = 1/(1/{floor['rps']:.0f} + 1/{compute['rate']:.0f}) = {ceiling:.0f} req/s")
    print(f"batching on / ceiling   = {on['rps'] / ceiling:.2f}   (target >= 0.85)")
    print(f"batching on / off       = {on['rps'] / off['rps']:.2f}x  (target >= 1.5x), "
          f"p99 {on['p99_ms']:.1f} vs {off['p99_ms']:.1f} ms (target: lower)")
    print(f"computed / real tokens  = {on['padding_ratio']:.2f}   (target <= 1.15)")


def make_bundle(args: argparse.Namespace) -> None:
    """An untrained canonical classifier (vocab 8000, 128/128, 2-layer biLSTM) as a bundle."""
    import torch

    from seqserve.export.bundle import export_run
    from seqserve.models.checkpoint import build_model, save_checkpoint
    from seqserve.models.config import TrainConfig
    from seqserve.models.data.registry import generate
    from seqserve.models.text.tokenizer import train_tokenizer

    torch.set_num_threads(1)
    ds = generate("langid", size=4000, seed=0)
    run_dir = Path(tempfile.mkdtemp(prefix="bench-run-"))
    tok = train_tokenizer([str(e["text"]) for e in ds.splits["train"]], run_dir / "tokenizer.model",
                          vocab_size=args.vocab)
    cfg = {"vocab_size": tok.vocab_size, "num_labels": len(ds.labels)}
    torch.manual_seed(0)
    model = build_model("classifier", cfg)
    save_checkpoint(model, run_dir / "model.safetensors")
    config = {"task": "classifier", "model": model.config.to_dict(),
              "train": TrainConfig().to_dict(), "labels": ds.labels, "data": "langid (untrained)"}
    (run_dir / "config.json").write_text(json.dumps(config))
    (run_dir / "DONE").write_text("")
    out = export_run(run_dir, args.repo, args.model, progress=True)
    print(f"bundle: {out}")


def gpu_check(args: argparse.Namespace) -> None:
    """TorchScript runtime on `--device` vs CPU: parity, seq/s at batch 1/64/256 (length-grouped
    rows), then the server (--runtime torchscript) under the same 64-connection load."""
    import numpy as np

    from seqserve.export.manifest import load_bundle
    from seqserve.export.versions import list_bundles
    from seqserve.models.text.tokenizer import Tokenizer
    from seqserve.service.runtimes import graph_files
    from seqserve.service.runtimes.torchscript import TorchScriptRuntime

    path = max((p for n, _, p in list_bundles(args.repo) if n == args.model), key=str)
    manifest = load_bundle(path)
    tok = Tokenizer.load(path / manifest.tokenizer.file)
    texts = json.loads(args.texts.read_text()) if args.texts else request_texts(1024)
    ids = [tok.encode(t) for t in texts]
    files = graph_files(path, manifest, "torchscript")
    cpu = TorchScriptRuntime(files, manifest, "cpu")
    dev = TorchScriptRuntime(files, manifest, args.device)

    def feed(rows: list[list[int]]) -> dict[str, Any]:
        lengths = np.array([len(r) for r in rows], dtype=np.int64)
        x = np.zeros((len(rows), int(lengths.max())), dtype=np.int64)
        for k, r in enumerate(rows):
            x[k, : len(r)] = r
        return {"input_ids": x, "lengths": lengths}

    for bs in (1, 7, 64, 256):
        a, b = cpu.run("classifier", feed(ids[:bs])), dev.run("classifier", feed(ids[:bs]))
        diff = max(float(np.abs(a[k] - b[k]).max()) for k in a)
        print(f"parity {args.device} vs cpu, batch {bs}: max abs diff {diff:.2e}", flush=True)
    grouped = sorted(ids, key=len)
    for bs in (1, 64, 256):
        dev.run("classifier", feed(grouped[:bs]))
        n, t0, i = 0, time.perf_counter(), 0
        while time.perf_counter() - t0 < args.seconds:
            dev.run("classifier", feed([grouped[(i + k) % len(grouped)] for k in range(bs)]))
            i, n = i + 7 * bs, n + bs
        rate = n / (time.perf_counter() - t0)
        print(f"torchscript {args.device} batch {bs}: {rate:.0f} seq/s", flush=True)
    for max_batch in (64, 1):
        port = free_port()
        cmd = [*serve_cmd(args, port, max_batch), "--runtime", "torchscript", "--device",
               args.device]
        proc = start(cmd, port)
        try:
            url_path = f"/v1/models/{args.model}/classify"
            load("127.0.0.1", port, url_path, texts, args.concurrency, 1.0)
            r = merge([load("127.0.0.1", port, url_path, texts, args.concurrency, args.seconds)])
        finally:
            stop(proc)
        print(f"server torchscript {args.device}, max batch {max_batch}: {r['rps']:.0f} req/s, "
              f"p50 {r['p50_ms']:.1f} ms, p99 {r['p99_ms']:.1f} ms, {r['codes']}", flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    mk = sub.add_parser("make-bundle", help="export an untrained canonical classifier")
    mk.add_argument("--repo", type=Path, required=True)
    mk.add_argument("--model", default="bench-clf")
    mk.add_argument("--vocab", type=int, default=8000)
    r = sub.add_parser("run", help="run the benchmark")
    r.add_argument("--repo", type=Path, default=Path("model_repository"))
    r.add_argument("--model", default="bench-clf")
    r.add_argument("--concurrency", type=int, default=64)
    r.add_argument("--seconds", type=float, default=5.0, help="per phase per round")
    r.add_argument("--rounds", type=int, default=3)
    r.add_argument("--max-batch-size", type=int, default=16)
    r.add_argument("--max-batch-tokens", type=int, default=4096)
    r.add_argument("--max-wait-ms", type=float, default=2.0)
    r.add_argument("--threads", type=int, default=1, help="ORT intra-op threads")
    g = sub.add_parser("gpu-check", help="TorchScript on CUDA: parity, throughput, server")
    g.add_argument("--repo", type=Path, default=Path("model_repository"))
    g.add_argument("--model", default="bench-clf")
    g.add_argument("--device", default="cuda")
    g.add_argument("--texts", type=Path, help="JSON list of texts (default: generated)")
    g.add_argument("--concurrency", type=int, default=64)
    g.add_argument("--seconds", type=float, default=3.0)
    g.add_argument("--max-batch-tokens", type=int, default=16384)
    g.add_argument("--max-wait-ms", type=float, default=2.0)
    g.add_argument("--threads", type=int, default=0, help="intra-op threads (0 = default)")
    args = p.parse_args()
    {"make-bundle": make_bundle, "run": run, "gpu-check": gpu_check}[args.cmd](args)


if __name__ == "__main__":
    main()
