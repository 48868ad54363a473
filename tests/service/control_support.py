"""Model-control tests' helpers: publish and remove versions as an operator would, bundles
broken in each way, and clients that keep requests going while the table changes."""

from __future__ import annotations

import hashlib
import json
import shutil
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from seqserve.export.manifest import manifest_checksum

CLF, MT = "tiny-clf", "tiny-mt"


def publish(repo: Path, model: str, source: int, version: int) -> Path:
    """A copy of `model/source` published as `model/version` the atomic way: written whole
    under a hidden name, then renamed into place."""
    tmp = repo / model / f".tmp-{version}"
    shutil.copytree(repo / model / str(source), tmp)
    final = repo / model / str(version)
    tmp.rename(final)
    return final


def remove(repo: Path, model: str, version: int) -> None:
    """Take a version folder away at once (renamed out of sight, then deleted)."""
    gone = repo / model / f".gone-{version}"
    (repo / model / str(version)).rename(gone)
    shutil.rmtree(gone)


def rewrite_manifest(folder: Path, **changes: Any) -> None:
    """Change manifest fields and keep its own checksum valid (a bundle that verifies)."""
    path = folder / "manifest.json"
    data = json.loads(path.read_text())
    data.update(changes)
    data["manifest_sha256"] = manifest_checksum(data)
    path.write_text(json.dumps(data, indent=2))


def break_graph(folder: Path, graph: str) -> None:
    """A graph file that is not an ONNX model, with its hash right: it verifies, then fails
    to load."""
    path = folder / graph
    path.write_bytes(b"this is not an onnx graph" * 10)
    data = json.loads((folder / "manifest.json").read_text())
    files = dict(data["files"])
    files[graph] = hashlib.sha256(path.read_bytes()).hexdigest()
    rewrite_manifest(folder, files=files)


def version_of(client: httpx.Client, model: str) -> int | None:
    """The default version `/v1/models/{model}` reports (None: no such model)."""
    r = client.get(f"/v1/models/{model}")
    return r.json()["default_version"] if r.status_code == 200 else None


def wait_for(check: Any, timeout: float = 60.0, every: float = 0.1) -> float:
    """Poll `check()` until true; the seconds it took (AssertionError past `timeout`)."""
    start = time.monotonic()
    while not check():
        if time.monotonic() - start > timeout:
            raise AssertionError(f"not true within {timeout} s: {check}")
        time.sleep(every)
    return time.monotonic() - start


REQUESTS: dict[str, tuple[str, dict[str, Any]]] = {
    CLF: ("classify", {"texts": ["one two three", "vingt et un"]}),
    MT: ("translate", {"texts": ["twenty one"], "beam_size": 2}),
}


@dataclass
class Traffic:
    """Client threads that keep sending requests (each of `models`, unpinned) until stopped:
    every status, and per model the (time, version) of each 200."""

    url: str
    models: tuple[str, ...] = (CLF, MT)
    threads_per_model: int = 1
    headers: dict[str, str] = field(default_factory=dict)
    statuses: dict[int, int] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    versions: dict[str, list[tuple[float, int]]] = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __enter__(self) -> Traffic:
        for model in self.models:
            self.versions[model] = []
            for _ in range(self.threads_per_model):
                t = threading.Thread(target=self._run, args=(model,), daemon=True)
                t.start()
                self._threads.append(t)
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(30)

    def _run(self, model: str) -> None:
        verb, body = REQUESTS[model]
        with httpx.Client(base_url=self.url, timeout=30, headers=self.headers) as c:
            while not self._stop.is_set():
                try:
                    r = c.post(f"/v1/models/{model}/{verb}", json=body)
                except httpx.HTTPError as exc:  # a reset or a refused connection
                    with self._lock:
                        self.errors.append(f"{type(exc).__name__}: {exc}")
                    continue
                with self._lock:
                    self.statuses[r.status_code] = self.statuses.get(r.status_code, 0) + 1
                    if r.status_code == 200:
                        self.versions[model].append((time.monotonic(), r.json()["version"]))
                    else:
                        self.errors.append(f"{r.status_code}: {r.text[:300]}")

    def total(self) -> int:
        return sum(self.statuses.values())

    def latest(self, model: str) -> int | None:
        with self._lock:
            found = self.versions[model]
            return found[-1][1] if found else None

    def first(self, model: str, version: int) -> float | None:
        """When `model` first answered with `version` (time.monotonic())."""
        with self._lock:
            return next((t for t, v in self.versions[model] if v == version), None)

    def after(self, model: str, since: float) -> set[int]:
        """The versions `model` answered with since `since`."""
        with self._lock:
            return {v for t, v in self.versions[model] if t >= since}
