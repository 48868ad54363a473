"""`AppState`: what the routes, the middleware and the shutdown logic share (one per app)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from seqserve.service.core.metrics import Metrics
from seqserve.service.core.state_token import StateCodec
from seqserve.service.repository.control import ModelControl
from seqserve.service.repository.entries import ModelRepository
from seqserve.service.web.settings import Settings

log = logging.getLogger("seqserve.app")


@dataclass
class AppState:
    """The app's settings, metrics, repository and lifecycle flags (app.state.seqserve)."""

    settings: Settings
    metrics: Metrics
    repository: ModelRepository
    started: bool = False
    """Lifespan startup finished (repository loaded and warmed up)."""
    control: ModelControl | None = None
    """The model control (repository/control.py), once started."""
    draining: bool = False
    """Shutdown began: readiness false, answers close their connections (work is still
    served until the shutdown delay ends and the listener closes)."""
    drain_started: float | None = None
    """time.monotonic() when draining began: one drain budget covers HTTP and batchers."""
    admitted: int = 0
    """Inference requests this process works on (admitted, not yet answered), HTTP and gRPC
    alike: `max_in_flight` bounds them together (`web.middleware`, `api/grpc/front.py`)."""
    arriving: list[Callable[[], int]] = field(default_factory=list)
    """How many inference requests a front that reads bodies itself (the native front) holds
    whose heads came and whose bodies still arrive: `max_in_flight` counts them too."""

    def in_flight(self) -> int:
        """Inference requests against `max_in_flight`: admitted, and still arriving."""
        return self.admitted + sum(count() for count in self.arriving)

    _states: StateCodec | None = None

    @property
    def states(self) -> StateCodec:
        """The state-token codec (`--state-secret-file`; without it every token is a 400)."""
        if self._states is None:
            self._states = StateCodec.from_file(self.settings.state_secret_file)
        return self._states

    peers_started: Callable[[], bool] | None = None
    """Whether every API process of the server accepts since its start (None: this process
    serves alone): the server is ready once they all do (server/accept.py `Slots.started`)."""

    @property
    def ready(self) -> bool:
        return self.started and not self.draining and \
            self.repository.serving(self.settings.readiness) and \
            (self.peers_started is None or self.peers_started())

    def begin_drain(self) -> None:
        if not self.draining:
            log.info("draining: readiness false, serving on until the shutdown delay ends")
            self.drain_started = time.monotonic()
        self.draining = True

    def drain_left(self) -> float:
        """Seconds left of `drain_timeout_s` since draining began (uvicorn's wait for open
        requests spends the same budget, so the process exits inside one drain timeout)."""
        spent = time.monotonic() - (self.drain_started or time.monotonic())
        return max(0.0, self.settings.drain_timeout_s - spent)
