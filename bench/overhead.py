"""CPU time per request of each seqserve process under load, and bare ONNX Runtime's floor.

Requests per second on a shared 2-core machine say more about the neighbours than about the
server; CPU time per request does not (much): this measures it per process. It starts
`seqserve serve` (this checkout's code, its own session), checks it answers, warms it up,
drives it with a closed loop of `--connections` keep-alive connections for `--seconds` (wrk,
or the asyncio client; the short or long workload of bench/peers/texts.py: every request a
new text), and reads each process's user + system time from /proc/PID/stat (and its main
thread's alone: on the engine that is the event loop, the other threads are the batch
threads running the runtime) just before and after the run. Per request: those deltas / the
answered requests. The batches' mean rows come from /metrics. Then, with the server stopped,
the compute-only floor: bare ONNX Runtime on the same texts' token rows (1 intra-op thread,
batches of 8/16/32, arrival order and sorted by length), the least CPU ms per sequence.

    python bench/overhead.py --repo model_repository --model langid --seconds 20
    python bench/overhead.py ... --py-spy bench_results/overhead   # + py-spy of each process

`--py-spy DIR` runs a second, separate load run with `py-spy record --nonblocking` attached
to the API and engine processes (so the sampled run is not the measured one) and prints the
frames with the most samples of each.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.peers import servers as sv  # noqa: E402
from bench.peers.apps.common import Bundle  # noqa: E402
from bench.peers.ceiling import measure  # noqa: E402
from bench.peers.load import Load, run_load, wrk_path  # noqa: E402
from bench.peers.texts import langid_rows, workloads  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repo", type=Path, default=Path("model_repository"))
    p.add_argument("--model", default="langid")
    p.add_argument("--workload", choices=("short", "long"), default="short")
    p.add_argument("--seconds", type=float, default=20.0)
    p.add_argument("--warmup", type=float, default=3.0)
    p.add_argument("--connections", type=int, default=64)
    p.add_argument("--client", choices=("wrk", "python"), default=None,
                   help="default: wrk when installed, else python")
    p.add_argument("--serve-arg", action="append", default=[],
                   help="extra `seqserve serve` argument (repeatable: --serve-arg=--instances=1)")
    p.add_argument("--python", default=sys.executable, help="interpreter that runs the server")
    p.add_argument("--floor-seconds", type=float, default=1.0,
                   help="seconds per bare ONNX Runtime point (0: skip the floor)")
    p.add_argument("--py-spy", type=Path, default=None,
                   help="folder for py-spy flame graphs of each process (a separate run)")
    p.add_argument("--json", type=Path, default=None, help="write the figures here too")
    return p.parse_args(argv)


def proc_cpu(pid: int) -> tuple[float, float, float, int]:
    """(process user + system, main thread user + system, process system) CPU seconds of
    `pid`, and its context switches (voluntary + involuntary, all threads)."""
    def fields(path: str) -> list[bytes]:
        raw = Path(path).read_bytes()
        return raw[raw.rindex(b")") + 2:].split()

    whole, main_t = fields(f"/proc/{pid}/stat"), fields(f"/proc/{pid}/task/{pid}/stat")
    switches = 0
    for task in os.scandir(f"/proc/{pid}/task"):
        try:
            status = Path(task.path, "status").read_text()
        except OSError:
            continue
        switches += sum(int(line.split()[1]) for line in status.splitlines()
                        if "ctxt_switches:" in line)
    return ((int(whole[11]) + int(whole[12])) / TICK, (int(main_t[11]) + int(main_t[12])) / TICK,
            int(whole[12]) / TICK, switches)


def roles(sid: int) -> dict[int, str]:
    """Every live process of session `sid` by role: supervisor, api, engine."""
    out = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            raw = Path(entry.path, "stat").read_bytes()
            cmd = Path(entry.path, "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if int(raw[raw.rindex(b")") + 2:].split()[3]) != sid:
            continue
        if "seqserve.service.engine" in cmd:
            role = "engine"
        elif "api_process" in cmd:
            role = "api"
        elif "serve" in cmd and "python" in cmd:
            role = "supervisor"
        else:
            role = cmd.split(" ")[0].rsplit("/", 1)[-1] or "other"
        out[int(entry.name)] = role
    return out


def batch_stats(port: int, model: str) -> tuple[float, float]:
    """(sum, count) of seqserve_batch_size for `model` from /metrics."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    found = {}
    for kind in ("sum", "count"):
        m = re.search(rf'^seqserve_batch_size_{kind}\{{model="{re.escape(model)}"\}} (\S+)$',
                      text, re.M)
        found[kind] = float(m.group(1)) if m else 0.0
    return found["sum"], found["count"]


def statuses(port: int) -> dict[str, float]:
    """Answered requests by status (all endpoints) from /metrics."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    out: dict[str, float] = {}
    for m in re.finditer(r'^seqserve_requests_total\{.*status="(\d+)".*\} (\S+)$', text, re.M):
        out[m.group(1)] = out.get(m.group(1), 0.0) + float(m.group(2))
    return out


def loadavg() -> float:
    return float(Path("/proc/loadavg").read_text().split()[0])


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    folder = max((p for p in (a.repo / a.model).iterdir() if p.name.isdigit()),
                 key=lambda p: int(p.name))
    bundle = Bundle(folder)
    work = workloads(langid_rows())[a.workload]
    client = a.client or ("wrk" if wrk_path() else "python")
    workdir = Path("bench_results/overhead")
    workdir.mkdir(parents=True, exist_ok=True)
    data_file = work.data_file(workdir / f"{a.workload}.txt")
    cmd = [a.python, "-m", "seqserve.cli", "serve", *a.serve_arg]
    server = sv.seqserve("seqserve", cmd, a.repo, a.model)
    path = server.path
    port = sv.free_port()
    proc = sv.start(server, port, workdir / "serve.log")
    result: dict[str, Any] = {"command": " ".join(cmd), "client": client,
                              "connections": a.connections, "seconds": a.seconds,
                              "workload": a.workload}
    try:
        ready = sv.wait_ready(proc, port, path, work.text(10**6), 600)
        print(f"server ready in {ready:.1f} s: {' '.join(cmd)}", flush=True)

        def load(start: int, seconds: float) -> Any:
            return run_load(client, Load(f"http://127.0.0.1:{port}", path, work, data_file,
                                         start, seconds, a.connections))

        load(work.capacity // 2, a.warmup)
        pids = roles(proc.pid)
        before = {pid: proc_cpu(pid) for pid in pids}
        b0 = batch_stats(port, a.model)
        load0 = loadavg()
        r = load(0, a.seconds)
        after = {pid: proc_cpu(pid) for pid in pids}
        b1 = batch_stats(port, a.model)
        n = max(r.requests, 1)
        result.update(requests=r.requests, rps=round(r.rps, 1), p99_ms=round(r.p99_ms, 1),
                      errors=r.errors, loadavg=[load0, loadavg()],
                      mean_batch_rows=round((b1[0] - b0[0]) / max(b1[1] - b0[1], 1), 2),
                      processes={})
        print(f"{r.requests} requests in {r.seconds:.1f} s ({r.rps:.0f} req/s, p99 "
              f"{r.p99_ms:.1f} ms, errors {r.errors or 0}), {client} -c{a.connections}, "
              f"load average {load0:.2f}-{loadavg():.2f}, mean batch "
              f"{result['mean_batch_rows']} rows", flush=True)
        total = 0.0
        for pid, role in sorted(pids.items(), key=lambda x: x[1]):
            whole, main_t, system = ((after[pid][i] - before[pid][i]) * 1e3 / n
                                     for i in range(3))
            switches = (after[pid][3] - before[pid][3]) / n
            total += whole
            result["processes"][f"{role}:{pid}"] = {
                "cpu_ms_per_request": round(whole, 4), "main_thread_ms": round(main_t, 4),
                "system_ms": round(system, 4), "context_switches": round(switches, 2)}
            print(f"  {role:10s} pid {pid:6d}: {whole:.3f} CPU ms/request "
                  f"(main thread {main_t:.3f}, other threads {whole - main_t:.3f}; "
                  f"system {system:.3f}; {switches:.1f} context switches)")
        result["total_cpu_ms_per_request"] = round(total, 4)
        result["statuses"] = statuses(port)
        print(f"  answers by status since start (/metrics): {result['statuses']}")
        print(f"  {'all':10s}           {total:.3f} CPU ms/request")
        if a.py_spy is not None:
            profile(a.py_spy, pids, lambda: load(work.capacity // 4, a.seconds))
    finally:
        sv.stop(proc)
    if a.floor_seconds > 0:
        rows = [bundle.encode(work.text(g)) for g in range(2048)]
        floor = measure(str(bundle.onnx), rows, [8, 16, 32], [1], a.floor_seconds)["floor"]
        result["floor"] = floor
        result["mean_tokens"] = round(sum(map(len, rows)) / len(rows), 1)
        print(f"bare ONNX Runtime floor: {floor['cpu_ms']:.3f} CPU ms/sequence "
              f"(batch {floor['batch']} {floor['order']}, 1 thread, {floor['seq_s']:.0f} seq/s; "
              f"{result['mean_tokens']} tokens/text); server minus floor: "
              f"{result['total_cpu_ms_per_request'] - floor['cpu_ms']:.3f} ms/request")
    if a.json is not None:
        a.json.write_text(json.dumps(result, indent=2))
    return 0


def profile(folder: Path, pids: dict[int, str], run: Any, top: int = 30) -> None:
    """py-spy samples of the API and engine processes during one more load run: collapsed
    stacks (`ROLE-PID.txt`, for flamegraph.pl or speedscope) and the frames with the most
    samples (inclusive and self) printed per process."""
    spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    folder.mkdir(parents=True, exist_ok=True)
    spies = {}
    for pid, role in pids.items():
        if role in ("api", "engine"):
            out = folder / f"{role}-{pid}.txt"
            spies[out] = subprocess.Popen(
                [spy, "record", "--nonblocking", "--function", "--format", "raw", "-r", "250",
                 "-o", str(out), "--pid", str(pid)],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(1.0)
    run()
    for s in spies.values():
        s.send_signal(2)
    for out, s in spies.items():
        s.wait(timeout=60)
        summarize(out, top)


def summarize(path: Path, top: int) -> None:
    """The frames of a collapsed-stack file with the most samples, inclusive and self."""
    inclusive: dict[str, int] = {}
    own: dict[str, int] = {}
    total = 0
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack:
            continue
        n = int(count)
        total += n
        frames = stack.split(";")
        for f in set(frames):
            inclusive[f] = inclusive.get(f, 0) + n
        own[frames[-1]] = own.get(frames[-1], 0) + n
    print(f"py-spy {path.name}: {total} samples (idle threads excluded)")
    for title, table in (("inclusive", inclusive), ("self", own)):
        print(f"  {title}:")
        for f, n in sorted(table.items(), key=lambda x: -x[1])[:top]:
            print(f"    {100 * n / max(total, 1):5.1f}%  {f}")


if __name__ == "__main__":
    raise SystemExit(main())
