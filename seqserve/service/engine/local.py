"""`LocalEngine`: the engine interface (engine/interface.py) over models in this process.

`load(bundles)` loads, verifies, warms up and starts each bundle version one after another
(warm-ups compete for CPU; `loading.build_served`); a version that fails is recorded as
"failed" with the reason (log, metrics) and the others serve; while serving, the model
control loads a version (`load_version`: off the loop, in a thread) and unloads one
(`unload`: it drains, then its runtimes are freed). Its typed calls hand each
request to the version's scheduled model: the dynamic batcher (rows, series, session chunks),
the decode loop (translate) or the language-model loop (generate, score). It runs in every
process that runs models: a single-process server, each API process of the replicated and
hybrid layouts (their own copy), and the engine process (behind `engine.server`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Coroutine, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from seqserve.service.core.errors import BadRequest, ModelNotReady, ShuttingDown
from seqserve.service.core.metrics import Metrics
from seqserve.service.engine.interface import Futures
from seqserve.service.engine.loading import RuntimeFactory, build_served, failure_reason
from seqserve.service.engine.options import EngineOptions
from seqserve.service.engine.protocol import ModelState
from seqserve.service.scheduling.base import Timed
from seqserve.service.scheduling.generation import GenerateOptions, Sink, TokenStream
from seqserve.service.scheduling.lm import LMModel
from seqserve.service.scheduling.models import BatchedModel, DecodedModel, ServedModel
from seqserve.service.scheduling.search import SearchOptions
from seqserve.service.scheduling.work import Decoded

log = logging.getLogger("seqserve.engine")


class LocalEngine:
    """See the module doc."""

    in_process = True
    lost: str | None = None

    def __init__(self, options: EngineOptions, metrics: Metrics,
                 runtime_factory: RuntimeFactory | None = None) -> None:
        self.options = options
        self.metrics = metrics
        self.runtime_factory = runtime_factory
        self.served: dict[tuple[str, int], ServedModel] = {}
        self.states: dict[tuple[str, int], ModelState] = {}
        self.retiring: dict[tuple[str, int], ServedModel] = {}
        """Versions unloading: they finish what they admitted; their live sessions' chunks
        still reach them (`chunk`) until the sessions end or expire."""
        self.closing = False
        """Draining: new calls are refused (ShuttingDown), admitted ones finish."""
        self._background: set[asyncio.Future[Any]] = set()

    # -- the table --------------------------------------------------------------------

    async def load(self, bundles: Sequence[tuple[str, int, Path]]) -> None:
        """Load, warm up and start each (name, version, path), one after another."""
        for name, version, _ in bundles:  # every series exists from the start, at 0
            self.metrics.model_ready.labels(name, str(version)).set(0)
            self.metrics.load_failures.labels(name, str(version))
            self.metrics.unload_seconds.labels(name)
        for name, version, path in bundles:
            await self.load_version(name, version, path)

    async def load_version(self, name: str, version: int, path: Path) -> ModelState:
        """Verify, open, warm up and start one version (the blocking part in a thread: the
        loop serves on meanwhile); its state. A version loaded again (its files changed)
        replaces the loaded copy only once ready, and the old copy drains; a failure leaves
        a loaded copy serving (the state returned says failed, the table keeps the old)."""
        key = (name, version)
        started = time.monotonic()
        try:
            manifest, model = await asyncio.to_thread(
                build_served, name, path, self.options, self.metrics.observer(name),
                self.runtime_factory)
            await model.start()
        except Exception as exc:  # this version only
            reason = failure_reason(exc, path)
            log.error("model %s version %d not served: %s", name, version, reason)
            self.metrics.load_failures.labels(name, str(version)).inc()
            failed = ModelState(name, version, str(path), "failed", reason, None, {})
            if key not in self.served:
                self.states[key] = failed
            return failed
        old = self.served.get(key)
        self.served[key] = model
        state = self.states[key] = ModelState(
            name, version, str(path), "ready", None, manifest.task, model.describe(),
            manifest=manifest.to_dict(), max_tokens=model.config.max_tokens,
            scheduling=dataclasses.asdict(model.config))
        self.metrics.model_ready.labels(name, str(version)).set(1)
        seconds = time.monotonic() - started
        self.metrics.load_seconds.labels(name).observe(seconds)
        log.info("model %s version %d ready (%s; loaded in %.2f s)", name, version,
                 manifest.task, seconds)
        if old is not None:  # the same version, new files: the old copy finishes its work
            self._later(self._retire(key, old, self.options.drain_timeout_s))
        return state

    async def unload(self, name: str, version: int, timeout: float) -> bool:
        """Take a version out of the table: new calls to it are refused (ModelNotReady), what
        it admitted finishes within `timeout` (its sessions until they end or expire), then
        its runtimes are freed; True when everything admitted was answered."""
        key = (name, version)
        self.states.pop(key, None)
        model = self.served.pop(key, None)
        if model is None:
            return True
        self.metrics.model_ready.labels(name, str(version)).set(0)
        store = getattr(model, "sessions", None)
        if store is not None and len(store):  # kept for its sessions: unloaded after them
            log.info("model %s version %d: unloading once its %d live sessions end or "
                     "expire", name, version, len(store))
            self._later(self._retire(key, model, timeout))
            return True
        started = time.monotonic()
        drained = await self._retire(key, model, timeout)
        seconds = time.monotonic() - started
        self.metrics.unload_seconds.labels(name).observe(seconds)
        log.info("model %s version %d unloaded (%s in %.2f s)", name, version,
                 "drained" if drained else "drain timeout passed", seconds)
        return drained

    def _later(self, work: Coroutine[Any, Any, Any]) -> None:
        task = asyncio.ensure_future(work)
        self._background.add(task)  # held until done (the loop keeps weak references)
        task.add_done_callback(self._background.discard)

    async def _retire(self, key: tuple[str, int], model: ServedModel, timeout: float) -> bool:
        self.retiring[key] = model
        try:
            store = getattr(model, "sessions", None)
            while store is not None and len(store) and not self.closing:
                store.sweep()  # sessions end (their last chunk) or expire
                await asyncio.sleep(0.1)
            return await model.stop(timeout)
        finally:
            if self.retiring.get(key) is model:
                del self.retiring[key]

    def models(self) -> list[ModelState]:
        return list(self.states.values())

    async def stop(self, timeout: float) -> bool:
        """Refuse new work and drain every model concurrently within `timeout`; True when
        every one drained."""
        self.closing = True
        models = [*self.served.values(), *self.retiring.values()]
        results = await asyncio.gather(*(m.stop(timeout) for m in models))
        return all(results)

    def model(self, name: str, version: int) -> ServedModel:
        """The served model of a version (ShuttingDown while draining, ModelNotReady when
        it is not loaded)."""
        if self.closing:
            raise ShuttingDown("the engine is shutting down",
                               retry_after=self.options.retry_after_s)
        found = self.served.get((name, version))
        if found is None:
            raise ModelNotReady(f"model {name!r} version {version} is not loaded")
        return found

    def expected_wait(self, model: str, version: int) -> float | None:
        found = self.served.get((model, version))
        return None if found is None else found.expected_wait()

    def scheduled(self, model: str, version: int) -> ServedModel | None:
        return self.served.get((model, version))

    # -- the typed calls ----------------------------------------------------------------

    def rows(self, model: str, version: int, rows: Sequence[list[int]],
             deadline: float) -> Futures:
        return list(self._of(model, version, BatchedModel, "token rows").submit(rows, deadline))

    def series(self, model: str, version: int, series: Sequence[np.ndarray],
               deadline: float) -> Futures:
        return list(self._of(model, version, BatchedModel, "feature series").submit(
            series, deadline))

    def chunk(self, model: str, version: int, series: np.ndarray, session: str, start: bool,
              end: bool, deadline: float, owner: str = "") -> asyncio.Future[Timed[Any]]:
        """A session's chunk: to `version`, or to the other version of the model (loaded,
        or unloading) that holds the session: a session stays on the version it started on
        until it ends or expires. The result's steps array is (steps, the version that ran
        it): the answer names it."""
        served = self._of(model, version, BatchedModel, "feature series")
        ran = version
        own = served.sessions
        if not start and (own is None or session not in own.sessions):
            for (name, other_version), other in [*self.served.items(),
                                                 *self.retiring.items()]:
                store = getattr(other, "sessions", None)
                if name == model and store is not None and session in store.sessions:
                    served, ran = other, other_version
        return _ran_on(served.submit_session(series, session, start, end, deadline, owner),
                       ran)

    def translate(self, model: str, version: int, sources: Sequence[list[int]],
                  options: SearchOptions, deadline: float) -> list[asyncio.Future[Decoded]]:
        return self._of(model, version, DecodedModel, "sources to translate").submit(
            sources, options, deadline)

    def score(self, model: str, version: int, rows: Sequence[list[int]],
              deadline: float, top: int = 0, start: tuple[bytes, int] | None = None,
              return_state: bool = False) -> Futures:
        return self._of(model, version, LMModel, "texts to score").score(
            rows, deadline, top, start, return_state)

    def generate(self, model: str, version: int, prompts: Sequence[list[int]],
                 options: GenerateOptions, deadline: float) -> TokenStream:
        return self._of(model, version, LMModel, "prompts").generate(prompts, options, deadline)

    def stream(self, model: str, version: int, prompts: Sequence[list[int]],
               options: GenerateOptions, deadline: float, sink: Sink) -> tuple[LMModel, int]:
        """A generation whose every update's events go to `sink` (the engine server's
        frames): its model and request id, for `cancel(rid)` and `stop_sequence(rid, i)`."""
        lm: LMModel = self._of(model, version, LMModel, "prompts")
        return lm, lm.submit(prompts, options, deadline, sink)

    def _of(self, name: str, version: int, kind: type[Any], what: str) -> Any:
        served = self.model(name, version)
        if not isinstance(served, kind):
            raise BadRequest(f"model {name!r} does not take {what}")
        return served


def _ran_on(chunk: asyncio.Future[Timed[Any]], version: int) -> asyncio.Future[Timed[Any]]:
    """A session chunk's future whose steps array also names the version that ran it."""
    out: asyncio.Future[Timed[Any]] = asyncio.get_running_loop().create_future()

    def done(f: asyncio.Future[Timed[Any]]) -> None:
        if out.done():
            return
        if f.cancelled():
            out.cancel()
        elif f.exception() is not None:
            out.set_exception(f.exception())  # type: ignore[arg-type]
        else:
            t = f.result()
            steps = np.array([int(t.value[1][0]), version], np.int64)
            out.set_result(Timed((t.value[0], steps), t.timing))

    chunk.add_done_callback(done)
    out.add_done_callback(lambda o: chunk.cancel() if o.cancelled() else None)
    return out
