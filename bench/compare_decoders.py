"""Benchmark (not a test): translator runs compared by source length on their test split.

For each finished run directory, greedy decoding of the run's own test split (the eager
model, `seqserve.models.nn.decoding.greedy_decode`), exact match per source-length bucket (in words)
and
overall, as a markdown table. The fixed-context decoder's bottleneck shows as exact match that
falls with source length while the attention decoders stay flat.

    .venv/bin/python bench/compare_decoders.py runs/mt-none runs/mt-bahdanau runs/mt-luong
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from seqserve.models.checkpoint import load_run  # noqa: E402
from seqserve.models.data.registry import load_dataset  # noqa: E402
from seqserve.models.nn.decoding import greedy_decode  # noqa: E402

BUCKETS = ((1, 4), (5, 6), (7, 8), (9, 10), (11, 10_000))


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("runs", nargs="+", type=Path, help="finished translator run directories")
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--threads", type=int, default=1)
    return p.parse_args()


def bucket_of(words: int) -> str:
    for lo, hi in BUCKETS:
        if lo <= words <= hi:
            return f"{lo}-{hi}" if hi < 10_000 else f"{lo}+"
    return "?"


def decode_split(model: Any, tok: Any, rows: list[dict[str, str]], batch: int) -> list[str]:
    """Greedy translations of `rows` (sources tokenized like training: no bos/eos)."""
    out: list[str] = []
    for start in range(0, len(rows), batch):
        ids = [(tok.encode(r["source"]) or [tok.unk_id])[: model.config.max_length]
               for r in rows[start : start + batch]]
        lengths = torch.tensor([len(x) for x in ids])
        src = torch.zeros(len(ids), int(lengths.max()), dtype=torch.long)
        for i, x in enumerate(ids):
            src[i, : len(x)] = torch.tensor(x)
        out += [tok.decode(h) for h in greedy_decode(model, src, lengths)]
    return out


def evaluate(run: Path, batch: int) -> tuple[str, dict[str, tuple[int, int]]]:
    """(decoder name, bucket -> (correct, count)), bucket "all" included."""
    model, config, tok = load_run(run)
    data = config.get("data", {})
    rows = load_dataset(data.get("name", "numbers-en-fr"), size=data.get("size"),
                        seed=data.get("seed", 0)).splits["test"]
    hyps = decode_split(model, tok, rows, batch)
    table: dict[str, tuple[int, int]] = {}
    for row, hyp in zip(rows, hyps, strict=True):
        for key in (bucket_of(len(row["source"].split())), "all"):
            ok, n = table.get(key, (0, 0))
            table[key] = (ok + (hyp.strip() == row["target"].strip()), n + 1)
    cfg = config["model"]
    name = cfg.get("decoder", "luong") + (" +feeding" if cfg.get("input_feeding") else "")
    return f"{name} ({run.name})", table


def main() -> None:
    args = parse_args()
    torch.set_num_threads(args.threads)
    results = [evaluate(run, args.batch) for run in args.runs]
    keys = sorted({k for _, t in results for k in t if k != "all"},
                  key=lambda k: int(k.split("-")[0].rstrip("+")))
    counts = {k: next(t[k][1] for _, t in results if k in t) for k in keys}
    print("| decoder | " + " | ".join(f"{k} words ({counts[k]})" for k in keys) + " | all |")
    print("|---" * (len(keys) + 2) + "|")
    for name, table in results:
        cells = [f"{100 * table[k][0] / table[k][1]:.2f}%" if k in table else "-"
                 for k in [*keys, "all"]]
        print(f"| {name} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
