"""Benchmark (not a test): CPU per translation, the graphs' own share beside the rest, for a
plain batched beam search (the mosec and TorchServe translation peers' handler) in process and
for a served seqserve, in one run on the same bundle and test sentences.

    python bench/translation_cost.py --repo model_repository --sentences 2000 --seconds 10

(a) the peers' handler (`bench/peers/apps/common.py` `TranslatorBundle.translate_batch`, beam
5, batches of `--batch` sentences, one ONNX Runtime thread) translates the test sentences in
this process: its thread's CPU per translation, the encoder's and the decoder steps' own CPU
(thread time around each runtime call) and the row-steps it paid for. A peer server cannot
cost less than this per translation, whatever its HTTP front.

(b) `seqserve serve` (the defaults, `--log-level warning` as the peers harness runs it) under
64 closed-loop connections of one-sentence translations (bench/opengen.c, which costs the
machine little): the CPU of every server process per translation from /proc, split into the
API processes' main threads (the event loop: HTTP, tokenizing, the beam search's Python)
and their other threads (the runtime lanes: the graphs and the Python around each call).

(c) the served translator's decode loop (`scheduling.models.build_model` with the settings
`seqserve serve` resolves on this machine) in this process, under `--clients` closed-loop
clients of one sentence each: the event loop thread's CPU a decoder step, split into the
graphs, the scheduler's calls (schedule, update, settle) and, inside those, the compiled
kernel's; beside (a)'s Python a step. The issue's bound: the loop's interpreter cost a step
at most a plain batched beam search's.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.peers import servers as sv  # noqa: E402
from bench.peers.apps.common import TranslatorBundle  # noqa: E402
from bench.peers.run import bundle_dir  # noqa: E402


def peer_cost(folder: Path, texts: list[str], batch: int, beam: int) -> dict[str, float]:
    """(a): the batched search's CPU per translation, its graphs' and its row-steps."""
    bundle = TranslatorBundle(folder, threads=1)
    clock, shape = _Timed(), {"rows": 0.0, "steps": 0.0}
    bundle.encoder.run = clock.wrap("encoder", bundle.encoder.run)
    step = clock.wrap("decoder", bundle.step.run)

    def counted(names: Any, feed: dict[str, Any]) -> Any:
        shape["rows"] += len(feed["prev_ids"])
        shape["steps"] += 1
        return step(names, feed)

    bundle.step.run = counted
    bundle.translate_batch(texts[:batch], beam)  # warm
    clock.spent = {}
    shape.update(rows=0.0, steps=0.0)
    start = time.thread_time()
    for i in range(0, len(texts), batch):
        bundle.translate_batch(texts[i: i + batch], beam)
    total = time.thread_time() - start
    n = len(texts)
    encoder, decoder = clock.spent.get("encoder", 0.0), clock.spent.get("decoder", 0.0)
    return {"total_ms": 1e3 * total / n, "encoder_ms": 1e3 * encoder / n,
            "decoder_ms": 1e3 * decoder / n, "rest_ms": 1e3 * (total - encoder - decoder) / n,
            "row_steps": shape["rows"] / n, "steps": shape["steps"],
            "rest_us_per_step": 1e6 * (total - encoder - decoder) / max(shape["steps"], 1)}


class _Timed:
    """Thread CPU summed per name around calls (`wrap`): the decode loop's parts in (c)."""

    def __init__(self) -> None:
        self.spent: dict[str, float] = {}

    def wrap(self, name: str, call: Any) -> Any:
        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.thread_time()
            try:
                return call(*args, **kwargs)
            finally:
                self.spent[name] = self.spent.get(name, 0.0) + time.thread_time() - start
        return timed


class _Kernel:
    """The compiled module with each function's calls timed under "kernel"."""

    def __init__(self, module: Any, clock: _Timed) -> None:
        self.module, self.clock = module, clock

    def __getattr__(self, name: str) -> Any:
        return self.clock.wrap("kernel", getattr(self.module, name))


def loop_cost(repo: Path, folder: Path, texts: list[str], clients: int,
              beam: int) -> dict[str, float]:
    """(c): the served decode loop in process, a decoder step's thread CPU by part."""
    import asyncio
    import os

    from bench.bench_translate import GraphClock
    from seqserve.export.manifest import load_bundle
    from seqserve.models.text.tokenizer import Tokenizer
    from seqserve.service.runtimes.onnx import OnnxRuntime
    from seqserve.service.scheduling import beam_native, group
    from seqserve.service.scheduling.models import DecodedModel, build_model
    from seqserve.service.scheduling.search import SearchOptions
    from seqserve.service.server import layout
    from seqserve.service.web.settings import Settings

    manifest = load_bundle(folder)
    settings = layout.resolve(Settings(repo=repo), available=os.cpu_count() or 1)
    max_tokens = int(manifest.limits.get("max_tokens", settings.max_tokens))
    config = settings.engine_options().model_config(max_tokens)
    files = {g: folder / str(spec.file("onnx")) for g, spec in manifest.graphs.items()}
    runtime = GraphClock(OnnxRuntime(files, ["CPUExecutionProvider"], 1, 1))
    model = build_model(manifest.name, runtime, manifest, config)
    assert isinstance(model, DecodedModel), f"{manifest.name} is not a translator"
    tok = Tokenizer.load(folder / manifest.tokenizer.file)
    items = [tok.encode(t)[:max_tokens] for t in texts]
    options = SearchOptions(beam_size=beam)
    clock = _Timed()
    scheduler = model.loop.scheduler
    kernels = beam_native._kernel, group._kernel

    async def run() -> tuple[float, int]:
        await model.start()
        try:
            for f in model.submit(items[:8], options, time.monotonic() + 60):  # warm
                await f
            for name in ("schedule", "update", "settle"):
                setattr(scheduler, name, clock.wrap(name, getattr(scheduler, name)))
            if kernels[0] is not None:
                beam_native._kernel = _Kernel(kernels[0], clock)
            if kernels[1] is not None:
                group._kernel = _Kernel(kernels[1], clock)
            runtime.cpu, steps = {}, scheduler.stats.steps
            feed = iter(items)

            async def client() -> None:
                for src in feed:
                    (future,) = model.submit([src], options, time.monotonic() + 60)
                    await future

            start = time.thread_time()
            await asyncio.gather(*(client() for _ in range(clients)))
            return time.thread_time() - start, scheduler.stats.steps - steps
        finally:
            beam_native._kernel, group._kernel = kernels
            for name in ("schedule", "update", "settle"):
                vars(scheduler).pop(name, None)
            await model.stop(5.0)

    total, steps = asyncio.run(run())
    per_step = {k: 1e6 * v / max(steps, 1) for k, v in clock.spent.items()}
    graphs = sum(runtime.cpu.values())
    calls = sum(clock.spent.get(k, 0.0) for k in ("schedule", "update", "settle"))
    return {"total_us_per_step": 1e6 * total / max(steps, 1),
            "graphs_us_per_step": 1e6 * graphs / max(steps, 1),
            **{f"{k}_us_per_step": per_step.get(k, 0.0)
               for k in ("schedule", "update", "settle", "kernel")},
            "scheduler_us_per_step": 1e6 * calls / max(steps, 1),
            "driver_us_per_step": 1e6 * (total - graphs - calls) / max(steps, 1),
            "steps": float(steps), "translations_per_step": len(items) / max(steps, 1)}


GRAPH_SERIES = {"encoder_s": "seqserve_encoder_time_seconds_sum",
                "steps_s": "seqserve_decoder_step_time_seconds_sum",
                "rows": "seqserve_batch_size_sum"}
"""The served translator's graph time (wall, on the calling thread: one ONNX Runtime thread)
and its decoder steps' rows, summed over the API processes from `/metrics`."""


def graph_totals(port: int, model: str) -> dict[str, float]:
    """`GRAPH_SERIES` of `model` as `/metrics` reads them now."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
        text = answer.read().decode()
    totals = dict.fromkeys(GRAPH_SERIES, 0.0)
    label = f'model="{model}"'
    for line in text.splitlines():
        name, _, value = line.rpartition(" ")
        for key, series in GRAPH_SERIES.items():
            if name.startswith(series + "{") and label in name:
                totals[key] += float(value)
    return totals


def served_cost(repo: Path, model: str, texts: list[str], seconds: float, warmup: float,
                port: int, connections: int = 64) -> dict[str, float]:
    """(b): seqserve's CPU per translation by kind of thread, under `connections` closed-loop
    connections sending one of `texts` each."""
    from bench.opengen import run as load

    server = sv.seqserve("defaults", [sys.executable, "-m", "seqserve.cli", "serve",
                                      "--grpc-port", "0", "--model-control", "none"],
                         repo, model, task="translate")
    with tempfile.TemporaryDirectory(prefix="translation-cost-") as folder:
        proc = sv.start(server, port, Path(folder) / "server.log")
        try:
            sv.wait_ready(proc, port, server.path, texts[0], timeout_s=120)
            file = Path(folder) / "texts.txt"
            file.write_text("\n".join(t.replace("\n", " ") for t in texts) + "\n",
                            encoding="utf-8")
            spec = {"url": f"http://127.0.0.1:{port}", "model": model, "task": "translate",
                    "texts_per_request": 1, "concurrency": connections,
                    "duration_s": warmup, "texts_file": str(file)}
            load(spec)
            before, graphs_before = sv.session_thread_cpu_s(proc.pid), graph_totals(port, model)
            res = load({**spec, "duration_s": seconds})
            after, graphs_after = sv.session_thread_cpu_s(proc.pid), graph_totals(port, model)
        finally:
            sv.stop(proc)
    n = max(1, res["ok"])
    spent = {key: after[key] - before.get(key, 0.0) for key in after}
    main = sum(cpu for (pid, tid), cpu in spent.items() if pid == tid)
    other = sum(spent.values()) - main
    return {"translations_per_s": res["ok"] / res["wall_s"], "total_ms": 1e3 * (main + other) / n,
            "main_threads_ms": 1e3 * main / n, "other_threads_ms": 1e3 * other / n,
            "errors": res["other_errors"] + res["refused"],
            **{f"{key}_per": (graphs_after[key] - graphs_before[key]) / n
               for key in GRAPH_SERIES}}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repo", type=Path, default=Path("model_repository"))
    p.add_argument("--model", default="numbers-en-fr")
    p.add_argument("--version", default=None, help="default: the highest")
    p.add_argument("--data", type=Path, default=Path("data/numbers-en-fr/test.jsonl"))
    p.add_argument("--sentences", type=int, default=2000)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--beam", type=int, default=5)
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--warmup", type=float, default=3.0)
    p.add_argument("--port", type=int, default=8893)
    p.add_argument("--clients", type=int, default=32,
                   help="(c)'s closed-loop clients (one API process's share of 64 connections)")
    p.add_argument("--skip-served", action="store_true")
    args = p.parse_args()
    folder = bundle_dir(args.repo, args.model, args.version)
    texts = [json.loads(line)["source"] for line in args.data.read_text().splitlines()
             if line.strip()][: args.sentences]
    peer = peer_cost(folder, texts, args.batch, args.beam)
    print(f"(a) batched beam search in process (the peers' handler), {len(texts)} sentences in "
          f"batches of {args.batch}, beam {args.beam}: {peer['total_ms']:.3f} ms CPU per "
          f"translation = encoder {peer['encoder_ms']:.3f} + decoder steps "
          f"{peer['decoder_ms']:.3f} + the rest {peer['rest_ms']:.3f}; "
          f"{peer['row_steps']:.1f} row-steps per translation")
    graphs = peer["encoder_ms"] + peer["decoder_ms"]
    print(f"    a server running these graphs at (a)'s batch shapes and nothing else would serve "
          f"at most {peer['total_ms'] / graphs:.2f}x the translations/s of a server costing "
          f"(a) per translation, on the same cores")
    loop = loop_cost(args.repo, folder, texts, args.clients, args.beam)
    print(f"(c) seqserve's decode loop in process, {args.clients} clients of one sentence: "
          f"{loop['translations_per_step']:.2f} translations a step, "
          f"{loop['total_us_per_step']:.0f} us of the loop thread's CPU a step = graphs "
          f"{loop['graphs_us_per_step']:.0f} + "
          f"scheduler {loop['scheduler_us_per_step']:.0f} (schedule "
          f"{loop['schedule_us_per_step']:.0f}, update {loop['update_us_per_step']:.0f}, settle "
          f"{loop['settle_us_per_step']:.0f}; of which the compiled kernel "
          f"{loop['kernel_us_per_step']:.0f}) + the driver and clients "
          f"{loop['driver_us_per_step']:.0f}")
    print(f"    the scheduler's Python a step: {loop['scheduler_us_per_step']:.0f} us "
          f"(outside the kernel {loop['scheduler_us_per_step'] - loop['kernel_us_per_step']:.0f})"
          f" against (a)'s {peer['rest_us_per_step']:.0f} us a step for everything but its "
          f"graphs (tokenizing included), {peer['steps'] / len(texts):.2f} steps a translation "
          f"there against {1 / loop['translations_per_step']:.2f} here")
    if args.skip_served:
        return
    served = served_cost(args.repo, args.model, texts, args.seconds, args.warmup, args.port)
    print(f"(b) seqserve serve (defaults), 64 connections, {args.seconds:g} s: "
          f"{served['translations_per_s']:.0f} translations/s, {served['total_ms']:.3f} ms CPU "
          f"per translation = main threads {served['main_threads_ms']:.3f} + other threads "
          f"{served['other_threads_ms']:.3f}; errors {served['errors']}")
    served_graphs = 1e3 * (served["encoder_s_per"] + served["steps_s_per"])
    print(f"    its graphs (wall time of the runtime calls, /metrics): encoder "
          f"{1e3 * served['encoder_s_per']:.3f} + decoder steps {1e3 * served['steps_s_per']:.3f}"
          f" ms per translation ({served_graphs / graphs:.2f}x (a)'s graphs), "
          f"{served['rows_per']:.1f} row-steps per translation; the rest "
          f"{served['total_ms'] - served_graphs:.3f} ms against (a)'s {peer['rest_ms']:.3f}")
    print(f"(b) / (a) CPU per translation: {served['total_ms'] / peer['total_ms']:.2f}x; "
          f"(b)'s runtime threads alone / (a)'s graphs: "
          f"{served['other_threads_ms'] / graphs:.2f}x")


if __name__ == "__main__":
    main()
