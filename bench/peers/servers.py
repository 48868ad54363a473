"""The servers under test: how each is launched, on which path it answers, and its lifecycle.

Every server is a separate process group on 127.0.0.1, started, checked, measured and
stopped before the next one starts, so no two share the cores.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
SERVERS = HERE / "apps"
PEER_PACKAGES = ("torch==2.13.0", "mosec==0.9.8", "torchserve==0.12.0",
                 "torch-model-archiver==0.12.0", "pyyaml", "onnxruntime", "sentencepiece", "numpy")
"""What --install-peers puts in the peers' virtualenv (torch pinned: its CPU wheel is local)."""


@dataclass(frozen=True)
class Launch:
    cmd: list[str]
    env: dict[str, str] = field(default_factory=dict)
    cwd: Path = HERE


@dataclass(frozen=True)
class Server:
    """One server under test."""

    name: str
    path: str
    """POST path of classify; the body is {"texts": [text]} for every server."""
    config: str
    """One line: how it is set up (printed with the results)."""
    launch: Callable[[int], Launch]
    """Port -> command line."""
    unavailable: str | None = None
    """Why it cannot run on this machine (then it is reported, not measured)."""
    peer: str = ""
    """The peer this is one setting of ("mosec", ...; "" for seqserve): the table shows each
    peer at its best setting per workload."""
    setting: str = ""
    """The swept knobs of this setting, short ("2 workers x 1 thread")."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# ---- the four kinds of server -------------------------------------------------------------


def seqserve(label: str, cmd: list[str], repo: Path, model: str,
             task: str = "classify") -> Server:
    """`seqserve serve` from `cmd` (e.g. this checkout's `python -m seqserve.cli serve`, or
    another checkout's venv with new flags), with the repository, port and --truncate added."""
    def launch(port: int) -> Launch:
        return Launch([*cmd, "--repo", str(repo), "--host", "127.0.0.1", "--port", str(port),
                       "--truncate", "--log-level", "warning"], cwd=Path.cwd())

    return Server(label, f"/v1/models/{model}/{task}", " ".join(cmd) + " --truncate", launch)


def fastapi(python: str, bundle: Path, model: str, threads: int, workers: int = 1) -> Server:
    def launch(port: int) -> Launch:
        return Launch([python, str(SERVERS / "fastapi_server.py"), str(port)],
                      {"PEER_BUNDLE": str(bundle), "PEER_THREADS": str(threads),
                       "PEER_WORKERS": str(workers), "PYTHONPATH": str(SERVERS)})

    setting = _setting(workers, threads)
    return Server(f"fastapi per request ({setting})", f"/v1/models/{model}/classify",
                  f"uvicorn {workers} process(es), sync route (thread pool), no batching, ORT "
                  f"{threads} thread(s) per call", launch, peer="fastapi per request",
                  setting=setting)


def fastapi_translate(python: str, bundle: Path, model: str, threads: int,
                      workers: int = 1) -> Server:
    """Per-request FastAPI + ONNX Runtime beam search (translate_server.py)."""
    def launch(port: int) -> Launch:
        return Launch([python, str(SERVERS / "translate_server.py"), str(port)],
                      {"PEER_BUNDLE": str(bundle), "PEER_THREADS": str(threads),
                       "PEER_WORKERS": str(workers), "PYTHONPATH": str(SERVERS)})

    setting = _setting(workers, threads)
    return Server(f"fastapi beam search per request ({setting})",
                  f"/v1/models/{model}/translate",
                  f"uvicorn {workers} process(es), sync route, one beam search (beam 5) per "
                  f"request, decoder batched over the beam, ORT {threads} thread(s)", launch,
                  peer="fastapi beam search per request", setting=setting)


def _setting(workers: int, threads: int) -> str:
    return f"{workers} worker{'s' if workers != 1 else ''} x {threads} thread" + (
        "s" if threads != 1 else "")


def mosec(python: str, bundle: Path, model: str, threads: int, workers: int, max_batch: int,
          wait_ms: int) -> Server:
    def launch(port: int) -> Launch:
        return Launch([python, str(SERVERS / "mosec_server.py"), "--port", str(port),
                       "--address", "127.0.0.1", "--log-level", "warning", "--timeout", "30000"],
                      {"PEER_BUNDLE": str(bundle), "PEER_MODEL": model,
                       "PEER_THREADS": str(threads), "PEER_WORKERS": str(workers),
                       "PEER_MAX_BATCH": str(max_batch), "PEER_WAIT_MS": str(wait_ms)})

    setting = _setting(workers, threads)
    return Server(f"mosec ({setting})", f"/v1/models/{model}/classify",
                  f"mosec {_version(python, 'mosec')}, {workers} worker(s), batch {max_batch}, "
                  f"{wait_ms} ms, ORT {threads} thread(s)", launch,
                  _missing(python, "mosec"), peer="mosec", setting=setting)


def mosec_translate(python: str, bundle: Path, model: str, threads: int, workers: int,
                    max_batch: int, wait_ms: int) -> Server:
    """mosec with one batched beam search per batch on the translator's two ONNX graphs
    (apps/mosec_translate.py)."""
    def launch(port: int) -> Launch:
        return Launch([python, str(SERVERS / "mosec_translate.py"), "--port", str(port),
                       "--address", "127.0.0.1", "--log-level", "warning", "--timeout", "30000"],
                      {"PEER_BUNDLE": str(bundle), "PEER_MODEL": model,
                       "PEER_THREADS": str(threads), "PEER_WORKERS": str(workers),
                       "PEER_MAX_BATCH": str(max_batch), "PEER_WAIT_MS": str(wait_ms)})

    setting = _setting(workers, threads)
    return Server(f"mosec beam search per batch ({setting})", f"/v1/models/{model}/translate",
                  f"mosec {_version(python, 'mosec')}, {workers} worker(s), batch {max_batch}, "
                  f"{wait_ms} ms, beam search per batch (beam 5), ORT {threads} thread(s)",
                  launch, _missing(python, "mosec"), peer="mosec beam search per batch",
                  setting=setting)


def torchserve(venv_bin: Path, bundle: Path, model: str, workdir: Path, threads: int,
               workers: int, max_batch: int, wait_ms: int, task: str = "classify") -> Server:
    """TorchServe with a batch handler: the classifier's TorchScript twin (task "classify"),
    or a batched beam search on the translator's ONNX graphs (task "translate")."""
    python = str(venv_bin / "python")
    why = _missing(python, "ts") or _missing(python, "model_archiver")
    if why is None and shutil.which("java") is None:
        why = "TorchServe needs java (Java 17) on PATH"

    def launch(port: int) -> Launch:
        store = workdir / "model_store"
        mar = store / f"{model}.mar"
        if not mar.is_file():
            _archive(venv_bin, bundle, model, store, task)
        cfg = workdir / "config.properties"
        models = {model: {"1.0": {"defaultVersion": True, "marName": mar.name,
                                  "minWorkers": workers, "maxWorkers": workers,
                                  "batchSize": max_batch, "maxBatchDelay": wait_ms,
                                  "responseTimeout": 120}}}
        cfg.write_text("\n".join([
            f"inference_address=http://127.0.0.1:{port}",
            f"management_address=http://127.0.0.1:{free_port()}",
            f"metrics_address=http://127.0.0.1:{free_port()}",
            f"model_store={store}", f"load_models={mar.name}",
            "models=" + json.dumps(models), "job_queue_size=1000",
            "disable_system_metrics=true", "install_py_dep_per_model=false", ""]))
        return Launch([str(venv_bin / "torchserve"), "--start", "--foreground", "--ncs",
                       "--disable-token-auth", "--model-store", str(store),
                       "--ts-config", str(cfg)],
                      {"PEER_THREADS": str(threads), "LOG_LOCATION": str(workdir / "logs"),
                       "METRICS_LOCATION": str(workdir / "logs"),
                       "PATH": f"{venv_bin}:{os.environ.get('PATH', '')}"}, cwd=workdir)

    setting = _setting(workers, threads)
    runtime = "TorchScript" if task == "classify" else "beam search per batch, ORT"
    label = "torchserve" if task == "classify" else "torchserve beam search per batch"
    return Server(f"{label} ({setting})", f"/predictions/{model}",
                  f"TorchServe {_version(python, 'ts')}, {workers} worker(s), batch {max_batch}, "
                  f"{wait_ms} ms, {runtime} {threads} thread(s)", launch, why,
                  peer=label, setting=setting)


def trivial(python: str, record: Path | None = None) -> Server:
    """No model: a fixed answer per request, for the load tool's own ceiling."""
    def launch(port: int) -> Launch:
        return Launch([python, str(SERVERS / "trivial_server.py"), str(port),
                       *(["--record", str(record)] if record else [])])

    return Server("trivial", "/v1/models/trivial/classify", "asyncio, fixed answer", launch)


def _archive(venv_bin: Path, bundle: Path, model: str, store: Path,
             task: str = "classify") -> None:
    store.mkdir(parents=True, exist_ok=True)
    manifest = json.loads((bundle / "manifest.json").read_text())
    tokenizers = {manifest["tokenizer"]["file"],
                  (manifest.get("target_tokenizer") or manifest["tokenizer"])["file"]}
    extra = [SERVERS / "common.py", bundle / "manifest.json",
             *(bundle / name for name in sorted(tokenizers))]
    if task == "classify":
        serialized, handler = bundle / "classifier.pt", "torchserve_handler.py"
    else:  # the translator's graphs, flat in the archive as the manifest names them
        graphs = manifest["graphs"]
        serialized, handler = bundle / graphs["encoder"]["onnx"], "torchserve_translate.py"
        extra.append(bundle / graphs["decoder_step"]["onnx"])
    subprocess.run([str(venv_bin / "torch-model-archiver"), "--model-name", model,
                    "--version", "1.0", "--serialized-file", str(serialized),
                    "--handler", str(SERVERS / handler),
                    "--extra-files", ",".join(map(str, extra)), "--export-path", str(store),
                    "--force"], check=True, capture_output=True)


def _missing(python: str, module: str) -> str | None:
    if not Path(python).is_file() and shutil.which(python) is None:
        return f"{python} not found (create it with run.py --install-peers)"
    ok = subprocess.run([python, "-c", f"import {module}"], capture_output=True).returncode == 0
    return None if ok else f"`import {module}` fails in {python} (run.py --install-peers)"


def _version(python: str, module: str) -> str:
    if _missing(python, module):
        return "(not installed)"
    dist = {"ts": "torchserve"}.get(module, module)
    code = f"import importlib.metadata as m; print(m.version({dist!r}))"
    out = subprocess.run([python, "-c", code], capture_output=True, text=True)
    return out.stdout.strip() if out.returncode == 0 else "?"


# ---- CPU time of a server's processes ------------------------------------------------------

_TICK = os.sysconf("SC_CLK_TCK")


def _session(sid: int) -> Iterator[tuple[Path, list[bytes]]]:
    """(/proc folder, stat fields from field 3 (state) on) of every live process in `sid`."""
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            raw = Path(entry.path, "stat").read_bytes()
        except OSError:  # exited meanwhile
            continue
        fields = raw[raw.rindex(b")") + 2:].split()
        if int(fields[3]) == sid:
            yield Path(entry.path), fields


def session_cpu_s(sid: int) -> float:
    """CPU seconds (user + system, with reaped children's) of every live process in session
    `sid`: a server started by `start` leads its own session, so this is all its processes
    (API, engine, workers, a JVM and its Python workers), whatever their parents."""
    total = sum(sum(int(x) for x in fields[11:15])  # utime, stime, cutime, cstime
                for _, fields in _session(sid))
    return total / _TICK


def session_thread_cpu_s(sid: int) -> dict[tuple[int, int], float]:
    """CPU seconds (user + system) of every thread of every live process in session `sid`,
    by (pid, thread id): a process's main thread has its pid as its thread id."""
    return {key: seconds for key, (_, seconds) in session_threads(sid).items()}


def session_threads(sid: int) -> dict[tuple[int, int], tuple[str, float]]:
    """`session_thread_cpu_s` with each thread's name (its `comm`, as `ps -L` shows it)."""
    out = {}
    for folder, _ in _session(sid):
        for task in (folder / "task").iterdir():
            try:
                raw = (task / "stat").read_bytes()
            except OSError:
                continue
            name = raw[raw.index(b"(") + 1:raw.rindex(b")")].decode(errors="replace")
            fields = raw[raw.rindex(b")") + 2:].split()
            out[int(folder.name), int(task.name)] = \
                name, (int(fields[11]) + int(fields[12])) / _TICK
    return out


def session_pids(sid: int) -> int:
    """How many live processes session `sid` has."""
    return sum(1 for _ in _session(sid))


# ---- lifecycle ----------------------------------------------------------------------------


def start(server: Server, port: int, log: Path) -> subprocess.Popen[bytes]:
    """Start the server in its own process group, output to `log`."""
    spec = server.launch(port)
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("wb") as out:
        return subprocess.Popen(spec.cmd, cwd=spec.cwd, env={**os.environ, **spec.env},
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


def stop(proc: subprocess.Popen[bytes], grace_s: float = 30.0) -> None:
    """SIGTERM the server's process group, SIGKILL what is left after `grace_s`."""
    for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            continue
        _reap_group(proc.pid)
        return


def _reap_group(pgid: int) -> None:
    """The leader exited; give its children (workers) a moment, then kill what stayed."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.2)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)


def post(port: int, path: str, text: str, timeout: float = 30.0) -> tuple[int, Any]:
    """POST {"texts": [text]}; (status, parsed JSON body or None)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("POST", path, json.dumps({"texts": [text]}),
                     {"Content-Type": "application/json"})
        resp = conn.getresponse()
        raw = resp.read()
    finally:
        conn.close()
    try:
        return resp.status, json.loads(raw)
    except ValueError:
        return resp.status, None


def wait_ready(proc: subprocess.Popen[bytes], port: int, path: str, probe: str,
               timeout_s: float) -> float:
    """Seconds until a classify request answers 200; raises if the process exits first."""
    begin = time.monotonic()
    while time.monotonic() - begin < timeout_s:
        if proc.poll() is not None:
            raise RuntimeError(f"exited with code {proc.returncode} before it was ready")
        try:
            if post(port, path, probe, timeout=10)[0] == 200:
                return time.monotonic() - begin
        except (OSError, http.client.HTTPException):
            pass
        time.sleep(0.25)
    raise RuntimeError(f"not ready after {timeout_s:.0f} s")


def translation_of(body: Any) -> str | None:
    """The first result's translation of a translate answer, or None when the shape is wrong."""
    try:
        return str(body["results"][0]["translation"])
    except (KeyError, IndexError, TypeError):
        return None


def label_of(body: Any) -> str | None:
    """The first result's label of a classify answer, or None when the shape is wrong."""
    try:
        return str(body["results"][0]["label"])
    except (KeyError, IndexError, TypeError):
        return None
