"""Peers benchmark (issues 12, 24): seqserve, mosec, TorchServe and a per-request FastAPI
server on the same bundle, one after another under the same closed-loop load, on short and
long texts, next to the bare ONNX Runtime ceiling and floor measured in the same run; with
`translate` among the workloads, seqserve's translator next to a per-request FastAPI + ONNX
Runtime beam-search server, TorchServe with a batch handler running beam search per batch
(apps/torchserve_translate.py) and mosec running one batched beam search per batch
(apps/mosec_translate.py; 2 workers, max batch 32, 5 ms), on the same translator bundle.

    python bench/peers/run.py --repo model_repository --duration 20
    python bench/peers/run.py --install-peers          # mosec + TorchServe venv (.peers-venv)
    python bench/peers/run.py --workloads short,long,translate
    python bench/peers/run.py --servers seqserve \
        --seqserve-cmd "new=/work/main/.venv/bin/seqserve serve --api-workers 2"

seqserve runs in its default layout (on a CPU the hybrid one: each API process with its own
models) and in the engine layout (`--layout engine`: one engine process), every peer at
each of its settings (--mosec-settings, --torchserve-settings,
--fastapi-settings, --translate-settings: WORKERSxTHREADS lists) in the same run; the table
shows each peer at its best setting per workload, with CPU per request (user + system time of
all the server's processes over the measured window, from /proc, divided by the requests),
and writes every setting's row to the raw results in bench_results/peers/ (git-ignored).
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.peers import report  # noqa: E402
from bench.peers import servers as sv  # noqa: E402
from bench.peers.apps.common import Bundle, TranslatorBundle  # noqa: E402
from bench.peers.ceiling import measure  # noqa: E402
from bench.peers.load import Load, LoadResult, run_load, wrk_path  # noqa: E402
from bench.peers.texts import (  # noqa: E402
    Workload,
    langid_rows,
    translate_workload,
    workloads,
)

ROOT = Path(__file__).resolve().parents[2]
ALL_SERVERS = ("seqserve", "mosec", "torchserve", "fastapi")
PROBES = 8
"""Texts per workload whose answers must match bare ONNX Runtime before a server is measured."""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--repo", type=Path, default=Path("model_repository"))
    p.add_argument("--model", default="langid")
    p.add_argument("--version", default=None, help="bundle version (default: highest)")
    p.add_argument("--servers", default=",".join(ALL_SERVERS),
                   help=f"comma-separated, from {ALL_SERVERS}")
    p.add_argument("--workloads", default="short,long",
                   help="from short, long (classifier) and translate (translator)")
    p.add_argument("--translate-model", default="numbers-en-fr",
                   help="translator bundle for the translate workload")
    p.add_argument("--seqserve-cmd", action="append", default=None, metavar="[LABEL=]CMD",
                   help="seqserve command line up to the flags the harness adds (--repo, "
                   "--host, --port, --truncate, --log-level); repeat to compare variants. "
                   "Default: this checkout's `python -m seqserve.cli serve`, as "
                   "`defaults` (on a CPU the hybrid layout) and with `--layout engine`")
    p.add_argument("--duration", type=float, default=20.0, help="seconds measured per run")
    p.add_argument("--rounds", type=int, default=1,
                   help="measure every server this many times, order reversed every other "
                   "round; the table shows the median round")
    p.add_argument("--warmup", type=float, default=5.0, help="seconds of load before each run")
    p.add_argument("--connections", type=int, default=64)
    p.add_argument("--client", choices=("wrk", "python"), default="wrk")
    p.add_argument("--wrk-threads", type=int, default=2)
    p.add_argument("--client-check-seconds", type=float, default=5.0,
                   help="seconds per client and workload against the trivial server (0: skip)")
    p.add_argument("--peers-venv", type=Path, default=ROOT / ".peers-venv",
                   help="virtualenv with mosec and TorchServe")
    p.add_argument("--install-peers", action="store_true",
                   help="create --peers-venv with the peers' packages, then exit")
    p.add_argument("--mosec-settings", default="1x1,2x1,1x2",
                   help="mosec WORKERSxTHREADS (ORT intra-op threads per worker) to sweep")
    p.add_argument("--torchserve-settings", default="1x1,2x1",
                   help="TorchServe WORKERSxTHREADS (torch threads per worker) to sweep")
    p.add_argument("--fastapi-settings", default="1x1,2x1",
                   help="per-request FastAPI server: uvicorn WORKERSxTHREADS (ORT threads)")
    p.add_argument("--mosec-translate-settings", default="2x1,1x1",
                   help="mosec beam search per batch (translate) WORKERSxTHREADS to sweep")
    p.add_argument("--translate-settings", default="1x1,2x1",
                   help="per-request FastAPI beam-search server: uvicorn WORKERSxTHREADS")
    p.add_argument("--translate-sample", type=int, default=256,
                   help="texts the in-process reference beam search translates to count "
                   "tokens per request (and its own per-request rate)")
    p.add_argument("--max-batch", type=int, default=32, help="mosec and TorchServe")
    p.add_argument("--max-wait-ms", type=int, default=5, help="mosec and TorchServe")
    p.add_argument("--ceiling-batches", default="1,8,16,32,64")
    p.add_argument("--ceiling-threads", default="1,2")
    p.add_argument("--ceiling-seconds", type=float, default=1.0, help="per ceiling point")
    p.add_argument("--ceiling-texts", type=int, default=2048)
    p.add_argument("--startup-timeout", type=float, default=300.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=ROOT / "bench_results" / "peers")
    return p.parse_args(argv)


def install_peers(venv: Path) -> None:
    """A separate virtualenv for mosec and TorchServe: they never become seqserve's deps."""
    if not (venv / "bin" / "python").is_file():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q"]
    subprocess.run([*pip, "torch==2.13.0"], check=True)  # first: the CPU wheel on local disk
    subprocess.run([*pip, *sv.PEER_PACKAGES], check=True)
    print(f"peers installed in {venv}")


def bundle_dir(repo: Path, model: str, version: str | None) -> Path:
    folder = repo / model
    versions = sorted((int(p.name) for p in folder.iterdir() if p.name.isdigit()),
                      reverse=True) if folder.is_dir() else []
    if not versions:
        raise SystemExit(f"{folder}: no bundle versions")
    chosen = folder / (version or str(versions[0]))
    if not (chosen / "manifest.json").is_file():
        raise SystemExit(f"{chosen}: no manifest.json")
    return chosen.resolve()


def single_model_repo(bundle: Path, model: str, workdir: Path) -> Path:
    """A repository holding only the bundle under test (a link to it), as the peers load."""
    repo = workdir / "repo"
    link = repo / model / bundle.name
    if not link.exists():
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(bundle, target_is_directory=True)
    return repo


def settings(csv: str) -> list[tuple[int, int]]:
    """"1x1,2x1" -> [(workers, threads), ...]."""
    out = []
    for item in (x.strip() for x in csv.split(",")):
        if item:
            workers, _, threads = item.partition("x")
            out.append((int(workers), int(threads or 1)))
    return out


def seqserve_servers(args: argparse.Namespace, bundle: Path, model: str, workdir: Path,
                     task: str) -> list[sv.Server]:
    repo = single_model_repo(bundle, model, workdir / model)
    out = []
    serve = f"{sys.executable} -m seqserve.cli serve"
    for spec in args.seqserve_cmd or [f"defaults={serve}",
                                      f"engine={serve} --layout engine"]:
        label, cmd = spec.split("=", 1) if "=" in spec.split()[0] else ("seqserve", spec)
        out.append(sv.seqserve(label, shlex.split(cmd), repo, model, task))
    return out


def build_servers(args: argparse.Namespace, bundle: Path, workdir: Path) -> list[sv.Server]:
    """The classifier's servers: seqserve and every setting of every peer."""
    wanted = [s.strip() for s in args.servers.split(",") if s.strip()]
    unknown = set(wanted) - set(ALL_SERVERS)
    if unknown:
        raise SystemExit(f"unknown server(s) {sorted(unknown)}; choose from {ALL_SERVERS}")
    venv_bin = args.peers_venv.resolve() / "bin"
    out: list[sv.Server] = []
    for name in wanted:
        if name == "seqserve":
            out += seqserve_servers(args, bundle, args.model, workdir, "classify")
        elif name == "mosec":
            out += [sv.mosec(str(venv_bin / "python"), bundle, args.model, t, w,
                             args.max_batch, args.max_wait_ms)
                    for w, t in settings(args.mosec_settings)]
        elif name == "torchserve":
            out += [sv.torchserve(venv_bin, bundle, args.model, workdir / "torchserve", t, w,
                                  args.max_batch, args.max_wait_ms)
                    for w, t in settings(args.torchserve_settings)]
        else:
            out += [sv.fastapi(sys.executable, bundle, args.model, t, w)
                    for w, t in settings(args.fastapi_settings)]
    return out


def build_translate_servers(args: argparse.Namespace, bundle: Path,
                            workdir: Path) -> list[sv.Server]:
    """The translator's servers: seqserve and the per-request beam-search peer's settings."""
    wanted = {s.strip() for s in args.servers.split(",") if s.strip()}
    out: list[sv.Server] = []
    if "seqserve" in wanted:
        out += seqserve_servers(args, bundle, args.translate_model, workdir, "translate")
    if "fastapi" in wanted:
        out += [sv.fastapi_translate(sys.executable, bundle, args.translate_model, t, w)
                for w, t in settings(args.translate_settings)]
    if "mosec" in wanted:
        python = str(args.peers_venv.resolve() / "bin" / "python")
        out += [sv.mosec_translate(python, bundle, args.translate_model, t, w, args.max_batch,
                                   args.max_wait_ms)
                for w, t in settings(args.mosec_translate_settings)]
    if "torchserve" in wanted:
        venv_bin = args.peers_venv.resolve() / "bin"
        out += [sv.torchserve(venv_bin, bundle, args.translate_model,
                              workdir / "torchserve-translate", t, w, args.max_batch,
                              args.max_wait_ms, task="translate")
                for w, t in settings(args.torchserve_settings)]
    return out


def loadavg() -> float:
    return float(Path("/proc/loadavg").read_text().split()[0])


CLASSIFY = ("short", "long")
"""The classifier's workloads; "translate" runs on the translator."""


class Bench:
    """One run: the texts, the ceiling, the client check, every server in turn."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        names = [w.strip() for w in args.workloads.split(",") if w.strip()]
        unknown = set(names) - {*CLASSIFY, "translate"}
        if unknown:
            raise SystemExit(f"unknown workload(s) {sorted(unknown)}")
        self.classify = [n for n in names if n in CLASSIFY]
        self.bundle = (Bundle(bundle_dir(args.repo, args.model, args.version))
                       if self.classify else None)
        self.translator: TranslatorBundle | None = None
        if "translate" in names:
            self.translator = TranslatorBundle(bundle_dir(args.repo, args.translate_model,
                                                          None))
        stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
        self.workdir = (args.out / f"work-{stamp}").resolve()
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.json_path = args.out / f"peers-{stamp}.json"
        all_loads = workloads(langid_rows(args.seed), args.seed) if self.classify else {}
        if self.translator is not None:
            all_loads["translate"] = translate_workload(args.seed)
        self.workloads: dict[str, Workload] = {n: all_loads[n] for n in names}
        self.data = {n: w.data_file(self.workdir / f"texts-{n}.txt")
                     for n, w in self.workloads.items()}

    def load(self, port: int, path: str, name: str, start: int, seconds: float,
             client: str | None = None) -> LoadResult:
        a = self.args
        spec = Load(f"http://127.0.0.1:{port}", path, self.workloads[name], self.data[name],
                    start, seconds, a.connections, a.wrk_threads)
        return run_load(client or a.client, spec)

    def encode(self, name: str, text: str) -> list[int]:
        if name == "translate":
            assert self.translator is not None
            return self.translator.encode(text)
        assert self.bundle is not None
        return self.bundle.encode(text)

    def rows(self, name: str, start: int, count: int) -> list[list[int]]:
        w = self.workloads[name]
        return [self.encode(name, w.text(g)) for g in range(start, start + count)]

    # ---- the parts of a run -----------------------------------------------------------

    def describe_texts(self) -> dict[str, Any]:
        out = {}
        for name in self.workloads:
            rows = self.rows(name, 0, min(self.args.ceiling_texts, self.workloads[name].capacity))
            lengths = [len(r) for r in rows]
            out[name] = {"mean_tokens": round(sum(lengths) / len(lengths), 1),
                         "min_tokens": min(lengths), "max_tokens": max(lengths),
                         "capacity": self.workloads[name].capacity}
        return out

    def ceiling(self) -> dict[str, Any]:
        a = self.args
        out = {}
        for name in self.classify:
            assert self.bundle is not None
            begin = time.perf_counter()
            texts = [self.workloads[name].text(g) for g in range(a.ceiling_texts)]
            rows = [self.bundle.encode(t) for t in texts]
            tokenize_s = time.perf_counter() - begin
            result = measure(str(self.bundle.onnx), rows, _ints(a.ceiling_batches),
                             _ints(a.ceiling_threads), a.ceiling_seconds)
            result["compose_tokenize_texts_s"] = round(len(texts) / tokenize_s, 1)
            out[name] = result
            best, floor = result["best"], result["floor"]
            print(f"  ceiling {name}: {best['seq_s']:.0f} seq/s (batch {best['batch']}, "
                  f"{best['order']}, {best['threads']} thread(s)); floor "
                  f"{floor['cpu_ms']:.3f} CPU ms/seq (batch {floor['batch']}, "
                  f"{floor['order']}, {floor['threads']} thread(s))", flush=True)
        if self.translator is not None:
            out["translate"] = self.reference_translations()
        return out

    def reference_translations(self) -> dict[str, Any]:
        """The in-process reference beam search (1 ORT thread, one text at a time) over the
        first texts of the measured range: tokens per text (to turn req/s into tokens/s),
        and its own rate and CPU per text, no HTTP."""
        assert self.translator is not None
        w = self.workloads["translate"]
        count = min(self.args.translate_sample, w.capacity)
        begin, cpu0 = time.perf_counter(), time.process_time()
        tokens = [len(self.translator.translate(w.text(g))["token_ids"]) for g in range(count)]
        elapsed, cpu = time.perf_counter() - begin, time.process_time() - cpu0
        result = {"texts": count, "mean_out_tokens": round(sum(tokens) / count, 2),
                  "texts_s": round(count / elapsed, 1),
                  "tokens_s": round(sum(tokens) / elapsed, 1),
                  "cpu_ms": round(cpu * 1e3 / count, 3)}
        print(f"  reference beam search: {result['mean_out_tokens']} tokens per text, "
              f"{result['texts_s']:.0f} texts/s one at a time, {result['cpu_ms']:.2f} CPU "
              "ms/text", flush=True)
        return result

    def client_check(self) -> dict[str, Any]:
        """Each client against the trivial server: the load tool's own ceiling."""
        seconds = self.args.client_check_seconds
        clients = (["wrk"] if wrk_path() else []) + ["python"]
        out: dict[str, Any] = {}
        server = sv.trivial(sys.executable)
        port = sv.free_port()
        proc = sv.start(server, port, self.workdir / "logs" / "trivial.log")
        try:
            sv.wait_ready(proc, port, server.path, "probe", 30)
            for client in clients:
                for name in self.workloads:
                    r = self.load(port, server.path, name, 0, seconds, client)
                    out.setdefault(client, {})[name] = r.as_dict()
                    print(f"  client {client} vs trivial server, {name}: {r.rps:.0f} req/s",
                          flush=True)
        finally:
            sv.stop(proc)
        return out

    def probes(self) -> dict[str, list[tuple[str, str]]]:
        """(text, bare ONNX Runtime answer) per workload, from the end of its numbering: the
        label (classify) or the reference beam search's translation (translate)."""
        out = {}
        if self.classify:
            import onnxruntime as ort

            assert self.bundle is not None
            sess = ort.InferenceSession(str(self.bundle.onnx),
                                        providers=["CPUExecutionProvider"])
        for name, w in self.workloads.items():
            pairs = []
            for g in range(w.capacity - PROBES, w.capacity):
                if name == "translate":
                    assert self.translator is not None
                    pairs.append((w.text(g), self.translator.translate(w.text(g))["translation"]))
                    continue
                assert self.bundle is not None
                ids, lengths = self.bundle.pad([self.bundle.encode(w.text(g))])
                logits, _ = sess.run(None, {"input_ids": ids, "lengths": lengths})
                pairs.append((w.text(g), self.bundle.results(logits)[0]["label"]))
            out[name] = pairs
        return out

    def measure_server(self, server: sv.Server, probes: dict[str, list[tuple[str, str]]],
                       names: list[str]) -> dict[str, Any]:
        a = self.args
        result: dict[str, Any] = {"name": server.name, "peer": server.peer,
                                  "setting": server.setting, "config": server.config}
        if server.unavailable:
            result["skipped"] = server.unavailable
            print(f"  {server.name}: skipped: {server.unavailable}", flush=True)
            return result
        port = sv.free_port()
        safe = "".join(c if c.isalnum() else "-" for c in server.name)
        log = self.workdir / "logs" / f"{safe}.log"
        mine = {n: probes[n] for n in names}
        first = next(iter(mine.values()))[0][0]
        proc = sv.start(server, port, log)
        try:
            result["ready_s"] = round(sv.wait_ready(proc, port, server.path, first,
                                                    a.startup_timeout), 1)
            result["answers"] = check_answers(port, server.path, mine)
            bad = [m for m in result["answers"]["mismatches"]]
            if bad:
                result["skipped"] = f"wrong answers: {bad[:3]}"
                print(f"  {server.name}: {result['skipped']}", flush=True)
                return result
            result["processes"] = sv.session_pids(proc.pid)
            for name in names:
                w = self.workloads[name]
                if a.warmup > 0:
                    self.load(port, server.path, name, w.capacity // 2, a.warmup)
                load_start = loadavg()
                cpu0 = sv.session_cpu_s(proc.pid)
                r = self.load(port, server.path, name, 0, a.duration)
                cpu_s = sv.session_cpu_s(proc.pid) - cpu0
                result[name] = {**r.as_dict(), "loadavg_start": load_start,
                                "loadavg_end": loadavg(), "cpu_s": round(cpu_s, 2),
                                "cpu_ms_per_request": round(cpu_s * 1e3 / max(r.requests, 1),
                                                            4)}
                if r.requests > w.capacity // 2:
                    result[name]["note"] = "more requests than distinct texts in the range"
                print(f"  {server.name}, {name}: {r.rps:.0f} req/s, p50 {r.p50_ms:.1f} ms, "
                      f"p99 {r.p99_ms:.1f} ms, CPU {result[name]['cpu_ms_per_request']:.3f} "
                      f"ms/request, errors {r.errors or 0}", flush=True)
        except RuntimeError as exc:
            result["skipped"] = f"{exc} (log: {log})"
            print(f"  {server.name}: failed: {result['skipped']}\n{_tail(log)}", flush=True)
        finally:
            sv.stop(proc)
        return result

    def run(self) -> dict[str, Any]:
        a = self.args
        started = datetime.now(UTC)
        folders = {n: str(b.folder) for n, b in (("classify", self.bundle),
                                                   ("translate", self.translator)) if b}
        res: dict[str, Any] = {
            "started": started.isoformat(timespec="seconds"), "loadavg_start": loadavg(),
            "bundle": folders.get("classify", ""), "bundles": folders, "model": a.model,
            "translate_model": a.translate_model, "client": a.client,
            "connections": a.connections, "duration_s": a.duration, "warmup_s": a.warmup,
            "rounds": a.rounds,
            "cores": _cores(), "args": {k: str(v) for k, v in vars(a).items()},
        }
        print(f"peers benchmark: {', '.join(folders.values())}, {a.connections} connections, "
              f"{a.duration:g} s per server and workload, client {a.client}", flush=True)
        res["texts"] = self.describe_texts()
        if a.client_check_seconds > 0:
            res["client_ceiling"] = self.client_check()
        res["ceiling"] = self.ceiling()
        probes = self.probes()
        plan: list[tuple[sv.Server, list[str]]] = []
        if self.bundle is not None:
            plan += [(s, self.classify) for s in build_servers(a, self.bundle.folder,
                                                                self.workdir)]
        if self.translator is not None:
            plan += [(s, ["translate"]) for s in build_translate_servers(
                a, self.translator.folder, self.workdir)]
        keys = [_key(s, names) for s, names in plan]
        rounds: list[dict[str, Any]] = []
        for i in range(a.rounds):
            order = list(zip(keys, plan, strict=True))
            if i % 2:
                order.reverse()  # noise hits each side alike
            if a.rounds > 1:
                print(f"  round {i + 1}/{a.rounds}", flush=True)
            rounds.append({k: self.measure_server(s, probes, names) for k, (s, names) in order})
        res["rounds"] = rounds
        res["servers"] = [median_result([r[k] for r in rounds], names)
                          for k, (_, names) in zip(keys, plan, strict=True)]
        res["loadavg_end"] = loadavg()
        res["finished"] = datetime.now(UTC).isoformat(timespec="seconds")
        return res


def _key(server: sv.Server, names: list[str]) -> str:
    """A server's key in a round: its name, and the workloads it serves."""
    return f"{server.name} [{','.join(names)}]"


def median_result(runs: list[dict[str, Any]], names: list[str]) -> dict[str, Any]:
    """One server over the rounds: per workload the round with the median req/s (the lower
    one of an even count), with every round's req/s in "rps_rounds"."""
    out = {k: v for k, v in runs[0].items() if k not in names and k != "skipped"}
    out["workloads"] = names
    measured = [r for r in runs if "skipped" not in r]
    if not measured:
        return {**out, "skipped": runs[0]["skipped"]}
    for name in names:
        per = sorted((r[name] for r in measured if name in r), key=lambda x: x["rps"])
        if per:
            out[name] = {**per[(len(per) - 1) // 2],
                         "rps_rounds": [r[name]["rps"] for r in measured if name in r]}
    if len(measured) < len(runs):
        out["failed_rounds"] = [r["skipped"] for r in runs if "skipped" in r]
    return out


def check_answers(port: int, path: str,
                  probes: dict[str, list[tuple[str, str]]]) -> dict[str, Any]:
    """Each probe text's answer from the server against bare ONNX Runtime's."""
    mismatches, total = [], 0
    for name, pairs in probes.items():
        answer = sv.translation_of if name == "translate" else sv.label_of
        for text, expected in pairs:
            status, body = sv.post(port, path, text)
            got = answer(body) if status == 200 else f"HTTP {status}"
            total += 1
            if got != expected:
                mismatches.append({"workload": name, "text": text[:60], "expected": expected,
                                   "got": got})
    return {"checked": total, "matched": total - len(mismatches), "mismatches": mismatches}


def _ints(csv: str) -> list[int]:
    return [int(x) for x in csv.split(",") if x.strip()]


def _cores() -> int:
    import os

    return len(os.sched_getaffinity(0))


def _tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.install_peers:
        install_peers(args.peers_venv)
        return 0
    if args.client == "wrk" and wrk_path() is None:
        raise SystemExit("wrk is not installed (apt-get install wrk), or pass --client python")
    bench = Bench(args)
    res = bench.run()
    bench.json_path.parent.mkdir(parents=True, exist_ok=True)
    bench.json_path.write_text(json.dumps(res, indent=2, ensure_ascii=False) + "\n")
    print()
    print(report.render(res))
    print(f"\nraw results: {bench.json_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
