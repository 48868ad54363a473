"""Check (not a benchmark): a running translation server's answers against seqserve's decode
loop, token by token, on every sentence of a test split (beam 5, the defaults).

    python bench/peers/check_translate.py --url http://127.0.0.1:PORT/v1/models/numbers-en-fr/translate

Sends each sentence as its own request, 32 at a time (so a batching server forms batches),
and decodes the same sentences in process with `DecodeLoop`; prints how many answers are
token-identical and the ones that are not. Exits non-zero on any difference.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from seqserve.export.manifest import load_bundle  # noqa: E402
from seqserve.export.versions import list_bundles  # noqa: E402
from seqserve.models.text.tokenizer import Tokenizer  # noqa: E402
from seqserve.service.runtimes.onnx import OnnxRuntime  # noqa: E402
from seqserve.service.scheduling.decoding import DecodeConfig, DecodeLoop  # noqa: E402
from seqserve.service.scheduling.search import DecodeLimits, SearchOptions  # noqa: E402


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--url", required=True, help="the server's translate endpoint")
    p.add_argument("--repo", type=Path, default=Path("model_repository"))
    p.add_argument("--model", default="numbers-en-fr")
    p.add_argument("--data", type=Path, default=Path("data/numbers-en-fr/test.jsonl"))
    p.add_argument("--concurrency", type=int, default=32)
    return p.parse_args()


def main() -> None:
    args = parse_args()
    versions = {v: p for name, v, p in list_bundles(args.repo) if name == args.model}
    path = versions[max(versions)]
    manifest = load_bundle(path)
    t = manifest.tokenizer
    tok = Tokenizer.load(path / t.file)
    texts = [str(json.loads(line)["source"]) for line in args.data.open(encoding="utf-8")]

    def post(text: str) -> list[int]:
        req = urllib.request.Request(args.url, json.dumps({"texts": [text]}).encode(),
                                     {"Content-Type": "application/json"})
        with urllib.request.urlopen(req) as answer:
            return [int(i) for i in json.loads(answer.read())["results"][0]["token_ids"]]

    with ThreadPoolExecutor(args.concurrency) as pool:
        theirs = list(pool.map(post, texts))

    async def ours() -> list[list[int]]:
        files = {g: path / str(spec.file("onnx")) for g, spec in manifest.graphs.items()}
        limits = DecodeLimits(t.bos_id, t.eos_id, t.vocab_size,
                              int(manifest.limits.get("max_decode_length", 128)))
        config = DecodeConfig(max_live_hypotheses=4096, max_queue=100_000, max_admit=64,
                              groups=1, retry_after_s=1.0, max_queue_wait_s=None)
        runtime = OnnxRuntime(files, ["CPUExecutionProvider"], 1, 1)
        cap = int(manifest.limits.get("max_tokens", 256))
        async with DecodeLoop(runtime, limits, config) as loop:
            out = await loop.translate([tok.encode(x)[:cap] for x in texts], SearchOptions())
        skip = {t.bos_id, t.eos_id, t.pad_id}
        return [[i for i in d.hypotheses[0].token_ids if i not in skip] for d in out]

    mine = asyncio.run(ours())
    differ = [(x, a, b) for x, a, b in zip(texts, mine, theirs, strict=True) if a != b]
    print(f"{args.url}: {len(texts) - len(differ)}/{len(texts)} answers token-identical to "
          "seqserve's decode loop")
    for x, a, b in differ[:20]:
        print(f"  {x!r}: seqserve {a}, server {b}")
    sys.exit(1 if differ else 0)


if __name__ == "__main__":
    main()
