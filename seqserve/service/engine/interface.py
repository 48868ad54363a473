"""The engine interface: the one way to reach a model, in this process or in the engine process.

An `Engine` owns the table of loaded model versions (`models()`: each version's `ModelState`,
the verified manifest and limits an API process serves it with) and the typed calls on them:
rows (classifiers, taggers), series and session chunks (feature-sequence models), translate,
score and generate; a caller cancels a call by cancelling its futures (or its stream). Two
implementations: `engine.local.LocalEngine` (the models here) and `engine.client.EngineClient`
(the same calls over ZeroMQ to the engine process, whose `engine.server.EngineServer` hands
each message to its own LocalEngine).

Workers hold a `ModelHandle`: one version of one engine, with the call its task needs, so a
worker does not know (and the repository does not choose) where its model runs.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np

from seqserve.export.contract import TaskSpec
from seqserve.service.engine.protocol import ModelState
from seqserve.service.scheduling.base import Timed
from seqserve.service.scheduling.generation import GenerateOptions, TokenStream
from seqserve.service.scheduling.search import SearchOptions
from seqserve.service.scheduling.work import Decoded

Futures = list[asyncio.Future[Timed[Any]]]


class Engine(Protocol):
    """See the module doc."""

    in_process: bool
    """The models run in this process (a copy per API process), not in the engine process."""
    lost: str | None
    """Why the engine cannot serve (its process is gone), else None."""

    def models(self) -> list[ModelState]: ...

    def rows(self, model: str, version: int, rows: Sequence[list[int]],
             deadline: float) -> Futures: ...

    def series(self, model: str, version: int, series: Sequence[np.ndarray],
               deadline: float) -> Futures: ...

    def chunk(self, model: str, version: int, series: np.ndarray, session: str, start: bool,
              end: bool, deadline: float, owner: str = "") -> asyncio.Future[Timed[Any]]: ...

    def translate(self, model: str, version: int, sources: Sequence[list[int]],
                  options: SearchOptions, deadline: float) -> list[asyncio.Future[Decoded]]: ...

    def score(self, model: str, version: int, rows: Sequence[list[int]],
              deadline: float, top: int = 0, start: tuple[bytes, int] | None = None,
              return_state: bool = False) -> Futures: ...

    def generate(self, model: str, version: int, prompts: Sequence[list[int]],
                 options: GenerateOptions, deadline: float) -> TokenStream: ...

    def expected_wait(self, model: str, version: int) -> float | None: ...

    async def stop(self, timeout: float) -> bool: ...


class ModelHandle:
    """One model version of one engine, as its worker sees it: the typed call of its task
    (`submit` for rows, series and translations; `submit_session`, `score`, `generate`),
    its description and its expected queue wait (for early shedding)."""

    def __init__(self, engine: Engine, state: ModelState) -> None:
        self.engine, self.state = engine, state
        self.name, self.version = state.name, state.version

    def describe(self) -> dict[str, Any]:
        return dict(self.state.describe)

    def expected_wait(self) -> float | None:
        return self.engine.expected_wait(self.name, self.version)


class RowHandle(ModelHandle):
    """A classifier or tagger (implements `scheduling.models.RowModel`)."""

    def submit(self, rows: Sequence[list[int]], deadline: float) -> Futures:
        return self.engine.rows(self.name, self.version, rows, deadline)


class SeriesHandle(ModelHandle):
    """A feature-sequence model (implements `scheduling.models.SeriesModel`)."""

    def submit(self, rows: Sequence[np.ndarray], deadline: float) -> Futures:
        return self.engine.series(self.name, self.version, rows, deadline)

    def submit_session(self, series: np.ndarray, session: str, start: bool, end: bool,
                       deadline: float, owner: str = "") -> asyncio.Future[Timed[Any]]:
        return self.engine.chunk(self.name, self.version, series, session, start, end,
                                 deadline, owner)


class DecodeHandle(ModelHandle):
    """A translator (implements `scheduling.models.DecodeModel`)."""

    def submit(self, sources: Sequence[list[int]], options: SearchOptions,
               deadline: float) -> list[asyncio.Future[Decoded]]:
        return self.engine.translate(self.name, self.version, sources, options, deadline)


class LMHandle(ModelHandle):
    """A language model (what `workers.lm.LMWorker` needs of its model)."""

    def generate(self, prompts: Sequence[list[int]], options: GenerateOptions,
                 deadline: float) -> TokenStream:
        return self.engine.generate(self.name, self.version, prompts, options, deadline)

    def score(self, rows: Sequence[list[int]], deadline: float, top: int = 0,
              start: tuple[bytes, int] | None = None, return_state: bool = False) -> Futures:
        return self.engine.score(self.name, self.version, rows, deadline, top, start,
                                 return_state)


HANDLES: dict[str, type[ModelHandle]] = {
    "rows": RowHandle, "series": SeriesHandle, "decode": DecodeHandle, "lm": LMHandle,
}
"""The handle of each task family (export.contract.FAMILIES)."""


def handle(engine: Engine, state: ModelState, spec: TaskSpec) -> ModelHandle:
    """The handle of a ready model version for its task."""
    return HANDLES[spec.family](engine, state)
