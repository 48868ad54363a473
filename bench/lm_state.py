"""State as a value, measured (issue 36): the prefix-state cache's time to first token, a
conversation carried by state tokens against resending its history, and what a state token
costs.

Two `seqserve serve` processes on the same language-model bundle (its prefill must take
`initial_state`, schema 3: re-export an older bundle with `seqserve export`), side by side in
one run: one with the prefix cache (the default size), one with `--prefix-cache-bytes 0`,
both with the same state secret. Rounds alternate between them; the medians are quoted.

1. Shared prefix: `--streams` concurrent streamed generations, each a `--prefix-tokens`-token
   shared text (a document, a system prompt) followed by its own `--question-tokens`-token
   question, `--new-tokens` greedy tokens each; time to first token (the first text event)
   p50 / p99 per server, and that both servers answer the same text to every prompt.
2. Conversation: `--turns` turns of a short user text and <= 8 new tokens, carried by state
   tokens (each turn sends the last state and its own text) against resending the whole
   history each turn to the cache-off server; prompt tokens computed per turn and the time to
   first token of the last turn.
3. A state token of this model: its size, encoding and decoding + verification time.

    python bench/lm_state.py --repo /tmp/lmrepo --model text-lm
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import timeit
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.serving import wait_ready  # noqa: E402

TEXT = ("the value of an expression is computed by the interpreter when a function is "
        "called with its arguments and the result is returned to the caller as an object "
        "whose type defines the operations it supports such as attribute access and "
        "iteration over a sequence of items in a list or a dictionary of keys")
WORDS = TEXT.split(" ")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start(repo: Path, secret: Path, extra: list[str]) -> tuple[str, subprocess.Popen[bytes]]:
    port = free_port()
    cmd = [sys.executable, "-m", "seqserve.cli", "serve", "--repo", str(repo), "--port",
           str(port), "--no-grpc", "--api-workers", "1", "--log-level", "warning",
           "--state-secret-file", str(secret), "--max-new-tokens", "64",
           "--max-queue-wait-s", "30", *extra]  # measure waits, refuse none
    proc = subprocess.Popen(cmd, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                            stdout=subprocess.DEVNULL, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    wait_ready(url, proc)
    return url, proc


def text_of(tokens: int, offset: int) -> str:
    """About `tokens` tokens of English (the model's unigram pieces are mostly words)."""
    return " ".join(WORDS[(offset + i) % len(WORDS)] for i in range(tokens))


async def stream(client: httpx.AsyncClient, url: str, model: str, body: dict[str, Any]
                 ) -> tuple[float, str, dict[str, Any]]:
    """(seconds to the first text event, the whole text, the finish event with the usage)."""
    started = time.perf_counter()
    first: float | None = None
    text, finish = [], {}
    async with client.stream("POST", f"{url}/v1/models/{model}/generate",
                             json={**body, "stream": True}) as r:
        if r.status_code != 200:
            raise SystemExit(f"{r.status_code}: {(await r.aread())[:300]!r}")
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            ev = json.loads(line[6:])
            if ev.get("text"):
                first = first if first is not None else time.perf_counter() - started
                text.append(ev["text"])
            if "finish_reason" in ev:
                finish = {**finish, **ev}
            if "usage" in ev:
                finish["usage"] = ev["usage"]
    return (first if first is not None else time.perf_counter() - started), "".join(text), \
        finish


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def shared_prefix(urls: dict[str, str], args: argparse.Namespace) -> dict[str, Any]:
    prefix = text_of(args.prefix_tokens, 0)
    ttft: dict[str, list[float]] = {k: [] for k in urls}
    texts: dict[str, dict[str, str]] = {k: {} for k in urls}
    async with httpx.AsyncClient(timeout=120) as client:
        for url in urls.values():  # the shared prefix once (what a first client would pay)
            await stream(client, url, args.model, {"prompt": prefix, "max_new_tokens": 1,
                                                   "temperature": 0})
        for rnd in range(args.rounds):
            for name, url in (urls.items() if rnd % 2 == 0 else reversed(urls.items())):
                prompts = [f"{prefix} question {rnd} {i} "  # distinct questions
                           + text_of(args.question_tokens - 4, 7 * (rnd * 97 + i) + 3)
                           for i in range(args.streams)]
                got = await asyncio.gather(*(stream(
                    client, url, args.model, {"prompt": p, "max_new_tokens": args.new_tokens,
                                              "temperature": 0}) for p in prompts))
                ttft[name] += [g[0] for g in got]
                texts[name].update({p: g[1] for p, g in zip(prompts, got, strict=True)})
    same = sum(texts["cache"][p] == texts["no-cache"][p] for p in texts["cache"])
    out = {k: {"p50_ms": 1000 * statistics.median(v), "p99_ms": 1000 * pct(v, 0.99)}
           for k, v in ttft.items()}
    out["same_answers"] = f"{same}/{len(texts['cache'])}"
    out["p50_ratio"] = out["no-cache"]["p50_ms"] / out["cache"]["p50_ms"]
    out["p99_ratio"] = out["no-cache"]["p99_ms"] / out["cache"]["p99_ms"]
    return out


async def conversation(urls: dict[str, str], args: argparse.Namespace) -> dict[str, Any]:
    turns = [text_of(10, 11 * t + 5) for t in range(args.turns)]
    runs: dict[str, list[list[float]]] = {"tokens": [], "history": []}
    computed: dict[str, list[int]] = {"tokens": [], "history": []}
    async with httpx.AsyncClient(timeout=120) as client:
        for rnd in range(args.rounds):
            for mode in (("tokens", "history") if rnd % 2 == 0 else ("history", "tokens")):
                state: str | None = None
                history = ""
                times, counts = [], []
                for user in turns:
                    if mode == "tokens":  # the turn's text after the last state
                        body = {"prompt": user, "max_new_tokens": 8, "temperature": 0,
                                "return_state": True, **({"state": state} if state else {})}
                        first, text, finish = await stream(client, urls["cache"], args.model,
                                                            body)
                        state = finish["state"]
                        # fed: the turn's tokens (bos first, or the state's pending token)
                        counts.append(finish["usage"]["prompt_tokens"] + 1)
                    else:  # the whole history, recomputed (the cache is off there)
                        history = (history + " " + user).strip()
                        first, text, finish = await stream(
                            client, urls["no-cache"], args.model,
                            {"prompt": history, "max_new_tokens": 8, "temperature": 0})
                        history += text
                        counts.append(finish["usage"]["prompt_tokens"] + 1)  # and bos
                    times.append(first)
                runs[mode].append(times)
                computed[mode] = counts
    last = {m: statistics.median(r[-1] for r in v) for m, v in runs.items()}
    return {"prompt_tokens_per_turn": computed,
            "ttft_last_turn_ms": {m: 1000 * v for m, v in last.items()},
            "ttft_ratio": last["history"] / last["tokens"]}


def token_cost(url: str, args: argparse.Namespace, secret: Path) -> dict[str, Any]:
    from seqserve.service.core.state_token import StateCodec

    r = httpx.post(f"{url}/v1/models/{args.model}/generate", timeout=60,
                   json={"prompt": "a", "max_new_tokens": 2, "return_state": True})
    token = r.json()["results"][0]["state"]
    codec = StateCodec.from_file(secret)
    value = codec.decode(token)
    n = 2000
    return {"chars": len(token), "state_floats": value.floats,
            "encode_us": 1e6 * timeit.timeit(lambda: codec.encode(value), number=n) / n,
            "decode_verify_us": 1e6 * timeit.timeit(lambda: codec.decode(token), number=n) / n}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repo", type=Path, required=True)
    ap.add_argument("--model", default="text-lm")
    ap.add_argument("--streams", type=int, default=32)
    ap.add_argument("--prefix-tokens", type=int, default=200)
    ap.add_argument("--question-tokens", type=int, default=20)
    ap.add_argument("--new-tokens", type=int, default=8)
    ap.add_argument("--turns", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="lm-state-"))
    secret = folder / "state.secret"
    secret.write_text(secrets.token_hex(32) + "\n")
    procs = []
    try:
        cache_url, p1 = start(args.repo, secret, [])
        procs.append(p1)
        plain_url, p2 = start(args.repo, secret, ["--prefix-cache-bytes", "0"])
        procs.append(p2)
        urls = {"cache": cache_url, "no-cache": plain_url}
        print(f"load average before: {os.getloadavg()}", flush=True)
        result = {"shared_prefix": asyncio.run(shared_prefix(urls, args))}
        print(json.dumps(result["shared_prefix"], indent=1), flush=True)
        result["conversation"] = asyncio.run(conversation(urls, args))
        print(json.dumps(result["conversation"], indent=1), flush=True)
        result["state_token"] = token_cost(cache_url, args, secret)
        print(json.dumps(result["state_token"], indent=1), flush=True)
        result["load_average_after"] = os.getloadavg()
        print(f"load average after: {result['load_average_after']}")
        if args.json:
            args.json.write_text(json.dumps(result, indent=1))
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()


if __name__ == "__main__":
    main()
