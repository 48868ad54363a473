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
import functools
from collections.abc import Callable, Sequence
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

    def scheduled(self, model: str, version: int) -> Any | None:
        """The scheduled model itself where it runs in this process (`scheduling.models`:
        its calls are the typed calls above without the name and version), else None."""

    async def stop(self, timeout: float) -> bool: ...


class ModelHandle:
    """One model version of one engine, as its worker sees it: the typed call of its task
    (`submit` for rows, series and translations; `submit_session`, `score`, `generate`),
    its description and its expected queue wait (for early shedding). Each call is the
    scheduled model's own where it runs in this process (`Engine.scheduled`), else the
    engine's call with the name and version bound: no hop of its own."""

    expected_wait: Callable[[], float | None]

    def __init__(self, engine: Engine, state: ModelState) -> None:
        self.engine, self.state = engine, state
        self.name, self.version = state.name, state.version
        self.local = engine.scheduled(self.name, self.version)
        self.expected_wait = self.call("expected_wait", engine.expected_wait)

    def call(self, name: str, remote: Callable[..., Any]) -> Callable[..., Any]:
        """The scheduled model's `name` where it runs here, else `remote` (an engine call)
        for this version."""
        if self.local is not None:
            return getattr(self.local, name)  # type: ignore[no-any-return]
        return functools.partial(remote, self.name, self.version)

    def describe(self) -> dict[str, Any]:
        return dict(self.state.describe)


class RowHandle(ModelHandle):
    """A classifier or tagger (implements `scheduling.models.RowModel`)."""

    submit: Callable[[Sequence[list[int]], float], Futures]

    def __init__(self, engine: Engine, state: ModelState) -> None:
        super().__init__(engine, state)
        self.submit = self.call("submit", engine.rows)


class SeriesHandle(ModelHandle):
    """A feature-sequence model (implements `scheduling.models.SeriesModel`)."""

    submit: Callable[[Sequence[np.ndarray], float], Futures]
    submit_session: Callable[..., asyncio.Future[Timed[Any]]]
    """(series, session, start, end, deadline, owner="")"""

    def __init__(self, engine: Engine, state: ModelState) -> None:
        super().__init__(engine, state)
        self.submit = self.call("submit", engine.series)
        # (the engine's own: a session stays on the version it started on)
        self.submit_session = functools.partial(engine.chunk, self.name, self.version)


class DecodeHandle(ModelHandle):
    """A translator (implements `scheduling.models.DecodeModel`)."""

    submit: Callable[[Sequence[list[int]], SearchOptions, float],
                     list[asyncio.Future[Decoded]]]

    def __init__(self, engine: Engine, state: ModelState) -> None:
        super().__init__(engine, state)
        self.submit = self.call("submit", engine.translate)


class LMHandle(ModelHandle):
    """A language model (what `workers.lm.LMWorker` needs of its model)."""

    generate: Callable[[Sequence[list[int]], GenerateOptions, float], TokenStream]
    score: Callable[..., Futures]
    """(rows, deadline, top=0, start=None, return_state=False)"""

    def __init__(self, engine: Engine, state: ModelState) -> None:
        super().__init__(engine, state)
        self.generate = self.call("generate", engine.generate)
        self.score = self.call("score", engine.score)


HANDLES: dict[str, type[ModelHandle]] = {
    "rows": RowHandle, "series": SeriesHandle, "decode": DecodeHandle, "lm": LMHandle,
}
"""The handle of each task family (export.contract.FAMILIES)."""


def handle(engine: Engine, state: ModelState, spec: TaskSpec) -> ModelHandle:
    """The handle of a ready model version for its task."""
    return HANDLES[spec.family](engine, state)
