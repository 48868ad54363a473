"""Overload (issue 37): admission by expected queue wait under open-loop 3x overload and
under a closed loop of 64 connections, against one `seqserve serve` with its default
settings (`--max-queue-wait-s` 0.5), printing one table with the commands.

    python bench/overload.py --repo model_repository
    python bench/overload.py --workloads classify16,long64 --duration 20
    python bench/overload.py --generator c      # the load from bench/opengen.c

Per workload of classify16 (langid, 16 texts a request), translate (numbers-en-fr, beam 5)
and generate (text-lm, --max-new-tokens 8): the capacity first (closed loop, --concurrency
32, --capacity-duration s: ok requests/s), then an open loop at --overload x capacity for
--duration s from --generators processes at once (each `seqserve loadtest --rate R/G` with
--max-in-flight high enough that it drops nothing; drops and the generators' p99 send lag are
printed: a lag over 50 ms means the generator fell behind). Printed: goodput (2xx/s) /
capacity, the admitted requests' p99 latency from their scheduled send and their p99 queue
wait (Server-Timing `queue`) against the bound, with `--generator c` the server's own p99
(Server-Timing `total`: from the front's read of the request to its answer) beside the p99 of
the latency outside it (the generator, the socket before the front read the request, the
answer's way back), refusals (429; how many carried
Retry-After), other errors; and from the server's /metrics, the wait estimate's error over
the run (`seqserve_queue_wait_estimate_error_seconds`, actual minus expected queue wait, and
`seqserve_queue_wait_model_error_seconds`, actual minus the cost model's estimate before the
margin: each one's median and the share of admitted work whose estimate ran more than 0.1 s
high or low).
long64: a closed loop of 64 connections on long langid texts (10-60 words, bench/peers'
long workload), one text a request: its p99 and its refusals.

Below the table, where each open loop's goodput goes (`accounting`): goodput = (the cores the
server got under overload / at capacity) x (its CPU per 2xx at capacity / under overload),
with the CPU per 2xx split into the event loops' (the server processes' main threads), the
native front's threads' (`seqserve-front`) and the other threads' (the runtime lanes), from
every thread's CPU in /proc.

Each load runs in a child process (`--worker`), so that two generators use two cores when
the machine has them; `uptime`'s load averages are printed before and after each row. With
`--generator c` one bench/opengen.c process makes every load instead (capacity and overload
alike; a few microseconds of CPU a request where a Python generator spends ~0.2 ms, which
the server shares the cores with); its rows have no 429 reasons (it does not read bodies).
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

ROOT = Path(__file__).resolve().parents[1]

from bench import opengen  # noqa: E402
from bench.opengen import SETTLE_S  # noqa: E402
from bench.peers.servers import session_cpu_s, session_threads  # noqa: E402
from bench.serving import wait_ready  # noqa: E402

ERROR_METRICS = {"admitted": "seqserve_queue_wait_estimate_error_seconds",
                 "model": "seqserve_queue_wait_model_error_seconds"}
"""The wait's error against what admission expected, and against the cost model's estimate
before its margin."""

REASONS = ("overloaded: expected queue wait", "cannot take it in time: expected queue wait",
           "left", "queue is full", "queue full", "in flight")
"""What a 429 says, counted by the first of these its body holds (shed_early, a scheduler's
admission by wait or by deadline, the depth bounds, the API process's in-flight bound)."""

WORKLOADS: dict[str, dict[str, Any]] = {
    "classify16": {"model": "langid", "task": "classify", "texts_per_request": 16},
    "translate": {"model": "numbers-en-fr", "task": "translate"},
    "generate": {"model": "text-lm", "task": "generate", "max_new_tokens": 8},
    "long64": {"model": "langid", "task": "classify", "long": True},
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--repo", type=Path, default=Path("model_repository"))
    p.add_argument("--url", help="a running server instead of starting one")
    p.add_argument("--port", type=int, default=8871)
    p.add_argument("--workloads", default="classify16,translate,generate,long64")
    p.add_argument("--duration", type=float, default=20.0, help="open loop and long64, s")
    p.add_argument("--capacity-duration", type=float, default=10.0)
    p.add_argument("--capacity-concurrency", type=int, default=32)
    p.add_argument("--overload", type=float, default=3.0, help="x capacity, open loop")
    p.add_argument("--generator", choices=("python", "c"), default="python",
                   help="python: `seqserve loadtest` processes (--generators of them for an "
                        "open loop); c: one bench/opengen.c process (a few us of CPU a "
                        "request), for the capacity and the open loop alike")
    p.add_argument("--generators", type=int, default=2,
                   help="load generator processes sharing the open loop's rate")
    p.add_argument("--max-in-flight", type=int, default=4000,
                   help="per generator: outstanding requests before it drops arrivals")
    p.add_argument("--out", type=Path, help="write the rows as JSON here")
    p.add_argument("--serve-args", default="", help="more `seqserve serve` flags")
    p.add_argument("--variant", action="append", default=[], metavar="LABEL=CHECKOUT",
                   help="serve this checkout's code (PYTHONPATH; e.g. a `git archive` of an "
                   "older commit); several: each workload runs on each in turn (before/after "
                   "side by side); default: this checkout")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    return p.parse_args(argv)


# -- one generator (a child process) -----------------------------------------------------

def worker(spec: dict[str, Any]) -> dict[str, Any]:
    """Run one load (`spec`: LoadConfig fields plus `texts_file`/`dataset`); its counts and
    the raw figures the parent merges."""
    from seqserve.loadtest import runner
    from seqserve.loadtest.config import LoadConfig
    from seqserve.loadtest.runner import run_load
    from seqserve.loadtest.texts import TextSampler

    texts = opengen.texts_for(spec)
    spec.pop("texts_file", None)
    cfg = LoadConfig(**spec)
    reasons: collections.Counter[str] = collections.Counter()
    fill = runner._fill_from_response

    def fill_and_note(record: Any, response: Any, task: str, streamed: bool = False) -> None:
        fill(record, response, task, streamed)
        if response.status == 429:  # why, from the error's message
            body = response.body.decode(errors="replace")
            reasons[next((k for k in REASONS if k in body), body[:40])] += 1

    runner._fill_from_response = fill_and_note
    cpu0 = time.process_time()
    result = run_load(cfg, TextSampler(texts, cfg.seed))
    load_cpu_s = time.process_time() - cpu0
    recs = result.records
    ok = [r for r in recs if r.outcome == "ok"]
    statuses = collections.Counter(str(r.status) for r in recs if r.status is not None
                                   and r.outcome != "ok")
    return {
        "wall_s": result.wall_s,
        "load_cpu_s": load_cpu_s,
        "scheduled": len(recs),
        "dropped": sum(r.outcome == "dropped" for r in recs),
        "ok": len(ok),
        "refused": statuses.get("429", 0),
        "refused_with_retry_after": sum(1 for r in recs if r.status == 429
                                        and r.retry_after_s is not None),
        "other_errors": sum(1 for r in recs if r.sent_s is not None and r.outcome != "ok"
                            and r.status != 429),
        "statuses": dict(statuses),
        "reasons": dict(reasons),
        "latency_s": [r.latency_s for r in ok],
        "queue_ms": [r.server_queue_ms for r in ok if r.server_queue_ms is not None],
        "queue_ms_settled": [r.server_queue_ms for r in ok if r.server_queue_ms is not None
                             and r.scheduled_s >= SETTLE_S],
        "compute_ms": [r.server_compute_ms for r in ok if r.server_compute_ms is not None],
        "server_total_ms": [], "outside_ms": [],  # (the c generator's: opengen.run)
        "send_lag_s": [r.send_lag_s for r in recs if r.send_lag_s is not None],
    }


FRONT_THREAD = "seqserve-front"
"""The native front's tokio threads' name (native/front/src/lib.rs)."""


def server_cpu_s(sid: int | None) -> tuple[float, float, float]:
    """CPU seconds (user + system) so far of the server started here (its session: every
    process it runs), of its processes' main threads alone (an API process's event loop)
    and of the native front's threads (accepting, reading requests, writing answers; the
    rest are the runtime lanes and helper threads); zeros for a server not started here."""
    if sid is None:
        return 0.0, 0.0, 0.0
    threads = session_threads(sid).items()
    return (session_cpu_s(sid), sum(s for (pid, tid), (_, s) in threads if pid == tid),
            sum(s for _, (name, s) in threads if name.startswith(FRONT_THREAD)))


SERVER_PID: int | None = None
"""The server started here (its process group's CPU is counted per run)."""
GENERATOR = "python"
"""`--generator`: python (`seqserve loadtest` workers) or c (bench/opengen.c)."""


def generate(specs: list[dict[str, Any]]) -> dict[str, Any]:
    """Run the loads in `specs` at once, each in its own process; merged figures, with the
    generators' and the server's CPU seconds over the run."""
    server0, loops0, front0 = server_cpu_s(SERVER_PID)
    if GENERATOR == "c":
        parts = [opengen.run(s) for s in specs]  # one spec: the whole load in one process
    else:
        procs = [subprocess.Popen([sys.executable, __file__, "--worker", json.dumps(s)],
                                  cwd=ROOT, stdout=subprocess.PIPE, text=True) for s in specs]
        parts = []
        for proc in procs:
            out, _ = proc.communicate()
            if proc.returncode:
                raise SystemExit(f"a load generator failed ({proc.returncode})")
            parts.append(json.loads(out.strip().splitlines()[-1]))
    server1, loops1, front1 = server_cpu_s(SERVER_PID)
    merged: dict[str, Any] = {"wall_s": max(p["wall_s"] for p in parts),
                              "server_cpu_s": server1 - server0, "loop_cpu_s": loops1 - loops0,
                              "front_cpu_s": front1 - front0,
                              "generator_cpu_s": sum(p["load_cpu_s"] for p in parts)}
    for key in ("scheduled", "dropped", "ok", "refused", "refused_with_retry_after",
                "other_errors"):
        merged[key] = sum(p[key] for p in parts)
    for key in ("latency_s", "queue_ms", "queue_ms_settled", "compute_ms", "server_total_ms",
                "outside_ms", "send_lag_s"):
        merged[key] = [v for p in parts for v in p.get(key, [])]
    for key in ("statuses", "reasons"):
        merged[key] = dict(sum((collections.Counter(p[key]) for p in parts),
                               collections.Counter()))
    return merged


def pct(values: list[float], q: float) -> float:
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q / 100 * len(ordered)) - 1))]


# -- the server and its metrics -----------------------------------------------------------

def start_server(args: argparse.Namespace, checkout: Path
                 ) -> tuple[subprocess.Popen[bytes], str, str]:
    cmd = [sys.executable, "-m", "seqserve.cli", "serve", "--repo", str(args.repo.resolve()),
           "--port", str(args.port), "--grpc-port", "0", *shlex.split(args.serve_args)]
    code = checkout.resolve()
    proc = subprocess.Popen(cmd, cwd=code, env={**os.environ, "PYTHONPATH": str(code)},
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    url = f"http://127.0.0.1:{args.port}"
    wait_ready(url, proc)
    return proc, url, shlex.join(["seqserve", "serve", *cmd[cmd.index("serve") + 1:]])


def stop_server(proc: subprocess.Popen[bytes]) -> None:
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def error_buckets(url: str, model: str) -> dict[str, dict[float, float]]:
    """Per `ERROR_METRICS` kind, cumulative counts by upper bound of the wait's error for
    `model`."""
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, dict[float, float]] = {k: collections.defaultdict(float)
                                          for k in ERROR_METRICS}
    names = {f"{name}_bucket": kind for kind, name in ERROR_METRICS.items()}
    text = httpx.get(f"{url}/metrics", timeout=30).text
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            kind = names.get(s.name)
            if kind is not None and s.labels.get("model") == model:
                out[kind][float(s.labels["le"])] += s.value
    return out


def error_summaries(before: dict[str, dict[float, float]],
                    after: dict[str, dict[float, float]]) -> dict[str, dict[str, Any]]:
    """`error_summary` of each kind."""
    return {kind: error_summary(before[kind], after[kind]) for kind in ERROR_METRICS}


def error_summary(before: dict[float, float], after: dict[float, float]) -> dict[str, Any]:
    """The run's share of the histogram: count, the bucket holding the median, and the
    shares of work whose estimate ran > 0.1 s high (error <= -0.1) or low (> 0.1)."""
    cum = sorted((le, after.get(le, 0.0) - before.get(le, 0.0)) for le in after)
    total = cum[-1][1] if cum else 0.0
    if not total:
        return {"count": 0}
    median = next(le for le, c in cum if c >= total / 2)
    lower = max((le for le, _ in cum if le < median), default=-math.inf)
    at = dict(cum)
    return {"count": int(total), "median": (lower, median),
            "high": at.get(-0.1, 0.0) / total, "low": 1 - at.get(0.1, 0.0) / total}


def uptime() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


# -- the runs -----------------------------------------------------------------------------

def long_texts(n: int = 5000) -> Path:
    from bench.peers.texts import langid_rows, workloads

    long = workloads(langid_rows())["long"]
    path = Path(tempfile.gettempdir()) / "seqserve-overload-long.txt"
    path.write_text("".join(long.text(g) + "\n" for g in range(n)), encoding="utf-8")
    return path


def command(url: str, spec: dict[str, Any], generators: int = 1) -> str:
    if GENERATOR == "c":
        parts = ["python", "bench/opengen.py", "--url", url, "--model", spec["model"],
                 "--task", spec["task"]]
    else:
        parts = ["seqserve", "loadtest", url, "--model", spec["model"], "--task", spec["task"]]
    if spec.get("rate") is not None:
        parts += ["--rate", f"{spec['rate']:.0f}", "--max-in-flight", str(spec["max_in_flight"])]
    else:
        parts += ["--concurrency", str(spec["concurrency"])]
    parts += ["--duration", f"{spec['duration_s']:g}"]
    if spec.get("texts_per_request", 1) != 1:
        parts += ["--texts-per-request", str(spec["texts_per_request"])]
    if spec.get("max_new_tokens") is not None and spec["task"] == "generate":
        parts += ["--max-new-tokens", str(spec["max_new_tokens"])]
    if spec.get("texts_file"):
        parts += ["--texts", "LONG.txt"]
    line = shlex.join(parts)
    return f"{line}  (x{generators} at once)" if generators > 1 else line


def base_spec(url: str, workload: dict[str, Any], long_file: Path | None) -> dict[str, Any]:
    spec = {"url": url, "model": workload["model"], "task": workload["task"],
            "texts_per_request": workload.get("texts_per_request", 1)}
    if workload["task"] == "generate":
        spec["max_new_tokens"] = workload["max_new_tokens"]
    if workload.get("long"):
        spec["texts_file"] = str(long_file)
    return spec


def run_workload(name: str, url: str, args: argparse.Namespace,
                 long_file: Path | None) -> list[dict[str, Any]]:
    workload = WORKLOADS[name]
    base = base_spec(url, workload, long_file)
    rows = []
    if workload.get("long"):
        spec = {**base, "concurrency": 64, "duration_s": args.duration}
        load0 = uptime()
        before = error_buckets(url, base["model"])
        res = generate([spec])
        rows.append(row(name, "closed 64", spec, res, None, load0, args,
                        error_summaries(before, error_buckets(url, base["model"])), 1, url))
        return rows
    cap_spec = {**base, "concurrency": args.capacity_concurrency,
                "duration_s": args.capacity_duration}
    load0 = uptime()
    cap = generate([cap_spec])
    capacity = cap["ok"] / cap["wall_s"]
    rows.append(row(name, f"capacity (closed {args.capacity_concurrency})", cap_spec, cap,
                    capacity, load0, args, None, 1, url))
    rate = args.overload * capacity
    g = 1 if GENERATOR == "c" else args.generators
    specs = [{**base, "rate": rate / g, "duration_s": args.duration, "seed": i,
              "max_in_flight": args.max_in_flight} for i in range(g)]
    load0 = uptime()
    before = error_buckets(url, base["model"])
    res = generate(specs)
    errors = error_summaries(before, error_buckets(url, base["model"]))
    rows.append(row(name, f"open {args.overload:g}x = {rate:.0f}/s", {**specs[0], "rate": rate},
                    res, capacity, load0, args, errors, g, url))
    return rows


def row(name: str, load: str, spec: dict[str, Any], res: dict[str, Any],
        capacity: float | None, load0: str, args: argparse.Namespace,
        errors: dict[str, Any] | None, generators: int, url: str) -> dict[str, Any]:
    ok_s = res["ok"] / res["wall_s"]
    sent = res["scheduled"] - res["dropped"]
    shown = dict(spec)
    if generators > 1:
        shown["rate"] = spec["rate"] / generators
    return {
        "workload": name, "load": load, "ok_per_s": ok_s,
        "goodput": ok_s / capacity if capacity and "open" in load else None,
        "p99_ms": pct(res["latency_s"], 99) * 1e3, "p50_ms": pct(res["latency_s"], 50) * 1e3,
        "queue_p99_ms": pct(res["queue_ms"], 99),
        "queue_p99_settled_ms": pct(res["queue_ms_settled"], 99),
        "compute_p99_ms": pct(res["compute_ms"], 99),
        "server_total_p99_ms": pct(res["server_total_ms"], 99),
        "outside_p99_ms": pct(res["outside_ms"], 99),
        "refused": res["refused"], "retry_after": res["refused_with_retry_after"],
        "other_errors": res["other_errors"], "statuses": res["statuses"],
        "reasons": res["reasons"],
        "dropped": res["dropped"], "scheduled": res["scheduled"],
        "send_lag_p99_ms": pct(res["send_lag_s"], 99) * 1e3 if "open" in load else None,
        "errors": errors, "load_avg": f"{load0} -> {uptime()}",
        "server_cpu_ms_per_request": 1e3 * res["server_cpu_s"] / max(1, sent),
        "server_cpu_ms_per_ok": 1e3 * res["server_cpu_s"] / max(1, res["ok"]),
        "loop_cpu_ms_per_ok": 1e3 * res["loop_cpu_s"] / max(1, res["ok"]),
        "front_cpu_ms_per_ok": 1e3 * res["front_cpu_s"] / max(1, res["ok"]),
        "ok": res["ok"], "wall_s": res["wall_s"],
        "generator_cpu_ms_per_request": 1e3 * res["generator_cpu_s"] / max(1, sent),
        "server_cores": res["server_cpu_s"] / res["wall_s"],
        "generator_cores": res["generator_cpu_s"] / res["wall_s"],
        "command": command(url, shown, generators),
    }


def fmt_errors(errors: dict[str, dict[str, Any]] | None) -> str:
    if not errors:
        return "-"
    parts = []
    for kind, e in errors.items():
        if not e.get("count"):
            parts.append(f"{kind}: none")
            continue
        lo, hi = e["median"]
        parts.append(f"{kind}: n {e['count']}, median in ({lo:g}, {hi:g}] s, "
                     f">0.1 s high {e['high']:.0%}, >0.1 s low {e['low']:.0%}")
    return "; ".join(parts)


def why(r: dict[str, Any]) -> str:
    """The 429s by reason, when not all are the wait bound's."""
    short = {"overloaded: expected queue wait": "early", "left": "deadline",
             "cannot take it in time: expected queue wait": "wait"}
    parts = [f"{short.get(k, k)} {v}" for k, v in sorted(r["reasons"].items())]
    return f": {', '.join(parts)}" if parts else ""


def split(r: dict[str, Any]) -> str:
    """The server's own p99 (from its read of the request to its answer) / the p99 of the
    latency outside it (the generator, the socket before the front read the request, the
    answer's way back); "-" where the generator does not record it."""
    total, outside = r.get("server_total_p99_ms", math.nan), r.get("outside_p99_ms", math.nan)
    return "-" if math.isnan(total) else f"{total:.0f} / {outside:.0f}"


def table(rows: list[dict[str, Any]]) -> str:
    head = ("| workload | load | 2xx/s | goodput / capacity | p50 / p99 ms | queue p99 ms (after "
            f"the first {SETTLE_S:g} s) | "
            "compute p99 ms | server total p99 ms / outside it p99 ms (c generator) | "
            "429 (with Retry-After) | other errors | dropped / scheduled | "
            "send lag p99 ms | wait estimate error (admitted: against the expected wait; "
            "model: against the cost model before the margin) | CPU ms per request: server, "
            "generators (their load only) | cores busy: server, generators | load avg |")
    lines = [head, "|" + "|".join(" --- " for _ in range(head.count("|") - 1)) + "|"]
    for r in rows:
        good = "-" if r["goodput"] is None else f"{r['goodput']:.2f}"
        lag = "-" if r["send_lag_p99_ms"] is None else f"{r['send_lag_p99_ms']:.0f}"
        lines.append(
            f"| {r['workload']} | {r['load']} | {r['ok_per_s']:.1f} | {good} | "
            f"{r['p50_ms']:.0f} / {r['p99_ms']:.0f} | {r['queue_p99_ms']:.0f} "
            f"({r['queue_p99_settled_ms']:.0f}) | "
            f"{r['compute_p99_ms']:.0f} | {split(r)} | "
            f"{r['refused']} ({r['retry_after']}){why(r)} | "
            f"{r['other_errors']} | {r['dropped']} / {r['scheduled']} | {lag} | "
            f"{fmt_errors(r['errors'])} | {r['server_cpu_ms_per_request']:.3f}, "
            f"{r['generator_cpu_ms_per_request']:.3f} | {r['server_cores']:.2f}, "
            f"{r['generator_cores']:.2f} | {r['load_avg']} |")
    lines.append("")
    commands = {f"{r['workload'].split()[0]}, {r['load'].split(' = ')[0]}": r["command"]
                for r in rows}  # the same for every variant
    lines += [f"- {what}: `{cmd}`" for what, cmd in commands.items()]
    return "\n".join(lines)


def accounting(cap: dict[str, Any], over: dict[str, Any]) -> dict[str, float]:
    """Where an open-loop row's goodput goes, against its capacity row: goodput = (the cores
    the server got under overload / at capacity) x (its CPU per 2xx at capacity / under
    overload), exactly, both sides measured in the same runs; the CPU per 2xx split into the
    event loops' (the processes' main threads: HTTP, JSON, tokenizing, admission, every
    refusal), the native front's threads' (accepting, reading requests, writing answers:
    every refusal's too) and the other threads' (the runtime lanes: the graphs); and what
    each refusal cost the event loops if an admitted request's share held at its capacity
    cost (an upper bound: any premium the admitted requests pay under overload is counted in
    it)."""
    def other(row: dict[str, Any]) -> float:
        return float(row["server_cpu_ms_per_ok"] - row["loop_cpu_ms_per_ok"]
                     - row["front_cpu_ms_per_ok"])

    extra_loop_ms = (over["loop_cpu_ms_per_ok"] - cap["loop_cpu_ms_per_ok"]) * over["ok"]
    return {
        "goodput": over["ok_per_s"] / cap["ok_per_s"],
        "cores": over["server_cores"] / cap["server_cores"],
        "cost": cap["server_cpu_ms_per_ok"] / over["server_cpu_ms_per_ok"],
        "loop_ms": (cap["loop_cpu_ms_per_ok"], over["loop_cpu_ms_per_ok"]),
        "front_ms": (cap["front_cpu_ms_per_ok"], over["front_cpu_ms_per_ok"]),
        "other_ms": (other(cap), other(over)),
        "generator_cores": (cap["generator_cores"], over["generator_cores"]),
        "loop_ms_per_refusal": extra_loop_ms / over["refused"] if over["refused"] else math.nan,
    }


def accounting_table(rows: list[dict[str, Any]]) -> str:
    """`accounting` of each open-loop row with the capacity row before it."""
    lines = ["| workload | goodput | = server cores, overload / capacity | x CPU per 2xx, "
             "capacity / overload | event loops ms per 2xx, capacity -> overload | native "
             "front threads ms per 2xx, capacity -> overload | other threads ms per 2xx, "
             "capacity -> overload | event loop ms per 429 (at most) | generator cores, "
             "capacity -> overload |",
             "| --- | ---: | ---: | ---: | --- | --- | --- | ---: | --- |"]
    for cap, over in zip(rows, rows[1:], strict=False):
        if cap["load"].startswith("capacity") and over["load"].startswith("open") \
                and cap["workload"] == over["workload"] and cap["ok"] and over["ok"] \
                and cap["server_cores"] and over["server_cores"]:  # (--url: CPU unread)
            a = accounting(cap, over)
            lines.append(
                f"| {over['workload']} | {a['goodput']:.3f} | {a['cores']:.3f} | "
                f"{a['cost']:.3f} | {a['loop_ms'][0]:.3f} -> {a['loop_ms'][1]:.3f} | "
                f"{a['front_ms'][0]:.3f} -> {a['front_ms'][1]:.3f} | "
                f"{a['other_ms'][0]:.3f} -> {a['other_ms'][1]:.3f} | "
                f"{a['loop_ms_per_refusal']:.3f} | {a['generator_cores'][0]:.2f} -> "
                f"{a['generator_cores'][1]:.2f} |")
    return "\n".join(lines) if len(lines) > 2 else ""


def main(argv: list[str] | None = None) -> int:
    global SERVER_PID, GENERATOR
    args = parse_args(argv)
    GENERATOR = args.generator
    if args.worker:
        print(json.dumps(worker(json.loads(args.worker))))
        return 0
    names = [n for n in args.workloads.split(",") if n]
    unknown = set(names) - set(WORKLOADS)
    if unknown:
        raise SystemExit(f"unknown workloads {sorted(unknown)}; from {sorted(WORKLOADS)}")
    variants = [tuple(v.split("=", 1)) for v in args.variant] or [("", str(ROOT))]
    rows: list[dict[str, Any]] = []
    long_file = long_texts() if "long64" in names else None
    serve_cmd = "(a running server)"
    for name in names:  # a fresh server per workload (its estimates start from its warm-up)
        for label, checkout in variants:
            proc = None
            if args.url:
                url = args.url
            else:
                proc, url, serve_cmd = start_server(args, Path(checkout))
                SERVER_PID = proc.pid
            try:
                for r in run_workload(name, url, args, long_file):
                    r["workload"] = f"{name} {label}".strip()
                    rows.append(r)
                    print(f"{r['workload']} {r['load']}: {r['ok_per_s']:.1f} ok/s, "
                          f"CPU ms/request server {r['server_cpu_ms_per_request']:.3f} "
                          f"generators {r['generator_cpu_ms_per_request']:.3f}, cores "
                          f"{r['server_cores']:.2f} + {r['generator_cores']:.2f}, "
                          f"p99 {r['p99_ms']:.0f} ms, 429 {r['refused']} {r['reasons']}, "
                          f"load {r['load_avg']}", file=sys.stderr, flush=True)
            finally:
                if proc is not None:
                    stop_server(proc)
    print(f"server: {serve_cmd} (a fresh one per workload and variant: "
          f"{', '.join(f'{k}={v}' for k, v in variants)}); {os.cpu_count()} cores")
    print(table(rows))
    where = accounting_table(rows)
    if where:
        print(f"\nWhere the goodput goes (`accounting`):\n\n{where}")
    if args.out:
        args.out.write_text(json.dumps(rows, indent=1, default=str), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
