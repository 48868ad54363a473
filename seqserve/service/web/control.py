"""This process's side of the model control (engine/control.py): its table's changes, and
what the routes ask of the control.

`LocalTable` carries out a change here: a version runs in this process's `LocalEngine`
(loaded off the event loop), or in the engine process (loaded there first; here its state is
read again from the engine's `Hello` answer), and the repository gets its worker; a switch
moves the model's default; an unload takes the version out of the repository, then drains it
here (or waits until this process has nothing pending for it in the engine process). It is
the `Executor` of the one-process server's `Controller`, and what an API process does when
the supervisor, the table's owner, sends it a change (server/fleet.py).

`ModelControl` is what the routes (the repository extension, /v1/admin/models) see: the
`Controller` itself in one process, else a link to the supervisor's
(`server.fleet.SupervisorLink`).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Protocol

from seqserve.service.engine.client import EngineClient
from seqserve.service.engine.control import Refused
from seqserve.service.engine.loading import keeps_sessions
from seqserve.service.engine.local import LocalEngine
from seqserve.service.engine.protocol import ModelState
from seqserve.service.web.repository import ModelRepository

log = logging.getLogger("seqserve.control")

__all__ = ["LocalTable", "ModelControl", "Refused"]


class ModelControl(Protocol):
    """The model control as the routes see it (module doc); `Refused` (engine.control) says
    why a request is not carried out."""

    @property
    def mode(self) -> str: ...

    async def index(self, ready_only: bool = False) -> list[dict[str, Any]]: ...

    async def load(self, name: str) -> None: ...

    async def unload(self, name: str) -> None: ...


class LocalTable:
    """See the module doc."""

    def __init__(self, repository: ModelRepository, local: LocalEngine | None,
                 remote: EngineClient | None, drain_timeout_s: float,
                 startup_timeout_s: float) -> None:
        self.repository, self.local, self.remote = repository, local, remote
        self.drain_timeout_s = drain_timeout_s
        self.startup_timeout_s = startup_timeout_s

    def in_engine(self, path: Path) -> bool:
        """Whether a version runs in the engine process (engine layout: all; hybrid: those
        that keep sessions)."""
        if self.remote is None:
            return False
        return self.local is None or keeps_sessions(path)

    async def load(self, name: str, version: int, path: Path) -> str | None:
        """Serve the version here (module doc): None when it is ready, else why not."""
        state: ModelState | None
        if self.in_engine(path):
            assert self.remote is not None
            hello = await self.remote.hello(self.startup_timeout_s)
            state = next((m for m in hello.models if (m.name, m.version) == (name, version)),
                         None)
            if state is None:
                return f"the engine process does not serve {name} version {version}"
            engine: Any = self.remote
        else:
            if self.local is None:
                return "this process runs no models of its own"
            state = await self.local.load_version(name, version, path)
            engine = self.local
        entry = await self.repository.add(state, engine)
        return None if entry.state == "ready" else entry.reason or state.reason or "failed"

    async def switch(self, name: str, default: int | None) -> None:
        self.repository.switch(name, default)

    async def unload(self, name: str, version: int) -> None:
        entry = self.repository.remove(name, version)
        if entry is None:
            return
        remote = self.remote
        if remote is not None and entry.engine is remote:
            if not await remote.settle(name, version, self.drain_timeout_s):
                log.warning("model %s version %d: requests still pending in the engine after "
                            "%.0f s", name, version, self.drain_timeout_s)
        elif self.local is not None:  # (a failed version: only its state to forget)
            await self.local.unload(name, version, self.drain_timeout_s)

    def rows(self) -> list[tuple[str, int, str, bool, str | None]]:
        """Every version of the repository as (name, version, path, ready, reason)."""
        return [(e.name, e.version, str(e.path), e.state == "ready", e.reason)
                for versions in self.repository.entries.values() for e in versions.values()]
