"""The composition root of one server process: which bundle runs where, for each layout.

- one process (`--api-workers 0`) and the replicated layout: every bundle in this process's
  `LocalEngine` (in the replicated layout each API process has its own copy);
- the engine layout: every bundle in the engine process (`EngineClient`), none here;
- the hybrid layout: the bundles that keep sessions in the engine process (it reports which
  in its `Hello` answer), every other one in this process's `LocalEngine`.

The layout's counts are resolved here too (`resolved`): `seqserve serve` resolves every
"auto" for the machine before it starts a process (`layout.resolve`, printed at start); a
program that builds its own app with "auto" left (tests, `seqserve translate`,
deploy/gpu_check.py) gets the one-process server's values on one core (one runtime instance
per model with one thread, on CUDA two; two decoder groups), the same on every
machine.

`Composition.start()` connects to the engine process (when there is one) and loads this
process's bundles (what each model's policy serves, `engine.scan.startup_bundles`; an API
process: the supervisor's table, `fleet.TABLE_ENV`, and its defaults), then opens the
repository over those engines; `attach(address)` connects to an engine process the
supervisor started later (the hybrid layout's engine on demand, server/fleet.py);
`start_control()` starts the model control (engine/control.py): its owner here in one
process, else this API process's end of the supervisor's (server/fleet.py); `stop(timeout)`
drains them and closes the connection.

While the engine process is down (the supervisor restarts it), the versions it serves are
marked not ready here (`_engine_changed`: their requests and model-ready endpoints answer 503
+ Retry-After naming the restart) without taking the server out of its load balancer (they
count as `late` meanwhile: the other models serve on); once the new engine answered, each is
ready again, or failed with the reason the engine gives (then readiness says so).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from seqserve.export.manifest import BundleError
from seqserve.service.core.metrics import Metrics
from seqserve.service.engine.client import EngineClient
from seqserve.service.engine.control import Controller
from seqserve.service.engine.interface import Engine
from seqserve.service.engine.loading import RuntimeFactory
from seqserve.service.engine.local import LocalEngine
from seqserve.service.engine.options import EngineOptions
from seqserve.service.engine.scan import read_policy
from seqserve.service.repository.control import LocalTable, ModelControl
from seqserve.service.repository.entries import ModelEntry, ModelRepository
from seqserve.service.server import fleet, layout
from seqserve.service.web.settings import Settings

log = logging.getLogger("seqserve.repository")


class Composition:
    """The engines of one process and the repository over them (see the module doc)."""

    def __init__(self, settings: Settings, metrics: Metrics,
                 runtime_factory: RuntimeFactory | None = None,
                 remote: EngineClient | None = None) -> None:
        self.settings = settings = resolved(settings)
        """The settings this process serves with, every count resolved."""
        self.metrics = metrics
        self.runtime_factory = runtime_factory
        self.remote = remote
        """The engine process's client, when there is one."""
        self.local: LocalEngine | None = None
        """This process's own models, when it runs any."""
        self.repository = ModelRepository(settings, metrics)
        self.control: ModelControl | None = None
        """The model control the routes see, once `start_control` ran."""
        self._owner: Controller | None = None
        self._channel: fleet.ApiEnd | None = None
        self._table: LocalTable | None = None
        self._attaching = asyncio.Lock()
        self._held: dict[tuple[str, int], bool] = {}
        """The engine's versions marked not ready while it restarts: their `late` before."""

    async def start(self, only: str | None = None) -> None:
        """Connect, load and open every bundle version (or every version of model `only`)."""
        engines: list[Engine] = []
        remote: set[tuple[str, int]] = set()
        if self.remote is not None:
            remote = await self._connect(self.remote)
            engines.append(self.remote)
        if self.remote is None or self.settings.layout == "hybrid":
            bundles = [b for b in fleet.startup_table(self.settings)
                       if (b[0], b[1]) not in remote and only in (None, b[0])]
            self.local = LocalEngine(self.settings.engine_options(), self.metrics,
                                     self.runtime_factory)
            await self.local.load(bundles)
            engines.append(self.local)
        await self.repository.open(engines)
        if self.remote is not None:
            self.remote.listeners.append(self._engine_changed)
        for name in self.repository.entries:  # each model's policy default, while ready
            with contextlib.suppress(BundleError):
                default = read_policy(self.settings.repo / name).default
                if default is not None:
                    self.repository.defaults[name] = default
        self.repository.defaults.update(fleet.table_defaults())  # the supervisor's choice

    async def _connect(self, remote: EngineClient) -> set[tuple[str, int]]:
        """Connect to the engine process: its options and process values kept for
        `/v1/admin/config`; the versions it serves."""
        await remote.start()
        hello = await remote.hello(self.settings.startup_timeout_s)
        self.repository.engine_state = {"options": hello.options, "process": hello.process}
        _warn_on_difference(self.settings.engine_options(engine_process=True).to_dict(),
                            hello.options)
        return {(m.name, m.version) for m in hello.models}

    async def attach(self, address: str) -> None:
        """Connect to the engine process the supervisor started while this process serves
        (the hybrid layout's engine on demand: server/fleet.py); the bundles that keep
        sessions load there from then on (`LocalTable.in_engine`)."""
        async with self._attaching:  # the supervisor's word and the table's, once
            if self.remote is not None:
                return
            remote = engine_client(self.settings, address)
            try:
                await self._connect(remote)
            except BaseException:
                await remote.close()
                raise
            self.remote = remote
            self.repository.engines.append(remote)
            remote.listeners.append(self._engine_changed)
            if self._table is not None:
                self._table.remote = remote
        log.info("connected to the engine process the supervisor started (%s)", address)

    def _engine_changed(self) -> None:
        """The engine went down or is back (see the module doc)."""
        remote = self.remote
        assert remote is not None
        entries = [e for versions in self.repository.entries.values()
                   for e in versions.values() if e.engine is remote]
        if remote.down is not None:
            for e in entries:
                if e.state == "ready":
                    self._held[e.name, e.version] = e.late
                    e.state, e.late = "loading", True
                    e.reason = "the engine process is restarting" + (
                        f": {remote.hung}" if remote.hung else "")
            return
        states = {(m.name, m.version): m for m in remote.models()}
        for e in entries:
            if (e.name, e.version) not in self._held:
                continue
            e.late = self._held.pop((e.name, e.version))
            _back(e, states.get((e.name, e.version)))

    async def start_control(self) -> None:
        """The model control (module doc): the owner of the table here (one process), or
        this API process's end of the supervisor's channel."""
        s = self.settings
        table = self._table = LocalTable(self.repository, self.local, self.remote,
                                         s.drain_timeout_s, s.startup_timeout_s)
        channel = fleet.ApiEnd.from_env(table, self.attach, self.settings)
        if channel is not None:
            await channel.start()
            self._channel, self.control = channel, channel.link
            return
        owner = self._owner = Controller(s.repo, s.model_control, table, self.metrics,
                                         s.load_model, s.repository_poll_s)
        owner.adopt(table.rows())
        owner.start()
        self.control = owner

    async def stop(self, timeout: float) -> bool:
        """Drain this process's models within `timeout`, then close the engine connection;
        True when everything admitted was answered."""
        if self._owner is not None:
            await self._owner.stop()
        if self._channel is not None:
            await self._channel.stop()
        drained = await self.repository.stop_all(timeout)
        if self.remote is not None:
            await self.remote.close()
        return drained


def _back(entry: ModelEntry, state: Any) -> None:
    """An engine version after the engine's restart: ready again, or failed with why."""
    if state is not None and state.state == "ready":
        entry.state, entry.reason = "ready", None
        return
    entry.state = "failed"
    entry.reason = "the restarted engine " + (
        f"did not load it: {state.reason}" if state is not None else "does not serve it")
    log.error("model %s version %d: %s", entry.name, entry.version, entry.reason)


def engine_client(settings: Settings, address: str) -> EngineClient:
    """An API process's client of the engine process at `address`."""
    return EngineClient(address, settings.retry_after_s,
                        hang_timeout_s=settings.engine_hang_timeout_s)


def resolved(settings: Settings) -> Settings:
    """`settings` with the layout's counts resolved (see the module doc): as they are when
    `seqserve serve` resolved them, else the one-process server's on one core."""
    if "auto" not in (settings.instances, settings.decode_groups, settings.runtime_calls):
        return settings
    one = settings.model_copy(update={"api_workers": 0}) if settings.api_workers == "auto" \
        else settings
    return layout.resolve(one, available=1)


def engine_options(settings: Settings) -> EngineOptions:
    """The engine options `settings` make once resolved (`resolved`)."""
    return resolved(settings).engine_options()


def _warn_on_difference(expected: dict[str, Any], reported: dict[str, Any]) -> None:
    """Log the engine options that differ from what this process's settings make (a
    supervisor and its children out of step: never expected, worth one loud line)."""
    differ = {k: (expected.get(k), reported.get(k)) for k in expected.keys() | reported.keys()
              if expected.get(k) != reported.get(k)}
    if differ:
        log.warning("the engine runs with options other than this process's settings make "
                    "(setting: (here, engine)): %s", differ)
