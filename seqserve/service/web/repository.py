"""Model repository: every bundle and version of `settings.repo`, each with a state.

Each bundle is loaded and verified once, by whoever runs its model: in this process
(`engine.loading.build_served`: manifest hashes, runtime, batcher or decode scheduler, warm-up)
or by the engine process (all of them; in the hybrid layout those that keep sessions), which
hands this process the verified manifest and limits of each version in its `Hello` answer;
then only the tokenizer file is read here (no hashing) and the
task's worker built. A version that fails any step is recorded as "failed"
with the reason (log, metrics, /v1/models) and skipped; the others serve. The highest ready
version is the default.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypeVar

from seqserve.export.manifest import Manifest, TokenizerSpec, list_bundles
from seqserve.models.text.tokenizer_files import TextTokenizer, load_tokenizer
from seqserve.service.core.errors import ModelNotFound, ModelNotReady
from seqserve.service.core.metrics import Metrics
from seqserve.service.core.process import observed
from seqserve.service.engine.client import (
    EngineClient,
    RemoteDecodeModel,
    RemoteLMModel,
    RemoteRowModel,
    RemoteSeriesModel,
)
from seqserve.service.engine.loading import RuntimeFactory, build_served
from seqserve.service.engine.protocol import ModelState
from seqserve.service.scheduling.lm import LMModel
from seqserve.service.scheduling.models import DecodedModel, ServedModel
from seqserve.service.web.settings import Settings
from seqserve.service.workers import ROW_WORKERS, ModelWorker, TextLimits, WorkerContext
from seqserve.service.workers.classifier import ClassifierWorker
from seqserve.service.workers.lm import LMWorker
from seqserve.service.workers.series import SERIES_WORKERS, SeriesContext, SeriesLimits
from seqserve.service.workers.tagger import TaggerWorker
from seqserve.service.workers.translator import TranslatorWorker

log = logging.getLogger("seqserve.repository")

W = TypeVar("W", ClassifierWorker, TaggerWorker, TranslatorWorker, LMWorker)

Model = ServedModel | RemoteRowModel | RemoteDecodeModel | RemoteLMModel | RemoteSeriesModel
"""A model in this process, or one in the engine process."""


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
    model: Model | None = None
    """The scheduled model (here, or a remote one in the engine process), once built."""
    worker: ModelWorker | None = None
    scheduling: dict[str, Any] | None = None
    """Its effective scheduling config (`ModelConfig` as plain data), once built."""
    runs_in: Literal["engine", "api"] | None = None
    """Where its model runs once opened: the engine process, or each API process (this one)."""

    @property
    def task(self) -> str | None:
        return self.manifest.task if self.manifest else None


class ModelRepository:
    """All model versions of one app: loaded here, or served by an engine process."""

    def __init__(self, settings: Settings, metrics: Metrics,
                 runtime_factory: RuntimeFactory | None = None,
                 engine: EngineClient | None = None) -> None:
        self.settings = settings
        self.metrics = metrics
        self.runtime_factory = runtime_factory
        self.engine = engine
        """With an engine client the models run in the engine process (it records their
        load metrics); without, they are loaded in this process."""
        self.entries: dict[str, dict[int, ModelEntry]] = {}
        self.engine_state: dict[str, Any] = {}
        """With an engine process: its effective options and process values (from Hello)."""

    async def load_all(self, only: str | None = None) -> None:
        """Load every version (one after another: warm-ups compete for CPU), or every
        version of model `only`."""
        remote: dict[tuple[str, int], ModelState] = {}
        if self.engine is not None:
            hello = await self.engine.hello(self.settings.startup_timeout_s)
            self.engine_state = {"options": hello.options, "process": hello.process}
            _warn_on_difference(self.settings.engine_options().to_dict(), hello.options)
            remote = {(m.name, m.version): m for m in hello.models}
            found = [(m.name, m.version, Path(m.path)) for m in hello.models]
            if self.settings.layout == "hybrid":  # the engine has those that keep sessions
                found = sorted(found + [b for b in list_bundles(self.settings.repo)
                                        if (b[0], b[1]) not in remote])
        else:
            found = list_bundles(self.settings.repo)
        found = [b for b in found if only in (None, b[0])]
        if not found:
            log.warning("no bundles found under %s", self.settings.repo)
        for name, version, path in found:
            self.entries.setdefault(name, {})[version] = ModelEntry(name, version, path)
            if (name, version) not in remote:  # every series exists from the start, at 0
                self.metrics.model_ready.labels(name, str(version)).set(0)
                self.metrics.load_failures.labels(name, str(version))
        for name, version, _ in found:
            await self._load(self.entries[name][version], remote.get((name, version)))

    async def _load(self, entry: ModelEntry, remote: ModelState | None) -> None:
        """Open a version: the engine's (`remote`), or load it in this process."""
        try:
            if remote is not None:
                worker = await asyncio.to_thread(self._open_remote, entry, remote)
            else:
                worker = await asyncio.to_thread(self._open_local, entry)
                assert entry.model is not None
                await entry.model.start()
        except Exception as exc:  # any failure skips this version only
            entry.state, entry.reason = "failed", f"{type(exc).__name__}: {exc}"
            if remote is None:  # the engine counts its own
                self.metrics.load_failures.labels(entry.name, str(entry.version)).inc()
            log.error("model %s version %d not served: %s", entry.name, entry.version,
                      entry.reason)
            return
        entry.worker, entry.state = worker, "ready"
        entry.runs_in = "api" if remote is None else "engine"
        if remote is None:
            self.metrics.model_ready.labels(entry.name, str(entry.version)).set(1)
        log.info("model %s version %d ready (%s%s)", entry.name, entry.version, entry.task,
                 "" if self.engine is None else
                 ", in the engine process" if remote is not None else ", in this process")

    def _open_local(self, entry: ModelEntry) -> ModelWorker:
        """Verify, open the runtime(s), schedule them, build the worker (blocking)."""
        options = self.settings.engine_options()
        entry.manifest, model = build_served(entry.name, entry.path, options,
                                             self.metrics.observer(entry.name),
                                             self.runtime_factory)
        entry.model = model
        entry.scheduling = dataclasses.asdict(model.config)
        if not entry.manifest.has_tokenizer:
            return self._series_worker(entry, entry.manifest, model, model.config.max_tokens,
                                       local=True)
        context = self._context(entry, entry.manifest, model, model.config.max_tokens)
        if isinstance(model, LMModel):
            return LMWorker(context, self.settings.max_new_tokens)
        if isinstance(model, DecodedModel):
            return TranslatorWorker(context)
        return ROW_WORKERS[entry.manifest.task](context)

    def _open_remote(self, entry: ModelEntry, state: ModelState) -> ModelWorker:
        """The engine's model of this version: the manifest and token limit the engine
        verified and loads it with (nothing is hashed here) and a remote model (blocking)."""
        if state.state != "ready" or state.manifest is None or state.max_tokens is None:
            raise ModelNotReady(state.reason or f"the engine reports it {state.state}")
        assert self.engine is not None
        entry.manifest = manifest = Manifest.from_dict(state.manifest)
        entry.scheduling = state.scheduling
        if not manifest.has_tokenizer:
            entry.model = series = RemoteSeriesModel(self.engine, state)
            return self._series_worker(entry, manifest, series, state.max_tokens, local=False)
        model: RemoteDecodeModel | RemoteRowModel | RemoteLMModel
        if manifest.task == "lm":
            model = RemoteLMModel(self.engine, state)
        elif manifest.task == "translator":
            model = RemoteDecodeModel(self.engine, state)
        else:
            model = RemoteRowModel(self.engine, state)
        entry.model = model
        context = self._context(entry, manifest, model, state.max_tokens)
        if isinstance(model, RemoteLMModel):
            return LMWorker(context, self.settings.max_new_tokens)
        if isinstance(model, RemoteDecodeModel):
            return TranslatorWorker(context)
        return ROW_WORKERS[manifest.task](context)

    def _series_worker(self, entry: ModelEntry, manifest: Manifest, model: Any,
                       max_steps: int, local: bool) -> ModelWorker:
        """A feature-sequence model's worker: no tokenizer, series limits. A model with
        sessions in this process of several (`local`) refuses them: a session's state
        would live in one process of several."""
        s = self.settings
        limits = SeriesLimits(s.max_texts, max_steps)
        refused = None
        several = isinstance(s.api_workers, int) and s.api_workers > 1
        if local and several and manifest.state_dim:
            refused = (f"the {s.layout} layout runs {s.api_workers} API processes, each with "
                       "its own copy of this model, and a session's state would live in one "
                       "of them (serve sessions with --layout engine or hybrid)")
        return SERIES_WORKERS[manifest.task](SeriesContext(entry.name, entry.version, manifest,
                                                           limits, model, refused))

    def _context(self, entry: ModelEntry, manifest: Manifest, model: Any,
                 max_tokens: int) -> WorkerContext[Any]:
        s = self.settings
        limits = TextLimits(s.max_texts, s.max_chars, max_tokens, s.truncate)
        tokenizer = _tokenizer(entry.path, manifest.tokenizer)
        tokenizer.blank_characters()  # ~0.1 s, here at load instead of in a first request
        target = (None if manifest.target_tokenizer is None
                  else _tokenizer(entry.path, manifest.target_tokenizer))
        return WorkerContext(entry.name, entry.version, manifest, tokenizer, limits, model,
                             target)

    def engine_report(self) -> dict[str, Any]:
        """The engine's effective options, its process values and every model's effective
        scheduling: as the engine process reported them, or this process's own in-process
        engine."""
        models = {f"{e.name}/{e.version}": e.scheduling
                  for v in self.entries.values() for e in v.values() if e.scheduling}
        if self.engine is not None:
            mode = ("hybrid: the bundles that keep sessions in the engine process, the others "
                    "in each API process" if self.settings.layout == "hybrid"
                    else "engine process")
            return {"mode": mode, **self.engine_state, "models": models}
        return {"mode": "in process", "options": self.settings.engine_options().to_dict(),
                "process": observed(), "models": models}

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
        return self._ready(name, self.entry(name, version))

    def _ready(self, name: str, entry: ModelEntry) -> tuple[ModelEntry, ModelWorker]:
        if entry.state != "ready" or entry.worker is None:
            why = f": {entry.reason}" if entry.reason else ""
            # a failed version stays failed until the server is redeployed: no Retry-After
            retry = None if entry.state == "failed" else self.settings.retry_after_s
            raise ModelNotReady(
                f"model {name!r} version {entry.version} is {entry.state}{why}",
                retry_after=retry,
            )
        return entry, entry.worker

    def worker(self, name: str, version: int | str | None, kind: type[W]
               ) -> tuple[ModelEntry, W]:
        """The ready worker of `name` when it is a `kind` (ModelNotFound when it is not)."""
        entry = self.entry(name, version)
        if entry.task is not None and entry.task != kind.task:
            raise ModelNotFound(f"model {name!r} is a {entry.task}, not a {kind.task}")
        entry, worker = self._ready(name, entry)  # the entry looked up once per request
        if not isinstance(worker, kind):
            raise ModelNotFound(f"model {name!r} is a {worker.task}, not a {kind.task}")
        return entry, worker

    def serving(self, strict: bool) -> bool:
        """Whether the server may take traffic: every version ready (strict; Triton's
        default), or at least one (relaxed). An empty repository serves nothing, and nothing
        is served once the engine process is gone."""
        if self.engine is not None and self.engine.lost is not None:
            return False
        states = [e.state == "ready" for v in self.entries.values() for e in v.values()]
        return bool(states) and (all(states) if strict else any(states))

    def not_ready(self) -> list[str]:
        """"name/version: state (reason)" of every version that is not ready."""
        return [f"{e.name}/{e.version}: {e.state}" + (f" ({e.reason})" if e.reason else "")
                for v in self.entries.values() for e in v.values() if e.state != "ready"]


def _warn_on_difference(expected: dict[str, Any], reported: dict[str, Any]) -> None:
    """Log the engine options that differ from what this process's settings make (a
    supervisor and its children out of step: never expected, worth one loud line)."""
    differ = {k: (expected.get(k), reported.get(k)) for k in expected.keys() | reported.keys()
              if expected.get(k) != reported.get(k)}
    if differ:
        log.warning("the engine runs with options other than this process's settings make "
                    "(setting: (here, engine)): %s", differ)


def _tokenizer(path: Path, spec: TokenizerSpec) -> TextTokenizer:
    """A bundle's tokenizer file with the special ids its manifest declares."""
    return load_tokenizer(path / spec.file, spec.kind,
                          (spec.pad_id, spec.unk_id, spec.bos_id, spec.eos_id))


def _parse_version(version: int | str) -> int | None:
    if isinstance(version, int):
        return version
    return int(version) if version.isdigit() and version.isascii() else None
