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
from typing import TypeVar

from export.manifest import Manifest, list_bundles, load_bundle
from models.tokenizer import Tokenizer
from service.errors import ModelNotFound, ModelNotReady
from service.metrics import Metrics
from service.runtimes import load_runtime
from service.runtimes.base import Runtime, RuntimeSpec
from service.scheduling.batcher import BatcherConfig
from service.scheduling.decoding import EngineConfig
from service.scheduling.models import DecodedModel, ModelConfig, ServedModel, build_model
from service.settings import Settings
from service.workers import ROW_WORKERS, ModelWorker, TextLimits, WorkerContext
from service.workers.classifier import ClassifierWorker
from service.workers.tagger import TaggerWorker
from service.workers.translator import TranslatorWorker

log = logging.getLogger("seqserve.repository")

W = TypeVar("W", ClassifierWorker, TaggerWorker, TranslatorWorker)

RuntimeFactory = Callable[[RuntimeSpec, Path, Manifest], Runtime]
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
    model: ServedModel | None = None
    """The scheduled model (runtime + batcher or decoding engine), once built."""
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

    async def load_all(self, only: str | None = None) -> None:
        """Load, start and warm up every version (sequentially: warm-ups compete for CPU), or
        every version of model `only`."""
        found = [b for b in list_bundles(self.settings.repo) if only in (None, b[0])]
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
            model, worker = await asyncio.to_thread(self._build, entry)
            entry.model = model
            await model.start()
        except Exception as exc:  # any failure skips this version only
            entry.state, entry.reason = "failed", f"{type(exc).__name__}: {exc}"
            self.metrics.load_failures.labels(entry.name, str(entry.version)).inc()
            log.error("model %s version %d not served: %s", entry.name, entry.version,
                      entry.reason)
            return
        entry.worker, entry.state = worker, "ready"
        self.metrics.model_ready.labels(entry.name, str(entry.version)).set(1)
        log.info("model %s version %d ready (%s)", entry.name, entry.version, entry.task)

    def _build(self, entry: ModelEntry) -> tuple[ServedModel, ModelWorker]:
        """Verify, open the runtime, schedule it and construct the worker (blocking)."""
        manifest = entry.manifest = load_bundle(entry.path, verify=True)
        s = self.settings
        limits = TextLimits(s.max_texts, s.max_chars,
                            min(s.max_tokens, manifest.limits.get("max_tokens", s.max_tokens)),
                            s.truncate)
        tokenizer = Tokenizer.load(entry.path / manifest.tokenizer.file)
        runtime = self.runtime_factory(s.runtime_spec(), entry.path, manifest)
        model = build_model(entry.name, runtime, manifest, model_config(s, limits.max_tokens),
                            self.metrics.observer(entry.name))
        parts = (entry.name, entry.version, manifest, tokenizer, limits)
        if isinstance(model, DecodedModel):
            return model, TranslatorWorker(WorkerContext(*parts, model))
        return model, ROW_WORKERS[manifest.task](WorkerContext(*parts, model))

    async def stop_all(self, timeout: float) -> bool:
        """Drain every ready worker concurrently within `timeout`; True when all drained."""
        ready = [e for v in self.entries.values() for e in v.values() if e.worker is not None]
        results = await asyncio.gather(*(e.model.stop(timeout) for e in ready if e.model))
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

    def ready(self, name: str, version: int | str | None = None
              ) -> tuple[ModelEntry, ModelWorker]:
        """The ready worker of `name`, any task, or ModelNotFound / ModelNotReady saying why."""
        entry = self.entry(name, version)
        if entry.state != "ready" or entry.worker is None:
            why = f": {entry.reason}" if entry.reason else ""
            raise ModelNotReady(
                f"model {name!r} version {entry.version} is {entry.state}{why}",
                retry_after=self.settings.retry_after_s,
            )
        return entry, entry.worker

    def worker(self, name: str, version: int | str | None, kind: type[W]
               ) -> tuple[ModelEntry, W]:
        """The ready worker of `name` when it is a `kind` (ModelNotFound when it is not)."""
        entry = self.entry(name, version)
        if entry.task is not None and entry.task != kind.task:
            raise ModelNotFound(f"model {name!r} is a {entry.task}, not a {kind.task}")
        entry, worker = self.ready(name, version)
        if not isinstance(worker, kind):
            raise ModelNotFound(f"model {name!r} is a {worker.task}, not a {kind.task}")
        return entry, worker

    def any_ready(self) -> bool:
        return any(e.state == "ready" for v in self.entries.values() for e in v.values())


def _parse_version(version: int | str) -> int | None:
    if isinstance(version, int):
        return version
    return int(version) if version.isdigit() and version.isascii() else None


def model_config(s: Settings, max_tokens: int) -> ModelConfig:
    """How every model is scheduled under settings `s` (texts up to `max_tokens` tokens)."""
    batcher = BatcherConfig(
        max_batch_size=s.max_batch_size, max_batch_tokens=max(s.max_batch_tokens, max_tokens),
        max_wait_s=s.max_wait_ms / 1000.0, queue_size=s.queue_size,
        retry_after_s=s.retry_after_s, overhead_tokens=s.batch_overhead_tokens)
    engine = EngineConfig(
        max_live_hypotheses=s.max_live_hypotheses, max_queue=s.queue_size,
        max_admit=s.max_batch_size, groups=s.decode_groups, retry_after_s=s.retry_after_s)
    return ModelConfig(batcher, engine, max_tokens, s.warmup)
