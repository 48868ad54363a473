"""Benchmark (not a test): continuous vs request-level decoding vs eager PyTorch beam search.

N concurrent clients each send one test-split sentence at a time (beam 5 by default) to
(a) the decode scheduler with step-level continuous batching, (b) the same decode loop
with request-level batching (an admitted batch runs to completion before the next is admitted),
(c) per-request eager PyTorch beam search (`seqserve.models.nn.decoding.beam_search`, one at
a time).
Prints generated tokens/s, p50/p99 latency, the process CPU time per 1000 generated tokens
(all threads: less sensitive than wall time to other work on a shared machine) and how much of
it the encoder and decoder_step graphs take themselves (thread CPU time of their calls), the
ratios,
and the decode loop's decoder-step time per row at the batch sizes it actually ran.

`--gpu-check` instead runs the decode loop with the TorchScript runtime on CUDA: outputs compared
token by token with the same runtime on CPU, and tokens/s at 1, 32 and 256 concurrent
requests. (Imports no pydantic/FastAPI, so it runs in a bare PyTorch image.)

    .venv/bin/python bench/bench_translate.py --repo model_repository --model numbers-en-fr
    .venv/bin/python bench/bench_translate.py ... --tree /tmp/old   # another tree's decode loop
    python3 bench/bench_translate.py --gpu-check --repo ... --data DIR_WITH_TEST_JSONL
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np


def _tree() -> str:
    """The source tree whose decode loop is measured (`--tree`, read before the imports below)."""
    if "--tree" in sys.argv[:-1]:
        return str(Path(sys.argv[sys.argv.index("--tree") + 1]).resolve())
    return str(Path(__file__).resolve().parents[1])


sys.path.insert(0, _tree())

from seqserve.export.manifest import Manifest, load_bundle  # noqa: E402
from seqserve.export.versions import list_bundles  # noqa: E402
from seqserve.models.text.tokenizer import Tokenizer  # noqa: E402
from seqserve.service.scheduling.decoding import DecodeConfig, DecodeLoop, StepStats  # noqa: E402
from seqserve.service.scheduling.search import DecodeLimits, SearchOptions  # noqa: E402

ROW_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repo", type=Path, default=Path("model_repository"))
    p.add_argument("--model", default="numbers-en-fr")
    p.add_argument("--data", default="numbers-en-fr",
                   help="built-in dataset name or folder with test.jsonl")
    p.add_argument("--sentences", type=int, default=2000,
                   help="sentences per mode (enough for a few seconds of decoding)")
    p.add_argument("--clients", type=int, default=32)
    p.add_argument("--beam-size", type=int, default=5)
    p.add_argument("--threads", type=int, default=1, help="ORT intra-op and torch threads")
    p.add_argument("--switch-interval-ms", type=float, default=0.5,
                   help="the GIL switch interval (sys.setswitchinterval) of the process; "
                   "0.5, the server's default (ProcessSettings), unless told otherwise")
    p.add_argument("--groups", type=int, default=1, help="decode loop decoder-step groups")
    p.add_argument("--admit-steps", type=int, default=4,
                   help="decoder steps arrivals may wait for a fuller encoder batch while "
                        "others decode (the server's --decode-admit-steps)")
    p.add_argument("--max-admit", type=int, default=64,
                   help="most sources in one encoder batch (the server's --max-batch-size)")
    p.add_argument("--runtime", choices=["onnx", "torchscript"], default="onnx")
    p.add_argument("--run-dir", type=Path, default=None,
                   help="training run for (c) (default: the manifest's source run)")
    p.add_argument("--skip-eager", action="store_true")
    p.add_argument("--only", choices=["continuous", "request-level"], default=None,
                   help="run this one decode-loop mode alone (for a profiler); no ratios")
    p.add_argument("--gpu-check", action="store_true",
                   help="TorchScript on CUDA vs CPU: equality and tokens/s at 1/32/256")
    p.add_argument("--json", type=Path, default=None, help="also write the figures here")
    p.add_argument("--tree", default=None,
                   help="measure the decode loop of this source tree (e.g. an older commit's)")
    return p.parse_args()


def make_runtime(kind: str, device: str, threads: int, path: Path, manifest: Manifest) -> Any:
    """The bundle's runtime, built without the server settings."""
    fmt = "onnx" if kind == "onnx" else "torchscript"
    files = {g: path / str(spec.file(fmt)) for g, spec in manifest.graphs.items()}
    if kind == "onnx":
        from seqserve.service.runtimes.onnx import OnnxRuntime

        providers = ["CUDAExecutionProvider"] if device == "cuda" else []
        return OnnxRuntime(files, [*providers, "CPUExecutionProvider"], threads, 1)
    from seqserve.service.runtimes.torchscript import TorchScriptRuntime

    return TorchScriptRuntime(files, manifest, device=device, intra_op_threads=threads)


class EagerRuntime:
    """The eager model behind the runtime interface (GPU check fallback when the installed
    torch cannot load the bundle's TorchScript files)."""

    name = "eager"

    def __init__(self, run_dir: Path | str, device: str) -> None:
        import torch

        from seqserve.models.checkpoint import load_run

        model, _, _ = load_run(run_dir)
        self.model = model.to(device).eval()
        self.device = torch.device(device)
        self.providers = [device]

    def run(self, graph: str, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        import torch

        t = {k: torch.from_numpy(np.ascontiguousarray(v)).to(self.device)
             for k, v in inputs.items()}
        m: Any = self.model
        names: tuple[str, ...]
        with torch.inference_mode():
            if graph == "encoder":
                out = m.encode(t["src_ids"], t["src_lengths"])
                names = ("memory", "src_mask", "state")
            else:
                out = m.decode_step(t["prev_ids"], t["state"], t["memory"], t["src_mask"],
                                    t["memory_index"], int(inputs["k"][0]))
                names = ("new_state", "topk_logprobs", "topk_ids", "attention")
        return {n: o.cpu().numpy() for n, o in zip(names, out, strict=True)}


def gpu_runtime(device: str, args: argparse.Namespace, path: Path, manifest: Manifest) -> Any:
    try:
        runtime = make_runtime("torchscript", device, args.threads, path, manifest)
        runtime.run("encoder", {"src_ids": np.array([[5, 6]]), "src_lengths": np.array([2])})
        return runtime
    except Exception as exc:  # e.g. files from a newer torch, or a graph pinned to the CPU
        print(f"TorchScript on {device} failed ({exc!r:.200}); using the eager model",
              file=sys.stderr)
        return EagerRuntime(args.run_dir or manifest.source_run["path"], device)


def test_sentences(data: str, n: int) -> list[str]:
    folder = Path(data)
    if (folder / "test.jsonl").is_file():
        rows = [json.loads(line) for line in (folder / "test.jsonl").open(encoding="utf-8")]
    else:
        from seqserve.models.data.registry import generate

        rows = generate(data).splits["test"]
    sources = [str(r["source"]) for r in rows]
    return [sources[i % len(sources)] for i in range(n)]


def bundle(repo: Path, model: str) -> tuple[Path, Manifest]:
    versions = {v: p for name, v, p in list_bundles(repo) if name == model}
    if not versions:
        sys.exit(f"{repo}: no bundle named {model!r}")
    path = versions[max(versions)]
    return path, load_bundle(path)


async def drive(clients: int, items: list[list[int]],
                one: Callable[[list[int]], Awaitable[int]], label: str) -> dict[str, float]:
    """`clients` closed-loop clients over `items`; tokens/s and latency percentiles."""
    latencies: list[float] = []
    tokens = 0
    it = iter(items)

    async def client() -> None:
        nonlocal tokens
        for src in it:
            t0 = time.perf_counter()
            n = await one(src)  # (not `tokens += await ...`: it would lose updates)
            tokens += n
            latencies.append(time.perf_counter() - t0)
            if len(latencies) % 64 == 0:
                print(f"  [{label}] {len(latencies)}/{len(items)}", file=sys.stderr)

    start, cpu = time.perf_counter(), time.process_time()
    await asyncio.gather(*(client() for _ in range(clients)))
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    lat = np.array(latencies)
    return {"sentences": len(items), "tokens": tokens, "wall_s": wall,
            "tokens_per_s": tokens / wall, "p50_ms": float(np.percentile(lat, 50) * 1e3),
            "p99_ms": float(np.percentile(lat, 99) * 1e3), "cpu_s": cpu,
            "cpu_ms_per_1k_tokens": cpu / max(tokens, 1) * 1e6}


class GraphClock:
    """The runtime with each graph's CPU time (the calling thread's) summed: the graphs' own
    cost beside the process's, so that what surrounds them shows."""

    def __init__(self, runtime: Any) -> None:
        self.runtime = runtime
        self.cpu: dict[str, float] = {}

    def __getattr__(self, name: str) -> Any:
        return getattr(self.runtime, name)

    def run(self, graph: str, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        start = time.thread_time()
        try:
            return self.runtime.run(graph, inputs)  # type: ignore[no-any-return]
        finally:
            self.cpu[graph] = self.cpu.get(graph, 0.0) + time.thread_time() - start


async def loop_mode(runtime: Any, limits: DecodeLimits, items: list[list[int]],
                      args: argparse.Namespace, continuous: bool) -> tuple[dict[str, float],
                                                                           StepStats]:
    config = DecodeConfig(max_live_hypotheses=max(256, args.clients * args.beam_size),
                          max_queue=4096, max_admit=args.max_admit, continuous=continuous,
                          groups=args.groups, retry_after_s=1.0, max_queue_wait_s=None,
                          admit_steps=args.admit_steps if continuous else 0)
    options = SearchOptions(beam_size=args.beam_size)
    clock = GraphClock(runtime)
    async with DecodeLoop(clock, limits, config) as decoder:
        await decoder.translate(items[:8], options)  # warm-up
        decoder.stats = StepStats()
        clock.cpu = {}

        async def one(src: list[int]) -> int:
            best = (await decoder.translate([src], options))[0].hypotheses[0]
            return len(best.token_ids) - int(best.ended)

        label = "continuous" if continuous else "request-level"
        figures = await drive(args.clients, items, one, label)
    for graph in ("encoder", "decoder_step"):
        figures[f"{graph}_cpu_ms_per_1k_tokens"] = (clock.cpu.get(graph, 0.0)
                                                    / max(figures["tokens"], 1) * 1e6)
    return figures, decoder.stats


async def eager_mode(manifest: Manifest, items: list[list[int]],
                     args: argparse.Namespace) -> dict[str, float]:
    import torch

    from seqserve.models.checkpoint import load_run
    from seqserve.models.nn.decoding import beam_search

    torch.set_num_threads(args.threads)
    model, _, _ = load_run(args.run_dir or manifest.source_run["path"])
    model.eval()
    pool = ThreadPoolExecutor(max_workers=1)  # one request at a time, as a plain server would

    def decode(src: list[int]) -> int:
        ids = torch.tensor([src])
        hyps = beam_search(model, ids, torch.tensor([len(src)]),  # type: ignore[arg-type]
                           beam_size=args.beam_size, n_best=1, length_penalty=0.0)
        return len(hyps[0][0].tokens) if hyps[0] else 0

    for src in items[:4]:
        decode(src)
    loop = asyncio.get_running_loop()

    async def one(src: list[int]) -> int:
        return await loop.run_in_executor(pool, decode, src)

    try:
        return await drive(args.clients, items, one, "eager")
    finally:
        pool.shutdown()


def step_table(stats: StepStats) -> list[tuple[str, int, float, float]]:
    """(rows bucket, calls, mean ms per step, us per row) of the decode loop's decoder steps."""
    out = []
    lo = 1
    for hi in ROW_BUCKETS:
        rows = [r for r in stats.calls if lo <= r <= hi]
        if rows:
            calls = sum(stats.calls[r] for r in rows)
            secs = sum(stats.seconds[r] for r in rows)
            row_calls = sum(stats.calls[r] * r for r in rows)
            out.append((f"{lo}-{hi}" if lo < hi else str(hi), calls, secs / calls * 1e3,
                        secs / row_calls * 1e6))
        lo = hi + 1
    return out


def main() -> None:
    args = parse_args()
    sys.setswitchinterval(args.switch_interval_ms / 1000.0)
    path, manifest = bundle(args.repo, args.model)
    if args.gpu_check:
        gpu_check(args, path, manifest)
        return
    runtime = make_runtime(args.runtime, "cpu", args.threads, path, manifest)
    tok = Tokenizer.load(path / manifest.tokenizer.file)
    t = manifest.tokenizer
    limits = DecodeLimits(t.bos_id, t.eos_id, t.vocab_size,
                          int(manifest.limits.get("max_decode_length", 128)))
    texts = test_sentences(args.data, args.sentences)
    items = [tok.encode(x)[: int(manifest.limits.get("max_tokens", 256))] for x in texts]
    print(f"{args.model} v{manifest.version} ({args.runtime}), {len(items)} sentences "
          f"(mean {statistics.mean(map(len, items)):.1f} source tokens), {args.clients} "
          f"clients, beam {args.beam_size}, {args.threads} thread(s), {args.groups} group(s), "
          f"decode loop of {_tree()}")
    results: dict[str, dict[str, float]] = {}
    if args.only:
        figures, st = asyncio.run(loop_mode(runtime, limits, items, args,
                                            args.only == "continuous"))
        print(f"{args.only}: {figures['tokens_per_s']:.1f} tokens/s, p99 "
              f"{figures['p99_ms']:.1f} ms, {st.steps} steps, "
              f"{figures['cpu_ms_per_1k_tokens']:.1f} cpu ms/1k tokens")
        return
    results["a_continuous"], stats = asyncio.run(loop_mode(runtime, limits, items, args, True))
    results["b_request_level"], stats_b = asyncio.run(
        loop_mode(runtime, limits, items, args, False))
    if not args.skip_eager:
        results["c_eager"] = asyncio.run(eager_mode(manifest, items, args))
    report(results, stats, stats_b)
    if args.json:
        args.json.write_text(json.dumps({"results": results, "steps": {
            "continuous": step_table(stats), "request_level": step_table(stats_b)}}, indent=2))


def report(results: dict[str, dict[str, float]], stats: StepStats, stats_b: StepStats) -> None:
    print(f"\n{'mode':<16}{'tokens':>8}{'wall s':>9}{'tokens/s':>10}{'p50 ms':>9}{'p99 ms':>9}"
          f"{'cpu ms/1k tok':>15}")
    for mode, r in results.items():
        print(f"{mode:<16}{r['tokens']:>8.0f}{r['wall_s']:>9.2f}{r['tokens_per_s']:>10.1f}"
              f"{r['p50_ms']:>9.1f}{r['p99_ms']:>9.1f}{r['cpu_ms_per_1k_tokens']:>15.1f}")
    for mode, r in results.items():
        if "encoder_cpu_ms_per_1k_tokens" in r:
            enc, dec = r["encoder_cpu_ms_per_1k_tokens"], r["decoder_step_cpu_ms_per_1k_tokens"]
            print(f"  {mode}: graphs' own CPU ms/1k tokens: encoder {enc:.1f}, decoder_step "
                  f"{dec:.1f}; the rest (loop, search, clients) "
                  f"{r['cpu_ms_per_1k_tokens'] - enc - dec:.1f}")
    a, b = results["a_continuous"], results["b_request_level"]
    print(f"\n(a)/(b) tokens/s: {a['tokens_per_s'] / b['tokens_per_s']:.2f}x   "
          f"(a)/(b) p99: {a['p99_ms'] / b['p99_ms']:.2f}x")
    if "c_eager" in results:
        print(f"(a)/(c) tokens/s: {a['tokens_per_s'] / results['c_eager']['tokens_per_s']:.2f}x")
    for label, st in (("continuous", stats), ("request-level", stats_b)):
        print(f"\ndecoder step time by rows ({label}; {st.steps} steps)")
        print(f"{'rows':>9}{'steps':>8}{'ms/step':>10}{'us/row':>9}")
        for bucket, calls, ms, us in step_table(st):
            print(f"{bucket:>9}{calls:>8}{ms:>10.3f}{us:>9.1f}")


def gpu_check(args: argparse.Namespace, path: Path, manifest: Manifest) -> None:
    """The decode loop + TorchScript on CUDA: same tokens as on CPU; tokens/s at 1, 32, 256
    clients on each device (the machine's CPU cores vs its GPU)."""
    tok = Tokenizer.load(path / manifest.tokenizer.file)
    t = manifest.tokenizer
    limits = DecodeLimits(t.bos_id, t.eos_id, t.vocab_size,
                          int(manifest.limits.get("max_decode_length", 128)))
    items = [tok.encode(x) for x in test_sentences(args.data, args.sentences)]
    options = SearchOptions(beam_size=args.beam_size)
    outputs: dict[str, list[tuple[int, ...]]] = {}
    figures: dict[str, Any] = {}
    for device in ("cpu", "cuda"):
        runtime = gpu_runtime(device, args, path, manifest)
        print(f"{device}: runtime {runtime.name}", file=sys.stderr)
        config = DecodeConfig(max_live_hypotheses=256 * args.beam_size, max_queue=8192,
                              max_admit=256, groups=1, retry_after_s=1.0,
                              max_queue_wait_s=None)

        async def all_at_once(runtime: Any = runtime, config: DecodeConfig = config) -> Any:
            async with DecodeLoop(runtime, limits, config) as decoder:
                return await decoder.translate(items, options)

        decoded = asyncio.run(all_at_once())
        outputs[device] = [d.hypotheses[0].token_ids for d in decoded]
        for clients in (1, 32, 256):  # the same sweep on both devices: CUDA vs CPU
            async def sweep(clients: int = clients, runtime: Any = runtime,
                            config: DecodeConfig = config, device: str = device) -> Any:
                async with DecodeLoop(runtime, limits, config) as decoder:
                    await decoder.translate(items[:8], options)  # warm-up

                    async def one(src: list[int]) -> int:
                        best = (await decoder.translate([src], options))[0].hypotheses[0]
                        return len(best.token_ids) - int(best.ended)

                    return await drive(clients, items, one, f"{device} x{clients}")

            figures[f"{device}_clients_{clients}"] = asyncio.run(sweep())
    same = sum(a == b for a, b in zip(outputs["cpu"], outputs["cuda"], strict=True))
    print(f"\nTorchScript cuda vs cpu: {same}/{len(items)} translations token-identical")
    print(f"{'device':>7}{'clients':>8}{'tokens/s':>10}{'p50 ms':>9}{'p99 ms':>9}")
    for device in ("cpu", "cuda"):
        for clients in (1, 32, 256):
            r = figures[f"{device}_clients_{clients}"]
            print(f"{device:>7}{clients:>8}{r['tokens_per_s']:>10.1f}{r['p50_ms']:>9.1f}"
                  f"{r['p99_ms']:>9.1f}")
    if args.json:
        args.json.write_text(json.dumps({"identical": same, "total": len(items),
                                         "figures": figures}, indent=2))


if __name__ == "__main__":
    main()
