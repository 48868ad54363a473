"""This process's side of the model control (engine/control.py): its table's changes, and
what the routes ask of the control.

`LocalTable` carries out a change here: a version runs in this process's `LocalEngine`
(loaded off the event loop), or in the engine process (loaded there first; here its state is
read again from the engine's `Hello` answer), and the repository gets its worker; a switch
moves the model's default; an unload takes the version out of the repository, then drains it
here (or waits until this process has nothing pending for it in the engine process). In the
hybrid layout with several API processes a bundle that keeps sessions runs in the engine
process: when none ran at start, the supervisor starts it and this process connects to it
(`remote` set) before the bundle's load reaches it; a load that reaches a process without
one is refused (`NO_ENGINE`: each API process would hold its own sessions). With one process
it runs here. It is the `Executor` of the one-process server's `Controller`, and
what an API process does when the supervisor, the table's owner, sends it a change
(server/fleet.py).

`ModelControl` is what the routes (the repository extension, /v1/admin/models) see: the
`Controller` itself in one process, else a link to the supervisor's
(`server.fleet.SupervisorLink`).
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import sys
from pathlib import Path
from typing import Any, Protocol

from seqserve.service.engine.client import EngineClient
from seqserve.service.engine.control import Refused
from seqserve.service.engine.loading import keeps_sessions
from seqserve.service.engine.local import LocalEngine
from seqserve.service.engine.protocol import ModelState
from seqserve.service.repository.entries import ModelRepository

log = logging.getLogger("seqserve.control")

__all__ = ["NO_ENGINE", "LocalTable", "ModelControl", "Refused"]

NO_ENGINE = ("it keeps sessions, which the hybrid layout serves in the engine process, and this "
             "API process is not connected to one")
"""Why an API process of several does not load a bundle with sessions without the engine
process (each would hold its own sessions)."""


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
        """Serve the version here (module doc): None when it is ready, else why not (a
        version that cannot be served is listed failed with the reason: `/v1/models`)."""
        state: ModelState | None
        if self.remote is None and self.repository.settings.sessions_in_engine() \
                and keeps_sessions(path):
            failed = ModelState(name, version, str(path), "failed", NO_ENGINE, None, {})
            await self.repository.add(failed, self.local)  # type: ignore[arg-type]
            return NO_ENGINE
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

    async def unload(self, name: str, version: int, keep_failed: bool = False) -> None:
        """Take the version out (module doc); `keep_failed`: a load that failed elsewhere
        is undone, so a version that failed here stays listed with its reason."""
        found = self.repository.entries.get(name, {}).get(version)
        if keep_failed and found is not None and found.state == "failed":
            return
        entry = self.repository.remove(name, version)
        if entry is None:
            return
        remote = self.remote
        if entry.engine is remote and remote is not None:  # (this order narrows remote)
            if not await remote.settle(name, version, self.drain_timeout_s):
                log.warning("model %s version %d: requests still pending in the engine after "
                            "%.0f s", name, version, self.drain_timeout_s)
        elif self.local is not None:  # (a failed version: only its state to forget)
            await self.local.unload(name, version, self.drain_timeout_s)
            trim_heap()

    def rows(self) -> list[tuple[str, int, str, bool, str | None]]:
        """Every version of the repository as (name, version, path, ready, reason); a version
        loading (an engine restart holds it: it serves again once the engine is back) counts
        as ready for the table, so a table written meanwhile keeps it."""
        return [(e.name, e.version, str(e.path), e.state in ("ready", "loading"), e.reason)
                for versions in self.repository.entries.values() for e in versions.values()]


def trim_heap() -> None:
    """Give the heap pages an unloaded version's runtimes freed back to the system (glibc's
    malloc_trim; elsewhere nothing): without it a process's RSS after many loads and
    unloads depends on where the allocator's free pages happen to lie (measured by
    bench/model_churn.py)."""
    if _LIBC is not None:
        _LIBC.malloc_trim(0)


def _libc() -> Any:
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL("libc.so.6")
        libc.malloc_trim  # noqa: B018 (glibc only)
        return libc
    return None


_LIBC = _libc() if sys.platform.startswith("linux") else None
