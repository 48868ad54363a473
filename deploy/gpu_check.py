"""GPU check (run by deploy/gpu-check.sh on a machine with a CUDA GPU and torch).

Classifier part: the demo classifier bundle through the TorchScript runtime on CUDA against
the same runtime on the CPU (max |logit difference| over mixed-length test-split batches),
raw sequences/s at batch 1, 64 and 256 on both devices, then the real server
(`create_app` with runtime=torchscript, device=cuda) under uvicorn on 127.0.0.1: ready,
classify answers equal to the CPU runtime's, and requests/s under 64 concurrent clients.
The translator part lives in bench/bench_translate.py --gpu-check (the script calls both).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from seqserve.export.manifest import Manifest, list_bundles, load_bundle  # noqa: E402
from seqserve.models.text.tokenizer import Tokenizer  # noqa: E402


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repo", type=Path, default=Path("model_repository"))
    p.add_argument("--model", default="langid")
    p.add_argument("--data", type=Path, default=Path("data/langid/test.jsonl"))
    p.add_argument("--device", default="cuda")
    p.add_argument("--seconds", type=float, default=3.0, help="timing window per point")
    p.add_argument("--json", type=Path, default=None)
    return p.parse_args()


def newest_bundle(repo: Path, model: str) -> tuple[Path, Manifest]:
    versions = [(v, Path(p)) for n, v, p in list_bundles(repo) if n == model]
    if not versions:
        raise SystemExit(f"no bundle {model} in {repo}")
    path = max(versions)[1]
    return path, load_bundle(path, verify=True)


def texts_from(path: Path, n: int = 512) -> list[str]:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [r["text"] for r in rows[:n]]


def batch(tok: Tokenizer, texts: list[str]) -> dict[str, np.ndarray]:
    ids = [tok.encode(t) or [tok.unk_id] for t in texts]
    width = max(len(x) for x in ids)
    arr = np.zeros((len(ids), width), dtype=np.int64)
    for i, row in enumerate(ids):
        arr[i, : len(row)] = row
    return {"input_ids": arr, "lengths": np.array([len(x) for x in ids], dtype=np.int64)}


def runtime(path: Path, manifest: Manifest, device: str) -> Any:
    """The bundle's TorchScript twins; if this torch cannot load them (files saved by a newer
    torch), the twins are traced again here from the bundle's source run, and we say so."""
    from seqserve.service.runtimes.torchscript import TorchScriptRuntime

    files = {g: path / str(spec.file("torchscript")) for g, spec in manifest.graphs.items()}
    try:
        return TorchScriptRuntime(files, manifest, device=device)
    except Exception as exc:
        print(f"bundle TorchScript files do not load here ({exc!r:.300}); re-tracing them "
              "from the source run with this torch")
    return TorchScriptRuntime(retrace(manifest), manifest, device=device)


def retrace(manifest: Manifest) -> dict[str, Path]:
    import tempfile

    from seqserve.export.formats import export_torchscript
    from seqserve.export.graphs import graph_defs
    from seqserve.models.checkpoint import load_run

    run_dir = Path(manifest.source_run["path"])
    if not run_dir.is_dir():
        run_dir = Path("runs") / run_dir.name
    model, _config, tok = load_run(run_dir)
    out = Path(tempfile.mkdtemp(prefix="gpu_check_ts_"))
    files = {}
    for gdef in graph_defs(manifest.task, model.eval(), tok.vocab_size):
        files[gdef.name] = out / f"{gdef.name}.pt"
        export_torchscript(gdef, files[gdef.name])
    return files


def parity(cpu: Any, gpu: Any, tok: Tokenizer, texts: list[str]) -> float:
    worst = 0.0
    for start in range(0, len(texts), 64):
        inputs = batch(tok, texts[start : start + 64])
        a = cpu.run("classifier", inputs)["logits"]
        b = gpu.run("classifier", inputs)["logits"]
        worst = max(worst, float(np.abs(a - b).max()))
    return worst


def throughput(rt: Any, tok: Tokenizer, texts: list[str], size: int, seconds: float) -> float:
    reps = (texts * (size // len(texts) + 1))[:size]
    inputs = batch(tok, reps)
    rt.run("classifier", inputs)  # warm-up
    done, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        rt.run("classifier", inputs)
        done += size
    return done / (time.perf_counter() - start)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def serve(repo: Path, device: str, port: int) -> Any:
    import uvicorn

    from seqserve.service.server.app import create_app
    from seqserve.service.web.settings import Settings

    settings = Settings(repo=repo, runtime="torchscript", device=device, port=port,
                        max_batch_size=256, max_texts=256, max_batch_tokens=65536)
    config = uvicorn.Config(create_app(settings), host="127.0.0.1", port=port,
                            log_level="warning")
    server = uvicorn.Server(config)
    threading.Thread(target=server.run, daemon=True).start()
    return server


async def http_checks(base: str, model: str, texts: list[str], cpu_logits: np.ndarray,
                      labels: list[str], seconds: float) -> dict[str, Any]:
    import httpx

    async with httpx.AsyncClient(base_url=base, timeout=60) as client:
        status = "no answer"
        for _ in range(600):
            try:
                r = await client.get("/v2/health/ready")
                status = f"{r.status_code} {r.text}"
                if r.status_code == 200:
                    break
            except httpx.TransportError as exc:  # not listening yet
                status = repr(exc)
            await asyncio.sleep(0.5)
        else:
            raise SystemExit(f"server never became ready: {status}")
        models = (await client.get("/v1/models")).json()
        r = await client.post(f"/v1/models/{model}/classify",
                              json={"texts": texts[:64], "top_k": len(labels)})
        r.raise_for_status()
        served = r.json()
        agree = sum(
            res["label"] == labels[int(np.argmax(row))]
            for res, row in zip(served["results"], cpu_logits[:64], strict=True)
        )
        latencies: list[float] = []
        stop = time.perf_counter() + seconds

        async def worker(i: int) -> None:
            while time.perf_counter() < stop:
                t0 = time.perf_counter()
                resp = await client.post(f"/v1/models/{model}/classify",
                                         json={"texts": [texts[i % len(texts)]]})
                resp.raise_for_status()
                latencies.append(time.perf_counter() - t0)
                i += 64

        start = time.perf_counter()
        await asyncio.gather(*(worker(i) for i in range(64)))
        elapsed = time.perf_counter() - start
    lat = sorted(latencies)
    return {
        "models": models,
        "labels_agree_with_cpu": f"{agree}/64",
        "http_req_per_s_64_clients": len(lat) / elapsed,
        "http_p50_ms": 1000 * statistics.median(lat),
        "http_p99_ms": 1000 * lat[int(0.99 * (len(lat) - 1))],
    }


def main() -> None:
    args = parse_args()
    import torch

    print(f"torch {torch.__version__}, cuda available: {torch.cuda.is_available()}, "
          f"device: {torch.cuda.get_device_name(0) if torch.cuda.is_available() else '-'}")
    path, manifest = newest_bundle(args.repo, args.model)
    tok = Tokenizer.load(path / manifest.tokenizer.file)
    texts = texts_from(args.data)
    cpu, gpu = runtime(path, manifest, "cpu"), runtime(path, manifest, args.device)
    report: dict[str, Any] = {"bundle": str(path)}
    report["max_abs_logit_diff_cuda_vs_cpu"] = parity(cpu, gpu, tok, texts)
    print(f"parity: max |logits cuda - cpu| = {report['max_abs_logit_diff_cuda_vs_cpu']:.2e}")
    print(f"{'batch':>6}{'cpu seq/s':>12}{'cuda seq/s':>12}")
    for size in (1, 64, 256):
        c = throughput(cpu, tok, texts, size, args.seconds)
        g = throughput(gpu, tok, texts, size, args.seconds)
        report[f"batch_{size}"] = {"cpu_seq_per_s": c, "cuda_seq_per_s": g}
        print(f"{size:>6}{c:>12.0f}{g:>12.0f}")
    cpu_logits = cpu.run("classifier", batch(tok, texts[:64]))["logits"]
    port = free_port()
    server = serve(args.repo, args.device, port)
    try:
        http = asyncio.run(http_checks(f"http://127.0.0.1:{port}", args.model, texts,
                                       cpu_logits, list(manifest.labels), args.seconds))
    finally:
        server.should_exit = True
    report["http"] = http
    print(f"server (torchscript on {args.device}): labels equal to CPU runtime "
          f"{http['labels_agree_with_cpu']}; 64 clients: "
          f"{http['http_req_per_s_64_clients']:.0f} req/s, p50 {http['http_p50_ms']:.1f} ms, "
          f"p99 {http['http_p99_ms']:.1f} ms")
    if args.json:
        args.json.write_text(json.dumps(report, indent=2, default=str))


if __name__ == "__main__":
    main()
