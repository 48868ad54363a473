"""Benchmark (not a test): LM generation, continuous vs request-level vs one at a time, and a peer.

Part 1, the engine in process (no HTTP), one LM bundle, ONNX Runtime on 1 intra-op thread:
C concurrent streaming clients (closed loop: each sends one prompt, reads its token stream to
the end, sends the next) against
  (a) `LMLoop`, step-level continuous batching (a prompt joins the live batch at the next
      step; every live sequence advances in one `lm_step` call per step),
  (b) the same loop with `continuous=False` (request-level: an admitted batch runs until its
      last sequence ends before the next batch is admitted),
  (c) one request at a time: the same runtime, prefill then one `lm_step` per token, batch 1,
      a request starts when the previous one ended.
Reported: generated tokens/s and time to first token (TTFT, from the client's send) p50/p99.

Part 2, over HTTP (`--peer`): `seqserve serve` and bench/lm_peer.py (plain FastAPI + ONNX
Runtime, per request, SSE) on the same bundle, each in its own process, each driven by
`seqserve loadtest --task generate --stream --concurrency C` in another process, in
interleaved rounds. Reported: tokens/s and TTFT/inter-token p50/p99 from the load tool.

The bundle: `--repo R --model M`, or (default) the demo's text-lm shape (LSTM 256, 1024
unigram pieces, pydoc-topics; `--shape small`: GRU 128 over 256 pieces) trained for
`--train-seconds` and exported here into bench_results/lm/ (the serving cost depends on the
shape, not on how long it trained).

    .venv/bin/python bench/bench_lm.py --clients 32 64 --peer --json bench_results/lm/lm.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from seqserve.export.manifest import Manifest, load_bundle  # noqa: E402
from seqserve.export.versions import list_bundles  # noqa: E402
from seqserve.loadtest.texts import load_corpus_prompts  # noqa: E402
from seqserve.models.text.tokenizer import Tokenizer  # noqa: E402
from seqserve.service.runtimes.onnx import OnnxRuntime  # noqa: E402
from seqserve.service.scheduling.generation import GenerateOptions  # noqa: E402
from seqserve.service.scheduling.lm import LMLoop  # noqa: E402
from seqserve.service.scheduling.sampling import sample, sequence_keys, uniforms  # noqa: E402
from seqserve.service.scheduling.work import DecodeConfig  # noqa: E402

OUT = ROOT / "bench_results" / "lm"
SHAPES: dict[str, dict[str, Any]] = {
    "demo": {},
    "small": {"vocab_size": 256, "cell": "gru", "embed_size": 64, "hidden_size": 128,
              "max_length": 128},
}
"""Model overrides of the demo LM (`DEMO_LM["model"]`) per `--shape`."""


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repo", type=Path, default=None, help="repository with the LM bundle")
    p.add_argument("--model", default="text-lm")
    p.add_argument("--train-seconds", type=float, default=20.0,
                   help="without --repo: training time of the bench's own bundle")
    p.add_argument("--shape", choices=sorted(SHAPES), default="demo",
                   help="without --repo: the bundle's shape (demo: text-lm's; small: a GRU "
                        "of 128 over 256 pieces, where a step's fixed cost dominates)")
    p.add_argument("--clients", type=int, nargs="+", default=[32, 64])
    p.add_argument("--requests", type=int, default=4,
                   help="requests per client per mode (engine part)")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--min-new-tokens", type=int, default=8,
                   help="engine part: each request's max_new_tokens is drawn uniformly from "
                        "[min, max] (seeded by its index), as lengths vary in real traffic")
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--prompt-chars", type=int, default=64)
    p.add_argument("--threads", type=int, default=1, help="ORT intra-op threads")
    p.add_argument("--skip-engine", action="store_true")
    p.add_argument("--peer", action="store_true", help="also run part 2 (HTTP, vs the peer)")
    p.add_argument("--peer-clients", type=int, default=32)
    p.add_argument("--peer-duration", type=float, default=15.0)
    p.add_argument("--peer-rounds", type=int, default=2)
    p.add_argument("--json", type=Path, default=None, help="also write the figures here")
    return p.parse_args()


def load_avg() -> float:
    return float(Path("/proc/loadavg").read_text().split()[0])


def prepare_bundle(args: argparse.Namespace) -> Path:
    """The LM bundle folder: from --repo, or trained and exported here."""
    if args.repo is not None:
        versions = {v: p for name, v, p in list_bundles(args.repo) if name == args.model}
        if not versions:
            sys.exit(f"{args.repo}: no bundle named {args.model!r}")
        return Path(versions[max(versions)])
    from seqserve.export.bundle import export_run
    from seqserve.models.train.lm import DEMO_LM, run_lm_training

    run, repo = OUT / f"run-{args.shape}", OUT / f"repo-{args.shape}"
    if not (run / "DONE").is_file():
        shutil.rmtree(run, ignore_errors=True)
        train = {**DEMO_LM["train"], "epochs": 1, "max_minutes": args.train_seconds / 60}
        print(f"training the demo's LM shape for {args.train_seconds:g} s -> {run}",
              file=sys.stderr)
        model = {**DEMO_LM["model"], **SHAPES[args.shape]}
        run_lm_training(DEMO_LM["data"], run, model, train, progress=False)
    bundle = repo / args.model / "1"
    if not (bundle / "manifest.json").is_file():
        shutil.rmtree(repo, ignore_errors=True)
        export_run(run, repo, args.model, version=1, progress=False)
    return bundle


# -- part 1: the engine in process ---------------------------------------------------------


class Setup:
    def __init__(self, bundle: Path, threads: int, args: argparse.Namespace) -> None:
        self.manifest: Manifest = load_bundle(bundle)
        files = {g: bundle / str(spec.file("onnx")) for g, spec in self.manifest.graphs.items()}
        self.runtime = OnnxRuntime(files, ["CPUExecutionProvider"], threads, 1)
        t = self.manifest.tokenizer
        self.bos, self.eos, self.vocab, self.pad = t.bos_id, t.eos_id, t.vocab_size, t.pad_id
        tok = Tokenizer.load(bundle / t.file)
        limit = int(self.manifest.limits.get("max_tokens", 256))
        prompts = load_corpus_prompts("pydoc-topics", "test", args.prompt_chars)
        self.rows = [[self.bos, *tok.encode(p)[: limit - 1]] for p in prompts]
        self.args = args

    def options(self, i: int) -> GenerateOptions:
        lo, hi = self.args.min_new_tokens, self.args.max_new_tokens
        length = int(np.random.default_rng(i).integers(min(lo, hi), hi + 1))
        return GenerateOptions(max_new_tokens=length, temperature=self.args.temperature,
                               seed=i)


async def drive(setup: Setup, clients: int, one: Any, label: str) -> dict[str, float]:
    """`clients` closed-loop streaming clients, `--requests` prompts each; `one(i, row)`
    returns (seconds to first token, tokens)."""
    total = clients * setup.args.requests
    order = iter(range(total))
    ttft: list[float] = []
    tokens = 0

    async def client() -> None:
        nonlocal tokens
        for i in order:
            first, n = await one(i, setup.rows[i % len(setup.rows)])
            ttft.append(first)
            tokens += n

    load0, start, cpu = load_avg(), time.perf_counter(), time.process_time()
    await asyncio.gather(*(client() for _ in range(clients)))
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    t = np.array(ttft) * 1e3
    print(f"  [{label} x{clients}] {total} requests, {tokens} tokens, {wall:.1f} s",
          file=sys.stderr)
    return {"requests": total, "tokens": tokens, "wall_s": wall,
            "tokens_per_s": tokens / wall, "ttft_p50_ms": float(np.percentile(t, 50)),
            "ttft_p99_ms": float(np.percentile(t, 99)), "cpu_s": cpu,
            "load_avg_start": load0, "load_avg_end": load_avg()}


async def engine_mode(setup: Setup, clients: int, continuous: bool) -> dict[str, float]:
    config = DecodeConfig(max_live_hypotheses=max(256, clients), max_queue=4096, max_admit=64,
                          groups=1, retry_after_s=1.0, max_queue_wait_s=None,
                          continuous=continuous, pad_id=max(setup.pad, 0))
    loop = LMLoop(setup.runtime, setup.eos, setup.vocab, config)
    loop.start()
    try:
        warm = loop.generate(setup.rows[:8], setup.options(0))
        async for _ in warm:
            pass

        async def one(i: int, row: list[int]) -> tuple[float, int]:
            t0 = time.perf_counter()
            first: float | None = None
            n = 0
            async for events in loop.generate([row], setup.options(i)):
                for ev in events:
                    if ev.token is not None and ev.token != setup.eos:
                        n += 1
                        if first is None:
                            first = time.perf_counter() - t0
            return (first if first is not None else time.perf_counter() - t0), n

        label = "continuous" if continuous else "request-level"
        return await drive(setup, clients, one, label)
    finally:
        await loop.stop()


async def one_at_a_time(setup: Setup, clients: int) -> dict[str, float]:
    """Prefill + lm_step per token, batch 1, one request after the other (a lock), tokens
    handed to their client as they exist."""
    pool = ThreadPoolExecutor(max_workers=1)
    lock = asyncio.Lock()
    ev_loop = asyncio.get_running_loop()
    rt = setup.runtime

    def prefill(row: list[int]) -> dict[str, np.ndarray]:
        return rt.run("prefill", {"input_ids": np.array([row], dtype=np.int64),
                                  "lengths": np.array([len(row)], dtype=np.int64)})

    def step(prev: int, state: np.ndarray) -> dict[str, np.ndarray]:
        return rt.run("lm_step", {"prev_ids": np.array([prev], dtype=np.int64),
                                  "state": state})

    async def one(i: int, row: list[int]) -> tuple[float, int]:
        t0 = time.perf_counter()
        o = setup.options(i)
        key = sequence_keys(i, np.zeros(1, dtype=np.int64))  # as the scheduler's row 0
        temp, top_k = np.array([o.temperature], np.float32), np.array([o.top_k])
        top_p = np.array([o.top_p], np.float32)
        async with lock:
            out = await ev_loop.run_in_executor(pool, prefill, row)
            state, lp = out["state"], out["log_probs"][:, len(row) - 1]
            first = time.perf_counter() - t0
            n = 0
            while True:
                token = int(sample(lp, temp, top_k, top_p,
                                   uniforms(key, np.array([n])))[0])
                if token == setup.eos:
                    break
                n += 1
                if n >= o.max_new_tokens:
                    break
                out = await ev_loop.run_in_executor(pool, step, token, state)
                state, lp = out["new_state"], out["log_probs"]
        return first, n

    try:
        await one(0, setup.rows[0])
        return await drive(setup, clients, one, "one-at-a-time")
    finally:
        pool.shutdown()


def engine_part(bundle: Path, args: argparse.Namespace) -> dict[str, Any]:
    setup = Setup(bundle, args.threads, args)
    results: dict[str, Any] = {}
    for clients in args.clients:
        r = {"a_continuous": asyncio.run(engine_mode(setup, clients, True)),
             "b_request_level": asyncio.run(engine_mode(setup, clients, False)),
             "c_one_at_a_time": asyncio.run(one_at_a_time(setup, clients))}
        results[str(clients)] = r
    return results


# -- part 2: over HTTP, seqserve vs the per-request peer ------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_ready(url: str, proc: subprocess.Popen[bytes], path: str, timeout: float = 120) -> None:
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        try:
            if httpx.get(url + path, timeout=2).status_code < 500:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"{url} not ready in {timeout:g} s")


def start_servers(bundle: Path, args: argparse.Namespace) -> tuple[dict[str, str], list[Any]]:
    py = sys.executable
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    ss_port, peer_port = free_port(), free_port()
    seqserve_cmd = [py, "-m", "seqserve.cli", "serve", "--repo", str(bundle.parents[1]),
                    "--intra-op-threads", str(args.threads), "--log-level", "warning",
                    "--port", str(ss_port)]
    peer_cmd = [py, str(ROOT / "bench" / "lm_peer.py"), str(peer_port)]
    procs = [subprocess.Popen(seqserve_cmd, env=env, stdout=subprocess.DEVNULL),
             subprocess.Popen(peer_cmd, env={**env, "PEER_BUNDLE": str(bundle),
                                             "PEER_THREADS": str(args.threads)},
                              stdout=subprocess.DEVNULL)]
    urls = {"seqserve": f"http://127.0.0.1:{ss_port}", "peer": f"http://127.0.0.1:{peer_port}"}
    wait_ready(urls["seqserve"], procs[0], "/v2/health/ready")
    wait_ready(urls["peer"], procs[1], "/docs")
    print(f"seqserve: {shlex_join(seqserve_cmd)}\npeer: PEER_BUNDLE={bundle} "
          f"{shlex_join(peer_cmd)}", file=sys.stderr)
    return urls, procs


def shlex_join(cmd: list[str]) -> str:
    import shlex

    return shlex.join(cmd)


def loadtest(url: str, model: str, out: Path, args: argparse.Namespace) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "seqserve.cli", "loadtest", url, "--model", model,
           "--task", "generate", "--stream", "--concurrency", str(args.peer_clients),
           "--duration", f"{args.peer_duration:g}", "--max-new-tokens",
           str(args.max_new_tokens), "--temperature", f"{args.temperature:g}",
           "--prompt-chars", str(args.prompt_chars), "--timeout", "120", "--out", str(out),
           "--quiet"]
    load0 = load_avg()
    subprocess.run(cmd, check=True, env={**os.environ, "PYTHONPATH": str(ROOT)},
                   stdout=subprocess.DEVNULL, timeout=args.peer_duration + 300)
    step = json.loads((out / "results.json").read_text())["steps"][0]
    step["load_avg_start"], step["load_avg_end"] = load0, load_avg()
    step["command"] = shlex_join(["seqserve", *cmd[3:]])
    return dict(step)


def peer_part(bundle: Path, args: argparse.Namespace) -> dict[str, Any]:
    urls, procs = start_servers(bundle, args)
    rounds: dict[str, list[dict[str, Any]]] = {"seqserve": [], "peer": []}
    try:
        for k in range(args.peer_rounds):
            for name, url in urls.items():
                step = loadtest(url, args.model, OUT / "http" / f"{name}-{k}", args)
                rounds[name].append(step)
                print(f"  [{name} round {k}] {step['tokens_per_s']:.1f} tokens/s, ttft p99 "
                      f"{step['ttft_ms']['p99']:.0f} ms, errors {step['errors']}",
                      file=sys.stderr)
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                p.kill()
    return rounds


def report(engine: dict[str, Any] | None, http: dict[str, Any] | None) -> None:
    if engine:
        print("\nPart 1: engine in process, streaming clients")
        print(f"{'clients':>8} {'mode':<16}{'tokens':>8}{'wall s':>8}{'tokens/s':>10}"
              f"{'TTFT p50':>10}{'TTFT p99':>10}{'load':>11}")
        for clients, modes in engine.items():
            for mode, r in modes.items():
                print(f"{clients:>8} {mode:<16}{r['tokens']:>8}{r['wall_s']:>8.1f}"
                      f"{r['tokens_per_s']:>10.1f}{r['ttft_p50_ms']:>10.1f}"
                      f"{r['ttft_p99_ms']:>10.1f}"
                      f"{r['load_avg_start']:>6.2f}-{r['load_avg_end']:.2f}")
            a, b, c = modes["a_continuous"], modes["b_request_level"], modes["c_one_at_a_time"]
            print(f"{'':>8} (a)/(b) tokens/s {a['tokens_per_s'] / b['tokens_per_s']:.2f}x, "
                  f"TTFT p99 {a['ttft_p99_ms'] / b['ttft_p99_ms']:.2f}x; (a)/(c) tokens/s "
                  f"{a['tokens_per_s'] / c['tokens_per_s']:.2f}x")
    if http:
        print("\nPart 2: HTTP, SSE streams")
        print(f"{'server':<10}{'round':>6}{'ok':>6}{'err':>5}{'tokens/s':>10}{'TTFT p50':>10}"
              f"{'TTFT p99':>10}{'ITL p50':>9}{'ITL p99':>9}{'load':>11}")
        for name, steps in http.items():
            for k, s in enumerate(steps):
                print(f"{name:<10}{k:>6}{s['ok']:>6}{s['errors']:>5}{s['tokens_per_s']:>10.1f}"
                      f"{s['ttft_ms']['p50']:>10.1f}{s['ttft_ms']['p99']:>10.1f}"
                      f"{s['inter_token_ms']['p50']:>9.1f}{s['inter_token_ms']['p99']:>9.1f}"
                      f"{s['load_avg_start']:>6.2f}-{s['load_avg_end']:.2f}")
        ss = np.mean([s["tokens_per_s"] for s in http["seqserve"]])
        peer = np.mean([s["tokens_per_s"] for s in http["peer"]])
        print(f"seqserve / peer tokens/s (mean of rounds): {ss / peer:.2f}x")


def main() -> None:
    args = parse_args()
    bundle = prepare_bundle(args)
    m = load_bundle(bundle)
    print(f"bundle {bundle} (v{m.version}), {args.threads} ORT thread(s), max_new_tokens "
          f"{args.max_new_tokens}, temperature {args.temperature:g}, load avg {load_avg():.2f}",
          file=sys.stderr)
    engine = None if args.skip_engine else engine_part(bundle, args)
    http = peer_part(bundle, args) if args.peer else None
    report(engine, http)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"bundle": str(bundle), "args": {
            k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
            "engine": engine, "http": http}, indent=2))


if __name__ == "__main__":
    main()
