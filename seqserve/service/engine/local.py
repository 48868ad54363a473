"""`LocalEngine`: the engine interface (engine/interface.py) over models in this process.

`load(bundles)` loads, verifies, warms up and starts each bundle version one after another
(warm-ups compete for CPU; `loading.build_served`); a version that fails is recorded as
"failed" with the reason (log, metrics) and the others serve. Its typed calls hand each
request to the version's scheduled model: the dynamic batcher (rows, series, session chunks),
the decode loop (translate) or the language-model loop (generate, score). It runs in every
process that runs models: a single-process server, each API process of the replicated and
hybrid layouts (their own copy), and the engine process (behind `engine.server`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Sequence
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
        self.states: list[ModelState] = []
        self.closing = False
        """Draining: new calls are refused (ShuttingDown), admitted ones finish."""

    # -- the table --------------------------------------------------------------------

    async def load(self, bundles: Sequence[tuple[str, int, Path]]) -> None:
        """Load, warm up and start each (name, version, path), one after another."""
        for name, version, _ in bundles:  # every series exists from the start, at 0
            self.metrics.model_ready.labels(name, str(version)).set(0)
            self.metrics.load_failures.labels(name, str(version))
        for name, version, path in bundles:
            await self._load_one(name, version, path)

    async def _load_one(self, name: str, version: int, path: Path) -> None:
        try:
            manifest, model = await asyncio.to_thread(
                build_served, name, path, self.options, self.metrics.observer(name),
                self.runtime_factory)
            await model.start()
        except Exception as exc:  # this version only
            reason = failure_reason(exc, self.options.repo)
            log.error("model %s version %d not served: %s", name, version, reason)
            self.metrics.load_failures.labels(name, str(version)).inc()
            self.states.append(ModelState(name, version, str(path), "failed", reason, None, {}))
            return
        self.served[name, version] = model
        self.metrics.model_ready.labels(name, str(version)).set(1)
        self.states.append(ModelState(
            name, version, str(path), "ready", None, manifest.task, model.describe(),
            manifest=manifest.to_dict(), max_tokens=model.config.max_tokens,
            scheduling=dataclasses.asdict(model.config)))
        log.info("model %s version %d ready (%s)", name, version, manifest.task)

    def models(self) -> list[ModelState]:
        return list(self.states)

    async def stop(self, timeout: float) -> bool:
        """Refuse new work and drain every model concurrently within `timeout`; True when
        every one drained."""
        self.closing = True
        results = await asyncio.gather(*(m.stop(timeout) for m in self.served.values()))
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

    # -- the typed calls ----------------------------------------------------------------

    def rows(self, model: str, version: int, rows: Sequence[list[int]],
             deadline: float) -> Futures:
        return list(self._of(model, version, BatchedModel, "token rows").submit(rows, deadline))

    def series(self, model: str, version: int, series: Sequence[np.ndarray],
               deadline: float) -> Futures:
        return list(self._of(model, version, BatchedModel, "feature series").submit(
            series, deadline))

    def chunk(self, model: str, version: int, series: np.ndarray, session: str, start: bool,
              end: bool, deadline: float) -> asyncio.Future[Timed[Any]]:
        served = self._of(model, version, BatchedModel, "feature series")
        return served.submit_session(series, session, start, end, deadline)

    def translate(self, model: str, version: int, sources: Sequence[list[int]],
                  options: SearchOptions, deadline: float) -> list[asyncio.Future[Decoded]]:
        return self._of(model, version, DecodedModel, "sources to translate").submit(
            sources, options, deadline)

    def score(self, model: str, version: int, rows: Sequence[list[int]],
              deadline: float) -> Futures:
        return self._of(model, version, LMModel, "texts to score").score(rows, deadline)

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
