"""Benchmark (not a test): decoder_step time under ONNX Runtime per translator bundle.

For each bundle, R hypothesis rows (--rows, default 32 and 256) over R / beam requests whose
sources are test-split sentences: the encoder graph runs once, then decoder_step is timed on
that input (median of --repeats after 10 warm-up rounds; one ORT intra-op thread by default).
The bundles run round robin in one process, so a change in machine load hits all alike.

    .venv/bin/python bench/bench_decoder_step.py --repo REPO --models mt-none mt-bahdanau ...
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from seqserve.export.manifest import load_bundle  # noqa: E402
from seqserve.models.text.tokenizer import Tokenizer  # noqa: E402


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repo", type=Path, required=True)
    p.add_argument("--models", nargs="+", required=True, help="bundle names (highest version)")
    p.add_argument("--data", default="numbers-en-fr", help="built-in dataset for sources")
    p.add_argument("--rows", type=int, nargs="+", default=[32, 256])
    p.add_argument("--beam", type=int, default=4, help="rows per request")
    p.add_argument("--k", type=int, default=4, help="top-k asked of the step")
    p.add_argument("--repeats", type=int, default=100)
    p.add_argument("--threads", type=int, default=1, help="ORT intra-op threads")
    return p.parse_args()


def _session(path: Path, threads: int):  # type: ignore[no-untyped-def]
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    return ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])


def _sources(tok: Tokenizer, texts: list[str], n: int) -> tuple[np.ndarray, np.ndarray]:
    rows = [tok.encode(texts[i % len(texts)]) for i in range(n)]
    lengths = np.array([len(r) for r in rows], dtype=np.int64)
    ids = np.zeros((n, int(lengths.max())), dtype=np.int64)
    for i, r in enumerate(rows):
        ids[i, : len(r)] = r
    return ids, lengths


def step_case(bundle: Path, texts: list[str], rows: int, beam: int, k: int,
              threads: int) -> Callable[[], float]:
    """A callable timing one decoder_step call (seconds) on `rows` rows (rows / beam
    requests of test sources, encoded once)."""
    manifest = load_bundle(bundle)
    tok = Tokenizer.load(bundle / manifest.tokenizer.file)
    encoder = _session(bundle / "encoder.onnx", threads)
    step = _session(bundle / "decoder_step.onnx", threads)
    ids, lengths = _sources(tok, texts, max(1, -(-rows // beam)))  # enough requests for rows
    memory, mask, state, *keys = encoder.run(None, {"src_ids": ids, "src_lengths": lengths})
    index = np.repeat(np.arange(ids.shape[0], dtype=np.int64), beam)[:rows]
    feed = {"prev_ids": np.full(rows, manifest.tokenizer.bos_id, np.int64),
            "state": np.ascontiguousarray(state[index]), "memory": memory, "src_mask": mask,
            "memory_index": index, "k": np.array([k], np.int64),
            **({"keys": keys[0]} if keys else {})}  # schema 3: keys projected once

    def once() -> float:
        start = time.perf_counter()
        step.run(None, feed)
        return time.perf_counter() - start

    return once


def main() -> None:
    from seqserve.models.data.registry import load_dataset

    args = parse_args()
    texts = [r["source"] for r in load_dataset(args.data).splits["test"]]
    bundles = {}
    for name in args.models:
        versions = sorted((args.repo / name).iterdir(), key=lambda p: int(p.name))
        bundles[name] = versions[-1]
    print(f"decoder_step under ONNX Runtime (CPU, {args.threads} intra-op thread), median of "
          f"{args.repeats}; rows = {args.beam} hypotheses per request, k = {args.k}")
    cases = {(name, rows): step_case(bundle, texts, rows, args.beam, args.k, args.threads)
             for name, bundle in bundles.items() for rows in args.rows}
    times: dict[tuple[str, int], list[float]] = {key: [] for key in cases}
    for i in range(args.repeats + 10):  # round robin: load changes hit every bundle alike
        for key, once in cases.items():
            seconds = once()
            if i >= 10:
                times[key].append(seconds)
    header = "".join(f" {r:>6} rows ms  us/row" for r in args.rows)
    print(f"  {'bundle':16} {'decoder':11}{header}")
    for name, bundle in bundles.items():
        manifest = load_bundle(bundle)
        model_cfg = manifest.source_run.get("config", {}).get("model", {})
        decoder = (manifest.decoder or "luong") + ("+if" if model_cfg.get("input_feeding") else "")
        cells = ""
        for rows in args.rows:
            ms = statistics.median(times[(name, rows)]) * 1e3
            cells += f" {ms:14.3f} {1e3 * ms / rows:7.1f}"
        print(f"  {name:16} {decoder:11}{cells}")


if __name__ == "__main__":
    main()
