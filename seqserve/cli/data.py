"""`seqserve data NAME --out DIR`: generate a built-in dataset (or check user data) and write it.

Prints the number of examples per split and per label (classification) or kind
(translation). `--show N` prints N examples of each split. NAME may also be a folder or file
of user data (CSV/TSV/JSONL): it is validated and, with --out, written in the same format.
"""

from __future__ import annotations

import argparse
import json
import time

NAME = "data"
HELP = "generate a built-in dataset (langid, numbers-en-fr, numbers-en-de) or check user data"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", help="built-in dataset name, or a folder/file of user data")
    parser.add_argument("--out", help="folder to write train/valid/test.jsonl and meta.json")
    parser.add_argument("--size", type=int, default=None, help="train examples (built-ins)")
    parser.add_argument("--seed", type=int, default=0, help="generation seed (built-ins)")
    parser.add_argument("--show", type=int, default=0, metavar="N", help="print N examples/split")


def run(args: argparse.Namespace) -> int:
    from seqserve.models.data.registry import load_dataset, save_dataset

    started = time.perf_counter()
    print(f"loading {args.name} ...", flush=True)
    ds = load_dataset(args.name, size=args.size, seed=args.seed)
    elapsed = time.perf_counter() - started
    print(f"{ds.name}: {ds.task}, {sum(ds.counts().values())} examples in {elapsed:.1f}s")
    for split, rows in ds.splits.items():
        breakdown = ", ".join(f"{k}={v}" for k, v in ds.breakdown(split).items())
        print(f"  {split:5s} {len(rows):7d}  {breakdown}")
    for split, rows in ds.splits.items():
        for row in rows[: max(args.show, 0)]:
            print(f"  [{split}] {json.dumps(row, ensure_ascii=False)}")
    if args.out:
        out = save_dataset(ds, args.out)
        print(f"wrote {out}/{{train,valid,test}}.jsonl and meta.json")
    return 0
