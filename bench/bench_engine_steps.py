"""Benchmark (not a test): the decode scheduler's own cost, with a runtime that costs ~nothing.

`TableRuntime` answers `encoder` with zeros and `decoder_step` with rows looked up in
precomputed tables (sorted top-k log-probs and ids by (decoder clock, previous token)), so a
step costs a few array copies and what is measured is the engine: scheduling, beam search
bookkeeping, admission and answers. N closed-loop clients each send one source at a time;
the figures are generated tokens/s, decoder steps/s, and per step: wall time, runtime time,
the rest (the Python around the step), and the event-loop thread's CPU time (`time.thread_time`:
the engine's bookkeeping plus the clients' asyncio work, without the time this shared machine
kept the thread waiting for a core).

Each point runs in a fresh interpreter with `--tree DIR` first on sys.path, so two versions of
the engine (e.g. `git archive baf6bc6 | tar -x -C /tmp/old`) are measured side by side, their
points interleaved:

    .venv/bin/python bench/bench_engine_steps.py --tree old=/tmp/old --tree new=.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

CLIENTS = (8, 16, 32, 64, 128, 256, 512)


class TableRuntime:
    """Runtime-compatible and ~free: see the module doc. State = (clock, 0)."""

    name = "table"
    providers = ["numpy"]

    def __init__(self, vocab: int = 400, k_max: int = 64, clocks: int = 48, prevs: int = 64,
                 mean_length: float = 8.0, seed: int = 0) -> None:
        rng = np.random.default_rng(seed)
        logits = rng.normal(0.0, 2.0, (clocks, prevs, vocab))  # (C, P, V)
        eos = 3
        logits[:, :, :4] = -30.0  # pad, unk, bos never; EOS set below
        logits[:, :, eos] = 1.5 * (np.arange(clocks)[:, None] - mean_length) + rng.normal(
            0.0, 1.0, (clocks, prevs))  # (C, P)
        logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))  # (C, P, V)
        order = np.argsort(-logp, axis=-1, kind="stable")[..., :k_max]  # (C, P, k_max)
        self.top_ids = order.astype(np.int64)
        self.top_lp = np.take_along_axis(logp, order, -1).astype(np.float32)
        self.vocab, self.k_max, self.clocks, self.prevs = vocab, k_max, clocks, prevs
        self.seconds = 0.0

    def run(self, graph: str, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        if graph == "encoder":
            src, lengths = inputs["src_ids"], inputs["src_lengths"]  # (B, S), (B,)
            mask = np.arange(src.shape[1])[None] < lengths[:, None]  # (B, S)
            return {"memory": np.zeros((*src.shape, 4), np.float32), "src_mask": mask,
                    "state": np.zeros((len(src), 2), np.float32)}
        start = time.perf_counter()
        state, mask = inputs["state"], inputs["src_mask"]  # (R, 2), (N, S)
        k = min(int(inputs["k"][0]), self.k_max)
        clock = np.minimum(state[:, 0].astype(np.int64), self.clocks - 1)  # (R,)
        prev = inputs["prev_ids"] % self.prevs  # (R,)
        rows_mask = mask[inputs["memory_index"]]  # (R, S)
        attention = rows_mask / rows_mask.sum(1, keepdims=True)  # (R, S)
        out = {"new_state": state + np.array([1.0, 0.0], np.float32),
               "topk_logprobs": self.top_lp[clock, prev, :k],  # (R, k)
               "topk_ids": self.top_ids[clock, prev, :k],  # (R, k)
               "attention": attention.astype(np.float32)}
        self.seconds += time.perf_counter() - start
        return out


class Phases:
    """CPU time (`time.thread_time`) spent in named engine functions, wrapped in place.

    search: building a step's feed and applying its outputs to the beams (this tree:
    `DecodeGroup.inputs` + `DecodeGroup.advance`; baf6bc6: `_step_inputs` + every request's
    `_advance`, i.e. `RequestSearch.step` and its state gather). engine: the engine's own work
    on the loop thread, search included (this tree: `DecodeScheduler.schedule` + `update`; baf6bc6:
    its synchronous methods `_launch`, `_advance`, `_retire`, `_admit`, `_drop_cancelled`,
    `_place_joining`, outermost calls only).
    """

    def __init__(self) -> None:
        self.seconds = {"search": 0.0, "engine": 0.0}
        self._depth = {"search": 0, "engine": 0}

    def wrap(self, owner: Any, name: str, *phases: str) -> None:
        inner = getattr(owner, name)
        seconds, depth = self.seconds, self._depth

        def timed(*args: Any, **kwargs: Any) -> Any:
            outer = [p for p in phases if not depth[p]]
            for p in phases:
                depth[p] += 1
            start = time.thread_time()
            try:
                return inner(*args, **kwargs)
            finally:
                spent = time.thread_time() - start
                for p in phases:
                    depth[p] -= 1
                for p in outer:
                    seconds[p] += spent

        setattr(owner, name, timed)

    def install(self) -> None:
        import seqserve.service.scheduling.decoding as decoding

        if hasattr(decoding, "_step_inputs"):  # the per-request engine (baf6bc6)
            engine = decoding.DecodeLoop
            self.wrap(decoding, "_step_inputs", "search", "engine")
            self.wrap(engine, "_advance", "search", "engine")
            for name in ("_launch", "_retire", "_admit", "_drop_cancelled", "_place_joining"):
                self.wrap(engine, name, "engine")
        else:
            from seqserve.service.scheduling.group import DecodeGroup
            from seqserve.service.scheduling.scheduler import DecodeScheduler

            self.wrap(DecodeGroup, "inputs", "search")
            self.wrap(DecodeGroup, "advance", "search")
            self.wrap(DecodeScheduler, "schedule", "engine")
            self.wrap(DecodeScheduler, "update", "engine")


def sources(n: int, vocab: int, seed: int = 1) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [[int(t) for t in rng.integers(4, vocab, size=int(rng.integers(4, 13)))]
            for _ in range(n)]


async def measure(clients: int, args: argparse.Namespace) -> dict[str, Any]:
    """One point, in this interpreter (the engine of whichever tree is on sys.path)."""
    from seqserve.service.scheduling.decoding import DecodeConfig, DecodeLoop, StepStats
    from seqserve.service.scheduling.search import DecodeLimits, SearchOptions

    phases = Phases()
    phases.install()
    runtime = TableRuntime()
    limits = DecodeLimits(bos_id=2, eos_id=3, vocab_size=runtime.vocab, max_decode_length=64)
    config = DecodeConfig(max_live_hypotheses=clients * args.beam_size, max_queue=1 << 16,
                          max_admit=args.max_admit, groups=args.groups, retry_after_s=1.0,
                          max_queue_wait_s=None)
    options = SearchOptions(beam_size=args.beam_size, length_penalty=args.length_penalty,
                            coverage_penalty=args.coverage_penalty)
    items = sources(clients * args.per_client, runtime.vocab)
    async with DecodeLoop(runtime, limits, config) as engine:  # type: ignore[arg-type]
        await engine.translate(items[:clients], options)  # warm-up
        engine.stats = StepStats()
        runtime.seconds = 0.0
        phases.seconds.update(dict.fromkeys(phases.seconds, 0.0))
        it = iter(items)
        tokens = 0

        async def client() -> None:
            nonlocal tokens
            for src in it:
                best = (await engine.translate([src], options))[0].hypotheses[0]
                tokens += len(best.token_ids) - int(best.ended)

        start, cpu = time.perf_counter(), time.thread_time()
        await asyncio.gather(*(client() for _ in range(clients)))
        wall, cpu = time.perf_counter() - start, time.thread_time() - cpu
        steps = engine.stats.steps
        rows = sum(r * c for r, c in engine.stats.calls.items())
    return {"clients": clients, "tokens": tokens, "wall_s": wall, "steps": steps,
            "tokens_per_s": tokens / wall, "tokens_per_source": tokens / len(items),
            "mean_rows": rows / max(steps, 1),
            "ms_per_step": wall / max(steps, 1) * 1e3,
            "runtime_ms_per_step": runtime.seconds / max(steps, 1) * 1e3,
            "python_ms_per_step": (wall - runtime.seconds) / max(steps, 1) * 1e3,
            "loop_cpu_ms_per_step": cpu / max(steps, 1) * 1e3,
            "search_ms_per_step": phases.seconds["search"] / max(steps, 1) * 1e3,
            "engine_ms_per_step": phases.seconds["engine"] / max(steps, 1) * 1e3}


def worker(args: argparse.Namespace) -> None:
    sys.path.insert(0, str(Path(args.worker_tree).resolve()))
    print(json.dumps(asyncio.run(measure(args.worker_clients, args))))


def point(tree: str, clients: int, args: argparse.Namespace) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--worker-tree", tree, "--worker-clients", str(clients),
           "--beam-size", str(args.beam_size), "--length-penalty", str(args.length_penalty),
           "--coverage-penalty", str(args.coverage_penalty), "--groups", str(args.groups),
           "--per-client", str(args.per_client), "--max-admit", str(args.max_admit)]
    env = {**os.environ, "PYTHONPATH": str(Path(tree).resolve())}
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, check=True, cwd=tree)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tree", action="append", default=[],
                   help="LABEL=DIR of a source tree to measure (repeat; default: this one)")
    p.add_argument("--clients", type=int, nargs="*", default=list(CLIENTS))
    p.add_argument("--beam-size", type=int, default=5)
    p.add_argument("--length-penalty", type=float, default=0.6)
    p.add_argument("--coverage-penalty", type=float, default=0.2)
    p.add_argument("--groups", type=int, default=1)
    p.add_argument("--max-admit", type=int, default=64)
    p.add_argument("--per-client", type=int, default=6, help="sources each client sends")
    p.add_argument("--json", type=Path, default=None)
    p.add_argument("--worker-tree", help=argparse.SUPPRESS)
    p.add_argument("--worker-clients", type=int, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker_tree:
        worker(args)
        return
    trees = dict(t.split("=", 1) for t in args.tree) or {"this": str(Path(__file__).parents[1])}
    print(f"beam {args.beam_size}, alpha {args.length_penalty}, beta {args.coverage_penalty}, "
          f"{args.groups} group(s); load average at start {os.getloadavg()[0]:.2f}")
    results: dict[str, list[dict[str, Any]]] = {label: [] for label in trees}
    for clients in args.clients:  # interleaved: every tree at one concurrency, then the next
        for label, tree in trees.items():
            results[label].append(point(tree, clients, args))
            print(f"  {label} x{clients} done", file=sys.stderr)
    report(results)
    print(f"load average at end {os.getloadavg()[0]:.2f}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


def report(results: dict[str, list[dict[str, Any]]]) -> None:
    print(f"\n{'tree':<6}{'clients':>8}{'rows':>7}{'steps':>7}{'tok/src':>8}{'tokens/s':>10}"
          f"{'ms/step':>9}{'runtime':>9}{'python':>9}{'loop cpu':>9}{'engine':>8}{'search':>8}")
    for label, points in results.items():
        for r in points:
            print(f"{label:<6}{r['clients']:>8}{r['mean_rows']:>7.0f}{r['steps']:>7}"
                  f"{r['tokens_per_source']:>8.1f}{r['tokens_per_s']:>10.0f}{r['ms_per_step']:>9.3f}"
                  f"{r['runtime_ms_per_step']:>9.3f}{r['python_ms_per_step']:>9.3f}"
                  f"{r['loop_cpu_ms_per_step']:>9.3f}{r['engine_ms_per_step']:>8.3f}"
                  f"{r['search_ms_per_step']:>8.3f}")
    for label, points in results.items():
        py = [r["python_ms_per_step"] for r in points]
        cpu = [r["loop_cpu_ms_per_step"] for r in points]
        search = [r["search_ms_per_step"] for r in points]
        engine = [r["engine_ms_per_step"] for r in points]
        print(f"{label}: per-step time, largest / smallest over the curve: python (wall) "
              f"{max(py) / min(py):.2f}x, loop cpu {max(cpu) / min(cpu):.2f}x, engine "
              f"{max(engine) / min(engine):.2f}x, search {max(search) / min(search):.2f}x")
    labels = list(results)
    if len(labels) == 2:
        a, b = (results[x] for x in labels)
        for ra, rb in zip(a, b, strict=True):
            print(f"x{ra['clients']}: {labels[1]}/{labels[0]} tokens/s "
                  f"{rb['tokens_per_s'] / ra['tokens_per_s']:.2f}x")


if __name__ == "__main__":
    main()
