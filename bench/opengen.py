"""Drive bench/opengen.c, an open-loop (or closed-loop) HTTP load generator in C that costs its
machine little: build it (gcc, into build/), render the requests, run it, read its records.

    python bench/opengen.py --url http://127.0.0.1:8000 --model langid --task classify \
        --texts-per-request 16 --rate 1500 --duration 15

The Python generator (`seqserve loadtest`, asyncio) spends ~0.2 ms of CPU per request: at 3x
overload on this 2-core box two of them kept 0.36-0.57 of the cores busy, which the server
under test then lacked (docs/performance.md section 20). This one keeps the same figures
(latency from the scheduled send, Server-Timing queue and compute, 429s with Retry-After,
drops at its connection cap) at a few microseconds a request. `bench/overload.py --generator
c` uses it for the capacity and the overload runs alike.
"""

from __future__ import annotations

import argparse
import json
import math
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT / "bench" / "opengen.c"
BINARY = ROOT / "build" / "opengen"
SETTLE_S = 3.0
"""The admitted requests' queue waits are also summarised without those sent in the first
this many seconds of a load (while the estimates learn the overload's rates and margins);
`bench/overload.py`'s Python worker uses the same."""
DISTINCT = 20_000
"""Most distinct requests rendered (arrivals reuse them in turn)."""


def build() -> Path:
    """The generator's binary, compiled when missing or older than its source."""
    if not BINARY.exists() or BINARY.stat().st_mtime < SOURCE.stat().st_mtime:
        BINARY.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(["gcc", "-O2", "-Wall", "-o", str(BINARY), str(SOURCE), "-lm"],
                       check=True)
    return BINARY


def texts_for(spec: dict[str, Any]) -> list[str]:
    """The texts a load of `spec` draws from (as `bench/overload.py`'s Python worker)."""
    from seqserve.loadtest.texts import load_corpus_prompts, load_dataset_texts, load_text_file

    if spec.get("texts_file"):
        return load_text_file(spec["texts_file"])
    if spec["task"] == "generate":
        return load_corpus_prompts("pydoc-topics", "test", 64)
    return load_dataset_texts({"classify": "langid"}.get(spec["task"], "numbers-en-fr"))


def render(spec: dict[str, Any], texts: list[str], count: int) -> bytes:
    """`count` raw HTTP/1.1 requests of `spec`'s task (the loadtest's own bodies), each
    prefixed with its 4-byte little-endian length."""
    from seqserve.loadtest.protocol import build_payload
    from seqserve.loadtest.texts import TextSampler

    url = urlsplit(spec["url"])
    path = f"/v1/models/{spec['model']}/{spec['task']}"
    sampler = TextSampler(texts, spec.get("seed", 0))
    out = bytearray()
    for _ in range(count):
        body = json.dumps(build_payload(
            spec["task"], sampler.draw(spec.get("texts_per_request", 1)),
            spec.get("beam_size", 5), max_new_tokens=spec.get("max_new_tokens", 32),
            temperature=spec.get("temperature", 1.0)), separators=(",", ":")).encode()
        head = (f"POST {path} HTTP/1.1\r\nHost: {url.netloc}\r\n"
                f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n")
        request = head.encode() + body
        out += struct.pack("<I", len(request)) + request
    return bytes(out)


def run(spec: dict[str, Any]) -> dict[str, Any]:
    """One load of `spec` (`rate` for an open loop, else `concurrency` for a closed one;
    `duration_s`, `max_in_flight`: the connection cap of an open loop): the figures
    `bench/overload.py` merges, from the generator's records."""
    binary = build()
    url = urlsplit(spec["url"])
    rate = float(spec.get("rate") or 0.0)
    duration = float(spec["duration_s"])
    connections = int(spec["max_in_flight"] if rate else spec["concurrency"])
    expected = rate * duration if rate else 2000 * duration
    count = max(1, min(DISTINCT, math.ceil(expected)))
    with tempfile.TemporaryDirectory(prefix="opengen-") as folder:
        requests, out = Path(folder) / "requests", Path(folder) / "records"
        requests.write_bytes(render(spec, texts_for(spec), count))
        started = time.monotonic()
        subprocess.run([str(binary), url.hostname or "127.0.0.1", str(url.port or 80),
                        f"{rate:g}", f"{duration:g}", str(spec.get("seed", 0)),
                        str(connections), str(requests), str(out)], check=True)
        wall = time.monotonic() - started
        lines = out.read_text().splitlines()
    cpu_s = float(lines[-1].split()[1])
    rows = [line.split() for line in lines[:-1]]
    records = [(float(a), float(b), float(c), int(d), float(e), float(f), int(g), float(h))
               for a, b, c, d, e, f, g, h in rows]
    ok = [r for r in records if 200 <= r[3] < 300]
    statuses: dict[str, int] = {}
    for r in records:
        if r[3] > 0 and not 200 <= r[3] < 300:
            statuses[str(r[3])] = statuses.get(str(r[3]), 0) + 1
    return {
        "wall_s": max([duration] + [r[2] for r in records if r[2] >= 0]) if rate else wall,
        "load_cpu_s": cpu_s,
        "scheduled": len(records),
        "dropped": sum(r[3] == -1 for r in records),
        "ok": len(ok),
        "refused": statuses.get("429", 0),
        "refused_with_retry_after": sum(1 for r in records if r[3] == 429 and r[6]),
        "other_errors": sum(1 for r in records if r[3] == 0 or (r[3] >= 300 and r[3] != 429)),
        "statuses": statuses,
        "reasons": {},
        "latency_s": [r[2] - r[0] for r in ok],
        "queue_ms": [r[4] for r in ok if r[4] >= 0],
        "queue_ms_settled": [r[4] for r in ok if r[4] >= 0 and r[0] >= SETTLE_S],
        "compute_ms": [r[5] for r in ok if r[5] >= 0],
        # the server's own time (Server-Timing total: from the front's read of the request to
        # its answer), and the rest of the latency from the scheduled send: the generator, the
        # socket before the front read it and the answer's way back
        "server_total_ms": [r[7] for r in ok if r[7] >= 0],
        "outside_ms": [1e3 * (r[2] - r[0]) - r[7] for r in ok if r[7] >= 0],
        "send_lag_s": [r[1] - r[0] for r in records if r[1] >= 0],
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--url", default="http://127.0.0.1:8000")
    p.add_argument("--model", default="langid")
    p.add_argument("--task", default="classify")
    p.add_argument("--texts-per-request", type=int, default=1)
    p.add_argument("--max-new-tokens", type=int, default=8)
    p.add_argument("--rate", type=float, help="open loop, requests/s")
    p.add_argument("--concurrency", type=int, default=32, help="closed loop (without --rate)")
    p.add_argument("--duration", type=float, default=10.0)
    p.add_argument("--max-in-flight", type=int, default=4000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--texts", type=Path, help="a text file, a text per line (default: the "
                   "task's demo dataset)")
    args = p.parse_args(argv)
    spec = {"url": args.url, "model": args.model, "task": args.task,
            "texts_per_request": args.texts_per_request, "max_new_tokens": args.max_new_tokens,
            "rate": args.rate, "concurrency": args.concurrency, "duration_s": args.duration,
            "max_in_flight": args.max_in_flight, "seed": args.seed,
            "texts_file": str(args.texts) if args.texts else None}
    from seqserve.loadtest.stats import percentiles_ms

    res = run(spec)
    res["latency_ms"] = percentiles_ms(res.pop("latency_s"))
    res["queue_ms"] = percentiles_ms(res.pop("queue_ms"), 1)
    res["server_total_ms"] = percentiles_ms(res.pop("server_total_ms"), 1)
    res["outside_ms"] = percentiles_ms(res.pop("outside_ms"), 1)
    res.pop("queue_ms_settled"), res.pop("compute_ms"), res.pop("send_lag_s")
    res["ok_per_s"] = res["ok"] / res["wall_s"]
    res["cpu_ms_per_request"] = 1e3 * res["load_cpu_s"] / max(1, res["scheduled"])
    print(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
