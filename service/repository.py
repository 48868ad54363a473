"""Model repository: every bundle and version of `settings.repo`, each with a state.

Loading verifies the manifest hashes, opens the runtime, builds the task's worker and warms it
up. A version that fails any step is recorded as "failed" with the reason (log, metrics,
/v1/models) and skipped; the others serve. The highest ready version is the default.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from export.manifest import Manifest, list_bundles, load_bundle
from models.tokenizer import Tokenizer
from service.errors import ModelNotFound, ModelNotReady
from service.metrics import Metrics
from service.runtimes import load_runtime
from service.runtimes.base import Runtime
from service.settings import Settings
from service.workers import ModelWorker, WorkerContext, worker_class

log = logging.getLogger("seqserve.repository")

RuntimeFactory = Callable[[Settings, Path, Manifest], Runtime]
"""Builds a bundle's runtime (tests inject fakes); default `service.runtimes.load_runtime`."""


@dataclass
class ModelEntry:
    """One model version and where it stands."""

    name: str
    version: int
    path: Path
    state: str = "loading"
    """"loading" | "ready" | "failed" | "stopped"."""
    reason: str | None = None
    manifest: Manifest | None = None
    worker: ModelWorker | None = None

    @property
    def task(self) -> str | None:
        return self.manifest.task if self.manifest else None


class ModelRepository:
    """All model versions of one app."""

    def __init__(
        self, settings: Settings, metrics: Metrics, runtime_factory: RuntimeFactory | None = None
    ) -> None:
        self.settings = settings
        self.metrics = metrics
        self.runtime_factory = runtime_factory or load_runtime
        self.entries: dict[str, dict[int, ModelEntry]] = {}

    async def load_all(self) -> None:
        """Load, start and warm up every version (sequentially: warm-ups compete for CPU)."""
        found = list_bundles(self.settings.repo)
        if not found:
            log.warning("no bundles found under %s", self.settings.repo)
        for name, version, path in found:
            entry = ModelEntry(name, version, path)
            self.entries.setdefault(name, {})[version] = entry
            self.metrics.model_ready.labels(name, str(version)).set(0)
        for name, version, _ in found:
            await self._load(self.entries[name][version])

    async def _load(self, entry: ModelEntry) -> None:
        try:
            worker = await asyncio.to_thread(self._build, entry)
            await worker.start()
        except Exception as exc:  # any failure skips this version only
            entry.state, entry.reason = "failed", f"{type(exc).__name__}: {exc}"
            self.metrics.load_failures.labels(entry.name, str(entry.version)).inc()
            log.error("model %s version %d not served: %s", entry.name, entry.version,
                      entry.reason)
            return
        entry.worker, entry.state = worker, "ready"
        self.metrics.model_ready.labels(entry.name, str(entry.version)).set(1)
        log.info("model %s version %d ready (%s)", entry.name, entry.version, entry.task)

    def _build(self, entry: ModelEntry) -> ModelWorker:
        """Verify, open the runtime and construct the worker (blocking; runs in a thread)."""
        manifest = entry.manifest = load_bundle(entry.path, verify=True)
        cls = worker_class(manifest.task)
        tokenizer = Tokenizer.load(entry.path / manifest.tokenizer.file)
        runtime = self.runtime_factory(self.settings, entry.path, manifest)
        ctx = WorkerContext(
            name=entry.name, version=entry.version, path=entry.path, manifest=manifest,
            runtime=runtime, tokenizer=tokenizer, settings=self.settings, metrics=self.metrics,
        )
        return cls(ctx)

    async def stop_all(self, timeout: float) -> bool:
        """Drain every ready worker concurrently within `timeout`; True when all drained."""
        ready = [e for v in self.entries.values() for e in v.values() if e.worker is not None]
        results = await asyncio.gather(*(e.worker.stop(timeout) for e in ready if e.worker))
        for e in ready:
            e.state = "stopped"
            self.metrics.model_ready.labels(e.name, str(e.version)).set(0)
        return all(results)

    # -- lookup ------------------------------------------------------------------------

    def versions(self, name: str) -> dict[int, ModelEntry]:
        found = self.entries.get(name)
        if not found:
            raise ModelNotFound(f"model {name!r} not found")
        return found

    def default_version(self, name: str) -> int | None:
        ready = [v for v, e in self.versions(name).items() if e.state == "ready"]
        return max(ready, default=None)

    def entry(self, name: str, version: int | str | None = None) -> ModelEntry:
        """The entry for `name` (default version when `version` is None), any state."""
        versions = self.versions(name)
        if version is None:
            chosen = self.default_version(name)
            if chosen is None:
                chosen = max(versions)
            return versions[chosen]
        v = _parse_version(version)
        if v is None or v not in versions:
            raise ModelNotFound(f"model {name!r} has no version {version!r}")
        return versions[v]

    def worker(self, name: str, version: int | str | None = None, task: str | None = None
               ) -> tuple[ModelEntry, ModelWorker]:
        """A ready worker, or ModelNotFound / ModelNotReady saying why not."""
        entry = self.entry(name, version)
        if task is not None and entry.task not in (None, task):
            raise ModelNotFound(f"model {name!r} is a {entry.task}, not a {task}")
        if entry.state != "ready" or entry.worker is None:
            why = f": {entry.reason}" if entry.reason else ""
            raise ModelNotReady(
                f"model {name!r} version {entry.version} is {entry.state}{why}",
                retry_after=self.settings.retry_after_s,
            )
        return entry, entry.worker

    def any_ready(self) -> bool:
        return any(e.state == "ready" for v in self.entries.values() for e in v.values())


def _parse_version(version: int | str) -> int | None:
    if isinstance(version, int):
        return version
    return int(version) if version.isdigit() and version.isascii() else None
