"""The machine's ceiling for a workload: bare ONNX Runtime on the same texts, no HTTP.

Sequences/s of the bundle's classifier.onnx over the workload's token rows at each batch
size and intra-op thread count, in arrival order (consecutive texts share a batch, as a
batching server without reordering sees them) and sorted by length (the least padding any
batcher could reach). The best of all is the ceiling; the least CPU time per sequence over
all points (this process's user + system time, all its threads) is the compute-only floor a
server's CPU per request is set against.
"""

from __future__ import annotations

import random
import time
from typing import Any

import numpy as np


def pad(rows: list[list[int]], pad_id: int = 0) -> tuple[np.ndarray, np.ndarray]:
    lengths = np.array([len(r) for r in rows], dtype=np.int64)  # (B,)
    ids = np.full((len(rows), int(lengths.max())), pad_id, dtype=np.int64)  # (B, T)
    for i, r in enumerate(rows):
        ids[i, : len(r)] = r
    return ids, lengths


def batches(rows: list[list[int]], size: int, order: str) -> list[tuple[np.ndarray, np.ndarray]]:
    """The rows cut into padded batches of `size`, in arrival or length-sorted order; the
    batches themselves shuffled, so a run stopped part-way samples every length alike."""
    ordered = sorted(rows, key=len) if order == "sorted" else rows
    out = [pad(ordered[i: i + size]) for i in range(0, len(ordered), size)]
    random.Random(len(out)).shuffle(out)
    return out


def rate(session: Any, prepared: list[tuple[np.ndarray, np.ndarray]],
         seconds: float) -> tuple[float, float]:
    """(sequences/s, CPU ms per sequence) running the prepared batches round and round for
    about `seconds`."""
    session.run(None, {"input_ids": prepared[0][0], "lengths": prepared[0][1]})  # warm
    done, begin, cpu0, i = 0, time.perf_counter(), time.process_time(), 0
    while True:
        ids, lengths = prepared[i % len(prepared)]
        session.run(None, {"input_ids": ids, "lengths": lengths})
        done += len(lengths)
        i += 1
        elapsed = time.perf_counter() - begin
        if elapsed >= seconds:
            return done / elapsed, (time.process_time() - cpu0) * 1e3 / done


def measure(onnx_path: str, rows: list[list[int]], batch_sizes: list[int],
            thread_counts: list[int], seconds: float) -> dict[str, Any]:
    """Every (threads, order, batch) point, the best one and the floor (least CPU/seq)."""
    import onnxruntime as ort

    points = []
    for threads in thread_counts:
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = threads
        opts.inter_op_num_threads = 1
        sess = ort.InferenceSession(onnx_path, opts, providers=["CPUExecutionProvider"])
        for order in ("arrival", "sorted"):
            for size in batch_sizes:
                seq_s, cpu_ms = rate(sess, batches(rows, size, order), seconds)
                points.append({"threads": threads, "order": order, "batch": size,
                               "seq_s": round(seq_s, 1), "cpu_ms": round(cpu_ms, 4)})
    best = max(points, key=lambda p: p["seq_s"])
    floor = min(points, key=lambda p: p["cpu_ms"])
    return {"points": points, "best": best, "floor": floor}
