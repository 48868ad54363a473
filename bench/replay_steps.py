"""Benchmark (not a test): a decoder step's graph cost per row in each decode-loop mode,
measured apart from the loop.

Runs `bench_translate`'s closed loop (32 clients, beam 5) once in continuous and once in
request-level mode, records every `decoder_step` feed, then replays each mode's feeds alone on
a fresh ONNX Runtime session (1 thread), the modes alternating for `--rounds`: ms per call
and us per row. `--profile` adds ONNX Runtime's profiler (time per operator per row);
`--buckets` also replays each continuous step split by source length into that many calls
(what padding every row to the longest live source costs, against a call's fixed cost).

    .venv/bin/python bench/replay_steps.py --sentences 2000 --profile --buckets 2 3
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import bench_translate as bt  # noqa: E402

from seqserve.models.text.tokenizer import Tokenizer  # noqa: E402
from seqserve.service.scheduling.search import DecodeLimits  # noqa: E402

Feed = dict[str, np.ndarray]


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repo", type=Path, default=Path("model_repository"))
    p.add_argument("--model", default="numbers-en-fr")
    p.add_argument("--data", default="data/numbers-en-fr")
    p.add_argument("--sentences", type=int, default=2000)
    p.add_argument("--clients", type=int, default=32)
    p.add_argument("--beam-size", type=int, default=5)
    p.add_argument("--groups", type=int, default=1)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--profile", action="store_true", help="ONNX Runtime's operator profile")
    p.add_argument("--buckets", type=int, nargs="*", default=[],
                   help="also replay continuous steps split by source length")
    return p.parse_args()


def record(args: argparse.Namespace) -> tuple[Path, dict[str, list[Feed]]]:
    path, manifest = bt.bundle(args.repo, args.model)
    runtime = bt.make_runtime("onnx", "cpu", 1, path, manifest)
    tok = Tokenizer.load(path / manifest.tokenizer.file)
    t = manifest.tokenizer
    limits = DecodeLimits(t.bos_id, t.eos_id, t.vocab_size,
                          int(manifest.limits.get("max_decode_length", 128)))
    items = [tok.encode(x) for x in bt.test_sentences(args.data, args.sentences)]
    feeds: dict[str, list[Feed]] = {}
    run = runtime.run
    for continuous in (True, False):
        calls: list[Feed] = []

        def recorded(graph: str, inputs: Feed, calls: list[Feed] = calls) -> Feed:
            if graph == "decoder_step":
                calls.append({k: v.copy() for k, v in inputs.items()})
            return run(graph, inputs)  # type: ignore[no-any-return]

        runtime.run = recorded
        asyncio.run(bt.loop_mode(runtime, limits, items, args, continuous))
        feeds["continuous" if continuous else "request-level"] = calls[8:]  # past warm-up
    return path / str(manifest.graphs["decoder_step"].file("onnx")), feeds


def session(graph: Path, profile: str | None = None) -> Any:
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = opts.inter_op_num_threads = 1
    if profile:
        opts.enable_profiling = True
        opts.profile_file_prefix = profile
    return ort.InferenceSession(graph.read_bytes(), opts, providers=["CPUExecutionProvider"])


def split(feed: Feed, buckets: int) -> list[Feed]:
    """One step's rows in `buckets` calls by source length, each padded to its own longest."""
    lengths = feed["src_mask"].sum(1)  # (N,)
    row_len = lengths[feed["memory_index"]]  # (R,)
    cuts = np.unique(np.quantile(row_len, np.linspace(0, 1, buckets + 1)[1:-1]))
    which = np.searchsorted(cuts, row_len, side="right")  # (R,)
    parts = []
    for b in np.unique(which):
        rows = np.flatnonzero(which == b)
        slots = np.unique(feed["memory_index"][rows])
        width = int(lengths[slots].max())
        remap = np.zeros(len(lengths), np.int64)
        remap[slots] = np.arange(len(slots))
        part = {"prev_ids": feed["prev_ids"][rows], "state": feed["state"][rows],
                "memory": np.ascontiguousarray(feed["memory"][slots, :width]),
                "src_mask": np.ascontiguousarray(feed["src_mask"][slots, :width]),
                "memory_index": remap[feed["memory_index"][rows]], "k": feed["k"]}
        if "keys" in feed:  # schema 3: the projected attention keys, in the memory's slots
            part["keys"] = np.ascontiguousarray(feed["keys"][slots, :width])
        parts.append(part)
    return parts


def main() -> None:
    args = parse_args()
    graph, feeds = record(args)
    sets: dict[str, list[list[Feed]]] = {m: [[f] for f in fs] for m, fs in feeds.items()}
    for b in args.buckets:
        sets[f"continuous, {b} calls by length"] = [split(f, b) for f in feeds["continuous"]]
    for mode, fs in feeds.items():
        rows = np.array([len(f["prev_ids"]) for f in fs])
        width = np.array([f["memory"].shape[1] for f in fs])
        print(f"{mode}: {len(fs)} steps, {rows.mean():.1f} rows and {width.mean():.1f} source "
              f"width per step, {rows.sum()} row-steps")
    sess = session(graph)
    names = [o.name for o in sess.get_outputs()]
    for r in range(args.rounds):
        for label, steps in sets.items():
            start = time.perf_counter()
            for parts in steps:
                for feed in parts:
                    sess.run(names, feed)
            secs = time.perf_counter() - start
            rows = sum(len(f["prev_ids"]) for parts in steps for f in parts)
            calls = sum(len(parts) for parts in steps)
            print(f"round {r + 1} {label:<34} {secs * 1e3:7.0f} ms  {calls:5d} calls "
                  f"{secs / calls * 1e3:6.3f} ms/call {secs / rows * 1e6:6.1f} us/row")
    if args.profile:
        for mode, fs in feeds.items():
            prof = session(graph, str(Path(tempfile.gettempdir()) / f"replay_{mode}"))
            for feed in fs:
                prof.run(names, feed)
            events = json.loads(Path(prof.end_profiling()).read_text())
            per_op: collections.Counter[str] = collections.Counter()
            for e in events:
                if e.get("cat") == "Node" and e["name"].endswith("_kernel_time"):
                    per_op[e["args"]["op_name"]] += e["dur"]
            rows = sum(len(f["prev_ids"]) for f in fs)
            print(f"{mode}: ONNX Runtime profile, us per row: " + ", ".join(
                f"{op} {us / rows:.2f}" for op, us in per_op.most_common(8)))


if __name__ == "__main__":
    main()
