"""Check (not a benchmark): the decode loop's answers on the demo's test split, written to a
JSON file, so two source trees (before and after a change) can be compared token by token.

Every test sentence is decoded under several search settings (the defaults; n-best 3 with
length and coverage penalties and attention; an n-gram ban with a minimum length; greedy),
all requests of all settings submitted at once to one loop (so mixed batches), and alone
(one loop call per sentence, for a sample), with the run's `continuous` and `groups`.

    .venv/bin/python bench/decode_identity.py --tree /tmp/old --out /tmp/old.json
    .venv/bin/python bench/decode_identity.py --out /tmp/new.json
    .venv/bin/python bench/decode_identity.py --compare /tmp/old.json /tmp/new.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path
from typing import Any


def _tree() -> str:
    if "--tree" in sys.argv[:-1]:
        return str(Path(sys.argv[sys.argv.index("--tree") + 1]).resolve())
    return str(Path(__file__).resolve().parents[1])


sys.path.insert(0, _tree())

SETTINGS: dict[str, dict[str, Any]] = {
    "defaults": {},
    "nbest_penalties": {"beam_size": 4, "n_best": 3, "length_penalty": 0.6,
                        "coverage_penalty": 0.2, "return_attention": True},
    "ngram_min_length": {"beam_size": 5, "no_repeat_ngram_size": 2, "min_length": 3},
    "greedy": {"beam_size": 1},
}


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repo", type=Path, default=Path("model_repository"))
    p.add_argument("--model", default="numbers-en-fr")
    p.add_argument("--data", type=Path, default=Path("data/numbers-en-fr"))
    p.add_argument("--split", default="test")
    p.add_argument("--alone", type=int, default=200, help="sentences also decoded one by one")
    p.add_argument("--groups", type=int, default=2)
    p.add_argument("--out", type=Path)
    p.add_argument("--tree", default=None, help="decode with this source tree")
    p.add_argument("--compare", type=Path, nargs=2, default=None)
    return p.parse_args()


def hyp(h: Any) -> dict[str, Any]:
    out = {"ids": list(h.token_ids), "logprob": h.logprob, "score": h.score, "ended": h.ended}
    if h.coverage is not None:
        out["coverage"] = [float(x) for x in h.coverage]
    if h.attention:
        out["attention"] = [[float(x) for x in row] for row in h.attention]
    return out


async def decode_all(args: argparse.Namespace) -> dict[str, Any]:
    from seqserve.export.manifest import load_bundle
    from seqserve.export.versions import list_bundles
    from seqserve.models.text.tokenizer import Tokenizer
    from seqserve.service.runtimes.onnx import OnnxRuntime
    from seqserve.service.scheduling.decoding import DecodeConfig, DecodeLoop
    from seqserve.service.scheduling.search import DecodeLimits, SearchOptions

    versions = {v: p for name, v, p in list_bundles(args.repo) if name == args.model}
    path = versions[max(versions)]
    manifest = load_bundle(path)
    files = {g: path / str(spec.file("onnx")) for g, spec in manifest.graphs.items()}
    runtime = OnnxRuntime(files, ["CPUExecutionProvider"], 1, 1)
    t = manifest.tokenizer
    tok = Tokenizer.load(path / t.file)
    limits = DecodeLimits(t.bos_id, t.eos_id, t.vocab_size,
                          int(manifest.limits.get("max_decode_length", 128)))
    rows = [json.loads(line) for line in
            (args.data / f"{args.split}.jsonl").open(encoding="utf-8")]
    sources = [tok.encode(str(r["source"]))[: int(manifest.limits.get("max_tokens", 256))]
               for r in rows]
    out: dict[str, Any] = {}
    for continuous in (True, False):
        config = DecodeConfig(max_live_hypotheses=512, max_queue=100_000, max_admit=64,
                              groups=args.groups, continuous=continuous, retry_after_s=1.0,
                              max_queue_wait_s=None)
        mode = "continuous" if continuous else "request_level"
        async with DecodeLoop(runtime, limits, config) as loop:
            jobs = {name: loop.translate(sources, SearchOptions(**o))
                    for name, o in SETTINGS.items()}
            done = await asyncio.gather(*jobs.values())
            for name, decoded in zip(jobs, done, strict=True):
                out[f"{mode}/mixed/{name}"] = [[hyp(h) for h in d.hypotheses] for d in decoded]
            for name, o in SETTINGS.items():
                alone = []
                for src in sources[: args.alone]:
                    (d,) = await loop.translate([src], SearchOptions(**o))
                    alone.append([hyp(h) for h in d.hypotheses])
                out[f"{mode}/alone/{name}"] = alone
    return out


def _ids(answers: list[Any]) -> list[Any]:
    return [[h["ids"] for h in hyps] for hyps in answers]


def _verdict(x: list[Any], y: list[Any]) -> tuple[bool, str]:
    """(tokens identical, what differs): token ids of every hypothesis, then every float."""
    if _ids(x) != _ids(y):
        n = sum(a != b for a, b in zip(_ids(x), _ids(y), strict=False))
        return False, f"TOKENS DIFFER in {n}"
    n = sum(a != b for a, b in zip(x, y, strict=False))
    return True, "identical" if not n else f"tokens identical, floats differ in {n}"


def compare(a_path: Path, b_path: Path) -> int:
    """Token differences between the files, and within the second between alone and mixed
    (float differences are printed, not counted: ONNX Runtime's GEMMs round by batch shape,
    so a score may move in the last bits with the batch a sentence shares)."""
    a, b = json.loads(a_path.read_text()), json.loads(b_path.read_text())
    bad = 0
    for key in sorted(set(a) | set(b)):
        same, what = _verdict(a.get(key, []), b.get(key, []))
        bad += not same
        print(f"{key:<42} {what} (of {len(a.get(key, []))} sentences)")
    for key in sorted(b):
        if "/alone/" in key:
            mixed = b[key.replace("/alone/", "/mixed/")][: len(b[key])]
            same, what = _verdict(b[key], mixed)
            bad += not same
            print(f"{b_path.name}: {key} alone vs mixed: {what}")
    return bad


def main() -> None:
    args = parse_args()
    if args.compare:
        sys.exit(1 if compare(*args.compare) else 0)
    result = asyncio.run(decode_all(args))
    args.out.write_text(json.dumps(result))
    print(f"{sum(len(v) for v in result.values())} answers -> {args.out}")


if __name__ == "__main__":
    main()
