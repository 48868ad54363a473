"""Model repository: every model version the app serves, each with its state and worker.

The models are loaded by engines (engine/interface.py): this process's `LocalEngine`, the
engine process's (through `EngineClient`), or both in the hybrid layout; which bundle runs
where is the composition root's choice (server/composition.py). `open(engines)` turns each
engine's model table into entries: for a ready version the verified manifest and limits the
engine reports, the tokenizer file read here (no hashing), and the task's worker over a
`ModelHandle` of that engine; one path whichever engine serves it. A version that failed is
recorded as "failed" with the reason (log, metrics, /v1/models) and skipped; the others
serve. The default version is the one the model control chose (`switch`: its policy's
default while ready), else the highest ready one. While serving, the model control adds a
version an engine loaded (`add`) and takes one out (`remove`): each a single change of the
table on the event loop, so a request sees the old table or the new one.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol, TypeVar

from seqserve.export.manifest import Manifest, TokenizerSpec
from seqserve.models.text.tokenizer_files import TextTokenizer, load_tokenizer, probe_tokenizer
from seqserve.service.core.errors import ModelNotFound, ModelNotReady
from seqserve.service.core.metrics import Metrics
from seqserve.service.core.process import observed
from seqserve.service.engine.interface import Engine, ModelHandle, handle
from seqserve.service.engine.loading import failure_reason
from seqserve.service.engine.options import EngineOptions
from seqserve.service.engine.protocol import ModelState
from seqserve.service.workers import WORKERS, ModelWorker, TextLimits, WorkerContext
from seqserve.service.workers.classifier import ClassifierWorker
from seqserve.service.workers.lm import LMWorker
from seqserve.service.workers.series import (
    SeriesContext,
    SeriesLimits,
    SeriesWorker,
)
from seqserve.service.workers.tagger import TaggerWorker
from seqserve.service.workers.translator import TranslatorWorker

log = logging.getLogger("seqserve.repository")

W = TypeVar("W", ClassifierWorker, TaggerWorker, TranslatorWorker, LMWorker, SeriesWorker)



class RepositorySettings(Protocol):
    """What the repository reads of the server's settings (`web.settings.Settings`)."""

    @property
    def repo(self) -> Path: ...

    @property
    def layout(self) -> str: ...

    @property
    def api_workers(self) -> int | str: ...

    @property
    def max_texts(self) -> int: ...

    @property
    def max_chars(self) -> int: ...

    @property
    def truncate(self) -> bool: ...

    @property
    def max_unknown_fraction(self) -> float | None: ...

    @property
    def max_new_tokens(self) -> int: ...

    @property
    def retry_after_s(self) -> float: ...

    def engine_options(self) -> EngineOptions: ...

    def sessions_in_engine(self) -> bool: ...

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
    model: ModelHandle | None = None
    """Its model on the engine that serves it, once open."""
    worker: ModelWorker | None = None
    scheduling: dict[str, Any] | None = None
    """Its effective scheduling config (`ModelConfig` as plain data), once open."""
    runs_in: Literal["engine", "api"] | None = None
    """Where its model runs once opened: the engine process, or each API process (this one)."""
    engine: Engine | None = None
    """The engine that serves it, once open."""
    late: bool = False
    """Added while serving (the model control): not ready (loading, failed), it replaced
    nothing, so it does not take the server out of its load balancer."""

    @property
    def task(self) -> str | None:
        return self.manifest.task if self.manifest else None


class ModelRepository:
    """All model versions of one app, over the engines that serve them."""

    def __init__(self, settings: RepositorySettings, metrics: Metrics) -> None:
        self.settings = settings
        self.metrics = metrics
        self.engines: list[Engine] = []
        self.entries: dict[str, dict[int, ModelEntry]] = {}
        self.engine_state: dict[str, Any] = {}
        """With an engine process: its effective options and process values (from Hello)."""
        self.defaults: dict[str, int] = {}
        """The default version of each model the model control chose (or its policy names);
        while it is not ready, the highest ready version."""
        self.generation = 0
        """Counts the changes of the table's models and versions (`open`, `add`, `remove`):
        what reads the table's paths knows when to read them again."""

    async def open(self, engines: list[Engine]) -> None:
        """An entry for every version each engine holds, in (name, version) order, and the
        worker of each ready one (tokenizers are read in a thread)."""
        self.engines = list(engines)
        found = sorted(((m, e) for e in engines for m in e.models()),
                       key=lambda found: (found[0].name, found[0].version))
        if not found:
            log.warning("no bundles found under %s", self.settings.repo)
        for state, _ in found:
            self.entries.setdefault(state.name, {})[state.version] = ModelEntry(
                state.name, state.version, Path(state.path))
        self.generation += 1
        for state, engine in found:
            await self._open(self.entries[state.name][state.version], state, engine)

    async def _open(self, entry: ModelEntry, state: ModelState, engine: Engine) -> None:
        try:
            worker = await asyncio.to_thread(self._worker, entry, state, engine)
        except Exception as exc:  # any failure skips this version only
            entry.state, entry.reason = "failed", failure_reason(exc, entry.path)
            log.error("model %s version %d not served: %s", entry.name, entry.version,
                      entry.reason)
            return
        entry.worker, entry.state, entry.engine = worker, "ready", engine
        entry.runs_in = "api" if engine.in_process else "engine"
        several = len(self.engines) > 1 or not engine.in_process
        log.info("model %s version %d ready (%s%s)", entry.name, entry.version, entry.task,
                 "" if not several else
                 ", in this process" if engine.in_process else ", in the engine process")

    def _worker(self, entry: ModelEntry, state: ModelState, engine: Engine) -> ModelWorker:
        """The worker of a version its engine reports (blocking): the manifest and token
        limit the engine verified and loads it with (nothing is hashed here)."""
        if state.state != "ready" or state.manifest is None or state.max_tokens is None:
            raise ModelNotReady(state.reason or f"the engine reports it {state.state}")
        entry.manifest = manifest = Manifest.from_dict(state.manifest)
        entry.scheduling = state.scheduling
        entry.model = model = handle(engine, state, manifest.spec)
        if manifest.spec.features:
            return self._series_worker(entry, manifest, model, state.max_tokens,
                                       local=engine.in_process)
        context = self._context(entry, manifest, model, state.max_tokens)
        return WORKERS[manifest.task](context)  # type: ignore[no-any-return]

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
        context = SeriesContext(entry.name, entry.version, manifest, limits, model, refused)
        return WORKERS[manifest.task](context)  # type: ignore[no-any-return]

    def _context(self, entry: ModelEntry, manifest: Manifest, model: Any,
                 max_tokens: int) -> WorkerContext[Any]:
        s = self.settings
        limits = TextLimits(s.max_texts, s.max_chars, max_tokens, s.truncate,
                            s.max_unknown_fraction)
        tokenizer = _tokenizer(entry.path, manifest.tokenizer)
        tokenizer.blank_characters()  # ~0.1 s, here at load instead of in a first request
        target = (None if manifest.target_tokenizer is None
                  else _tokenizer(entry.path, manifest.target_tokenizer))
        return WorkerContext(entry.name, entry.version, manifest, tokenizer, limits, model,
                             target, s.max_new_tokens)

    def engine_report(self) -> dict[str, Any]:
        """The engine's effective options, its process values and every model's effective
        scheduling: as the engine process reported them, or this process's own."""
        models = {f"{e.name}/{e.version}": e.scheduling
                  for v in self.entries.values() for e in v.values() if e.scheduling}
        if self.engine_state:
            mode = ("hybrid: the bundles that keep sessions in the engine process, the others "
                    "in each API process" if self.settings.layout == "hybrid"
                    else "engine process")
            return {"mode": mode, **self.engine_state, "models": models}
        return {"mode": "in process", "options": self.settings.engine_options().to_dict(),
                "process": observed(), "models": models}

    async def stop_all(self, timeout: float) -> bool:
        """Drain every engine of this process concurrently within `timeout` (the engine
        process drains itself, after every API process stopped); True when all drained."""
        results = await asyncio.gather(*(e.stop(timeout) for e in self.engines))
        for versions in self.entries.values():
            for e in versions.values():
                if e.worker is not None:
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
        versions = self.versions(name)
        chosen = self.defaults.get(name)
        if chosen is not None and chosen in versions and versions[chosen].state == "ready":
            return chosen
        if len(versions) == 1:  # the usual table (looked up 2-3 times a request: no scan)
            for version, entry in versions.items():
                return version if entry.state == "ready" else None
        return max((v for v, e in versions.items() if e.state == "ready"), default=None)

    # -- changes while serving (the model control) -----------------------------------------

    async def add(self, state: ModelState, engine: Engine) -> ModelEntry:
        """A version `engine` loaded while serving: its worker built (off the loop), then
        put in the table in one step, replacing a loaded copy of the same version, except a
        ready one by a failed one. The model's default stays what it was until `switch`."""
        entry = ModelEntry(state.name, state.version, Path(state.path), late=True)
        await self._open(entry, state, engine)
        versions = self.entries.setdefault(state.name, {})
        if state.name not in self.defaults and versions:
            serving = self.default_version(state.name)
            if serving is not None:
                self.defaults[state.name] = serving
        old = versions.get(state.version)
        if entry.state != "ready" and old is not None and old.state == "ready":
            return entry
        versions[state.version] = entry
        self.generation += 1
        return entry

    def switch(self, name: str, default: int | None) -> None:
        """Unpinned requests of `name` go to `default` from now on (None: its highest ready
        version)."""
        if default is None:
            self.defaults.pop(name, None)
        else:
            self.defaults[name] = default

    def remove(self, name: str, version: int) -> ModelEntry | None:
        """Take a version out of the table: requests pinned to it are 404 from now on (what
        it admitted finishes: the engine's `unload`); the model is gone with its last."""
        versions = self.entries.get(name, {})
        entry = versions.pop(version, None)
        self.generation += 1
        if not versions:
            self.entries.pop(name, None)
            self.defaults.pop(name, None)
        elif self.defaults.get(name) == version:
            del self.defaults[name]
        return entry

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
            # failed too: the model control may load it again (a fixed file, another
            # process's copy), and every 503 says when to ask again
            raise ModelNotReady(
                f"model {name!r} version {entry.version} is {entry.state}{why}",
                retry_after=self.settings.retry_after_s,
            )
        return entry, entry.worker

    def worker(self, name: str, version: int | str | None, kind: type[W]
               ) -> tuple[ModelEntry, W]:
        """The ready worker of `name` when it is a `kind` (ModelNotFound when it is not);
        `SeriesWorker`: any feature-sequence worker."""
        entry = self.entry(name, version)
        if kind is SeriesWorker:
            return self._series(name, entry)  # type: ignore[return-value]
        if entry.task is not None and entry.task != kind.task:
            raise ModelNotFound(f"model {name!r} is a {entry.task}, not a {kind.task}")
        entry, worker = self._ready(name, entry)  # the entry looked up once per request
        if not isinstance(worker, kind):
            raise ModelNotFound(f"model {name!r} is a {worker.task}, not a {kind.task}")
        return entry, worker

    def _series(self, name: str, entry: ModelEntry) -> tuple[ModelEntry, SeriesWorker]:
        if entry.task is not None and not entry.task.startswith("sequence-"):
            raise ModelNotFound(f"model {name!r} is a {entry.task}, not a feature-sequence "
                                "model (sequence-classifier or sequence-tagger)")
        entry, worker = self._ready(name, entry)
        if not isinstance(worker, SeriesWorker):
            raise ModelNotFound(f"model {name!r} is a {worker.task}, not a feature-sequence "
                                "model")
        return entry, worker

    def serving(self, readiness: str) -> bool:
        """Whether the server may take traffic (`Settings.readiness`): default, every model
        has a default version, ready (the policy's while it is ready, else its highest ready
        one: `default_version`), so every unpinned request is served; a failed version beside
        it is reported (index, metrics, log) but holds nothing; all, every version ready
        (strict; Triton's default); any, at least one. A version the model control added
        while serving that is not ready (loading, failed) does not count: it replaced
        nothing, so whatever answered before answers on. An empty repository serves nothing,
        and nothing is served once the engine process is gone."""
        if any(e.lost is not None for e in self.engines):
            return False
        counted = {name: [e.state == "ready" for e in v.values() if e.state == "ready"
                          or not e.late] for name, v in self.entries.items()}
        states = [ok for oks in counted.values() for ok in oks]
        if readiness == "default":
            return bool(states) and all(self.default_version(name) is not None
                                        for name, oks in counted.items() if oks)
        return bool(states) and (all(states) if readiness == "all" else any(states))

    def not_ready(self) -> list[str]:
        """"name/version: state (reason)" of every version that is not ready."""
        return [f"{e.name}/{e.version}: {e.state}" + (f" ({e.reason})" if e.reason else "")
                for v in self.entries.values() for e in v.values() if e.state != "ready"]


def _tokenizer(path: Path, spec: TokenizerSpec) -> TextTokenizer:
    """A bundle's tokenizer file with the special ids its manifest declares, refused when it
    fails or crawls on adversarial texts (`probe_tokenizer`)."""
    tok = load_tokenizer(path / spec.file, spec.kind,
                         (spec.pad_id, spec.unk_id, spec.bos_id, spec.eos_id))
    probe_tokenizer(tok, spec.file)
    return tok


def _parse_version(version: int | str) -> int | None:
    if isinstance(version, int):
        return version
    return int(version) if version.isdigit() and version.isascii() else None
