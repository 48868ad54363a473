"""A/B of seqserve checkouts or flags, side by side: each variant served in turn, same texts.

    python bench/peers/ab.py --repo REPO --workload short --rounds 3 \\
        base=/tmp/base-checkout new=.@"--layout engine"

A variant is LABEL=CHECKOUT[@FLAGS]: `python -m seqserve.cli serve` (in an older checkout,
`seqserve.service.cli`) run with PYTHONPATH=CHECKOUT (another worktree: `git worktree add
/tmp/base HEAD~1`) and FLAGS added
to `--repo REPO --truncate --log-level warning` (a `--log-level` in FLAGS wins). Each round
serves every variant once (the order reversed every other round), loads it with wrk and
bench/peers/compose.lua at --connections for --warmup then --duration seconds with the peers
run's texts (bench/peers/texts.py), and reads the CPU of every server process from /proc;
it prints each run, then each variant's medians. Needs wrk, except with `--new-connections`:
then an asyncio client in this process opens a new connection for every request
(`Connection: close`), as clients without keep-alive do.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shlex
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.peers import load as ld  # noqa: E402
from bench.peers import servers as sv  # noqa: E402
from bench.peers.texts import langid_rows, translate_workload, workloads  # noqa: E402

PATHS = {"short": "/v1/models/{model}/classify", "long": "/v1/models/{model}/classify",
         "translate": "/v1/models/{model}/translate"}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("variants", nargs="+", metavar="LABEL=CHECKOUT[@FLAGS]")
    p.add_argument("--repo", type=Path, default=Path("model_repository"))
    p.add_argument("--workload", choices=sorted(PATHS), default="short")
    p.add_argument("--model", default=None,
                   help="default: langid (short, long), numbers-en-fr (translate)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--duration", type=float, default=12.0)
    p.add_argument("--warmup", type=float, default=4.0)
    p.add_argument("--connections", type=int, default=64)
    p.add_argument("--port", type=int, default=0, help="0: a free one per run")
    p.add_argument("--new-connections", action="store_true",
                   help="a new connection per request (Connection: close), asyncio client")
    return p.parse_args(argv)


def new_connections(load: ld.Load) -> ld.LoadResult:
    """`load` with one new connection per request (`Connection: close`)."""
    return asyncio.run(_new_connections(load))


async def _new_connections(load: ld.Load) -> ld.LoadResult:
    host, port = load.url.removeprefix("http://").split(":")
    lat: list[float] = []
    errors: dict[str, int] = {}
    stop_at = time.perf_counter() + load.seconds

    async def client(c: int) -> None:
        k = 0
        while time.perf_counter() < stop_at:
            text = load.workload.text(load.start + k * load.connections + c)
            k += 1
            body = json.dumps({"texts": [text]}).encode()
            head = (f"POST {load.path} HTTP/1.1\r\nHost: {host}:{port}\r\n"
                    f"Connection: close\r\nContent-Type: application/json\r\n"
                    f"Content-Length: {len(body)}\r\n\r\n")
            t0 = time.perf_counter()
            try:
                reader, writer = await asyncio.open_connection(host, int(port))
                writer.write(head.encode() + body)
                answer = await reader.read()
                writer.close()
            except OSError:
                errors["connect"] = errors.get("connect", 0) + 1
                continue
            lat.append(time.perf_counter() - t0)
            if answer[9:12] != b"200":
                errors["status"] = errors.get("status", 0) + 1

    begin = time.perf_counter()
    await asyncio.gather(*(client(c) for c in range(load.connections)))
    elapsed = time.perf_counter() - begin
    ms = sorted(x * 1e3 for x in lat) or [0.0]
    p = [ms[min(len(ms) - 1, int(q * len(ms)))] for q in (0.5, 0.9, 0.99)]
    return ld.LoadResult(len(lat), elapsed, p[0], p[1], p[2], ms[-1], errors)


def variant(text: str) -> tuple[str, Path, list[str]]:
    label, sep, rest = text.partition("=")
    if not sep or not label:
        raise SystemExit(f"variant {text!r}: expected LABEL=CHECKOUT[@FLAGS]")
    checkout, _, flags = rest.partition("@")
    return label, Path(checkout).resolve(), shlex.split(flags)


def entry_point(checkout: Path) -> str:
    """The module that runs `seqserve` in `checkout`: `seqserve.cli`, or
    `seqserve.service.cli` in a checkout from before the CLI moved (issue 33)."""
    return "seqserve.cli" if (checkout / "seqserve" / "cli").is_dir() else "seqserve.service.cli"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if ld.wrk_path() is None and not args.new_connections:
        raise SystemExit("wrk is not installed (apt-get install wrk), or --new-connections")
    run_load = new_connections if args.new_connections else ld.run_wrk
    variants = [variant(v) for v in args.variants]
    model = args.model or ("numbers-en-fr" if args.workload == "translate" else "langid")
    path = PATHS[args.workload].format(model=model)
    probe = "one hundred and two" if args.workload == "translate" else "hello there"
    work = Path(tempfile.mkdtemp(prefix="seqserve-ab-"))
    wl = (translate_workload() if args.workload == "translate"
          else workloads(langid_rows())[args.workload])
    data = wl.data_file(work / f"texts-{args.workload}")
    results: dict[str, list[tuple[float, float, float]]] = {v[0]: [] for v in variants}
    start = 0
    for r in range(args.rounds):
        for label, checkout, flags in (variants if r % 2 == 0 else variants[::-1]):
            log_flags = [] if "--log-level" in flags else ["--log-level", "warning"]
            cmd = [sys.executable, "-m", entry_point(checkout), "serve", "--repo",
                   str(args.repo.resolve()), "--host", "127.0.0.1", "--truncate",
                   *log_flags, *flags]
            server = sv.Server(label, path, " ".join(cmd), lambda p, c=cmd, k=checkout:
                               sv.Launch([*c, "--port", str(p)], env={"PYTHONPATH": str(k)},
                                         cwd=work))
            port = args.port or sv.free_port()
            proc = sv.start(server, port, work / f"log-{label}-{r}.txt")
            try:
                sv.wait_ready(proc, port, path, probe, 300)
                url = f"http://127.0.0.1:{port}"
                run_load(ld.Load(url, path, wl, data, start, args.warmup, args.connections))
                start += 1_000_000
                cpu0 = sv.session_cpu_s(proc.pid)
                out = run_load(ld.Load(url, path, wl, data, start, args.duration,
                                       args.connections))
                cpu = sv.session_cpu_s(proc.pid) - cpu0
                start += 1_000_000
            finally:
                sv.stop(proc)
            row = (out.rps, out.p99_ms, cpu / max(out.requests, 1) * 1e3)
            results[label].append(row)
            print(f"round {r} {label:12s} {row[0]:8.0f} req/s  p99 {row[1]:6.1f} ms  "
                  f"CPU {row[2]:.3f} ms/request  errors {out.errors or 0}", flush=True)
    how = "clients, a new connection per request" if args.new_connections else "connections"
    print(f"\n{args.workload}, {args.connections} {how}, {args.duration:g} s after "
          f"{args.warmup:g} s of warm-up, medians of {args.rounds} round(s):")
    for label, rows in results.items():
        print(f"  {label:12s} {statistics.median(x[0] for x in rows):8.0f} req/s  p99 "
              f"{statistics.median(x[1] for x in rows):6.1f} ms  CPU "
              f"{statistics.median(x[2] for x in rows):.3f} ms/request  "
              f"(req/s of each round: {', '.join(f'{x[0]:.0f}' for x in rows)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
