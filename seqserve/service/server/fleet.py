"""The model control with several processes: the supervisor owns the table, every process
that serves carries out its changes.

A request reaches one API process, but a model version must change in all of them (and in
the engine process when it runs there) before unpinned requests move to it. So with a
supervisor the `Controller` (engine/control.py) runs there, in a thread of its own
(`SupervisorControl`), and its `Executor` is the `Fleet`:

1. load: the engine process first when the version runs there (`LoadModel` on the engine's
   ZeroMQ socket), then every API process at once (its own copy in the replicated and hybrid
   layouts, else its worker over the engine's new version); a failure anywhere unloads what
   loaded and reports the reason;
2. switch: every API process moves the model's default (after phase 1 succeeded in all);
3. unload: every API process takes the version out of its table and drains it (or waits for
   its requests pending in the engine), then the engine process unloads its copy.

Every process loads a version from the copy the supervisor took of it (`snapshots.py`), never
from the repository: the same bytes everywhere, a restarted process's too, whatever happens
to the repository's files after the copy. A version whose files changed in place is loaded
again from a new copy; while that fails, the copy verified before serves on in every process.
Files that changed but hold the bytes that serve (touched, or put back) give the same copy:
nothing is loaded again.

The engine on demand: a hybrid server with several API processes starts without an engine
process when no bundle keeps sessions. When one is loaded later, the supervisor's watch starts
the engine (`SupervisorControl.engine_wanted`), this thread's client waits for its answer,
every API process connects to it (`ApiEnd`: op "engine"), and then the version loads there as
any other: no restart.

The control channel is one Unix socket per API process (`ApiEnd`, in the supervisor's
private folder) and one for the supervisor (`SupervisorLink`: what an API process's
routes ask, `POST /v2/repository/models/m/load` and the rest, goes to the owner, so a load
through any API process reaches them all): one JSON line each way per call. After every
change the supervisor writes the table (`TABLE_ENV`: the copies that serve, the defaults and
the engine process's address) that a restarted API process (and engine) loads.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from seqserve.service.core.errors import ShuttingDown
from seqserve.service.core.metrics import Metrics
from seqserve.service.engine.client import EngineClient
from seqserve.service.engine.control import READY, UNAVAILABLE, Controller, Refused
from seqserve.service.engine.loading import failure_reason, keeps_sessions
from seqserve.service.engine.scan import fingerprint, startup_bundles
from seqserve.service.repository.control import LocalTable
from seqserve.service.server.snapshots import Snapshots
from seqserve.service.web.settings import Settings

log = logging.getLogger("seqserve.control")

CONTROL_ENV = "SEQSERVE_CONTROL_SOCKET"
"""An API process's own control socket (the supervisor's changes arrive there)."""
OWNER_ENV = "SEQSERVE_SUPERVISOR_SOCKET"
"""The supervisor's socket (an API process's requests to the model control go there)."""
TABLE_ENV = "SEQSERVE_MODEL_TABLE"
"""The table an API process loads at start (JSON: bundles and defaults)."""

Handler = Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]


# -- the channel: one JSON line each way --------------------------------------------------

async def call(path: str, message: dict[str, Any], timeout: float) -> dict[str, Any]:
    """Send one request to the socket at `path`, return its answer."""
    reader, writer = await asyncio.open_unix_connection(path, limit=1 << 24)
    try:
        writer.write(json.dumps(message).encode() + b"\n")
        await writer.drain()
        line = await asyncio.wait_for(reader.readline(), timeout)
    finally:
        writer.close()
    if not line:
        raise ConnectionError(f"{path}: no answer")
    answer: dict[str, Any] = json.loads(line)
    return answer


async def listen(path: str, handler: Handler) -> asyncio.Server:
    """Answer each connection's one request with `handler` (`Refused`: {"refused": why})."""
    async def one(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            message = json.loads(await reader.readline())
            try:
                answer = await handler(message)
            except Refused as exc:
                answer = {"ok": False, "refused": str(exc), "status": exc.status}
            except Exception as exc:  # our fault: said, never left unanswered
                log.exception("model control request %s failed", message.get("op"))
                answer = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
            writer.write(json.dumps(answer).encode() + b"\n")
            await writer.drain()
        except (ConnectionError, ValueError):
            pass
        finally:
            writer.close()

    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    return await asyncio.start_unix_server(one, path, limit=1 << 24)


# -- an API process's end ---------------------------------------------------------------------

def _table() -> dict[str, Any]:
    """The supervisor's table (TABLE_ENV; empty without one, or when it cannot be read)."""
    path = os.environ.get(TABLE_ENV)
    if path:
        with contextlib.suppress(OSError, ValueError):
            data = json.loads(Path(path).read_text())
            if isinstance(data, dict):
                return data
    return {}


def startup_table(settings: Settings) -> list[tuple[str, int, Path]]:
    """The bundles this process loads at start: the supervisor's table, or what each model's
    policy serves (`scan.startup_bundles`)."""
    table = _table()
    if "bundles" in table:
        return [(n, int(v), Path(p)) for n, v, p in table["bundles"]]
    return startup_bundles(settings.repo, settings.model_control, settings.load_model)


def table_defaults() -> dict[str, int]:
    """The defaults of the supervisor's table (none without one)."""
    return {n: int(v) for n, v in _table().get("defaults", {}).items()}


def table_engine() -> str | None:
    """The engine process's address in the supervisor's table (None: no engine process)."""
    address = _table().get("engine")
    return str(address) if address else None


def write_table(path: Path, bundles: list[tuple[str, int, str]], defaults: dict[str, int],
                engine: str | None) -> None:
    """The table a restarted process loads (written whole, then renamed)."""
    data = {"bundles": [[n, v, p] for n, v, p in bundles], "defaults": defaults,
            "engine": engine}
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data))
    tmp.replace(path)


class SupervisorLink:
    """The model control as this API process's routes see it (repository.control.ModelControl):
    every request goes to the supervisor, the table's owner."""

    def __init__(self, path: str, mode: str, timeout: float) -> None:
        self.path, self.mode, self.timeout = path, mode, timeout

    async def _ask(self, message: dict[str, Any]) -> dict[str, Any]:
        try:
            answer = await call(self.path, message, self.timeout)
        except (OSError, TimeoutError) as exc:  # the supervisor stops (or is gone)
            raise ShuttingDown(f"the model control does not answer ({type(exc).__name__})",
                               retry_after=1) from exc
        if "refused" in answer:
            raise Refused(answer["refused"], answer.get("status", 400))
        if "error" in answer:
            raise RuntimeError(answer["error"])
        return answer

    async def index(self, ready_only: bool = False) -> list[dict[str, Any]]:
        rows: list[dict[str, Any]] = (await self._ask({"op": "index", "ready": ready_only}))[
            "rows"]
        return rows

    async def load(self, name: str) -> None:
        await self._ask({"op": "load", "name": name})

    async def unload(self, name: str) -> None:
        await self._ask({"op": "unload", "name": name})


class ApiEnd:
    """An API process's end of the channel: it carries out the supervisor's changes on its
    `LocalTable`, connects to the engine process once the supervisor started one on demand
    (`attach`: at the supervisor's word, or when the table names one as the channel opens),
    and links its routes to the supervisor (`link`)."""

    def __init__(self, table: LocalTable, attach: Callable[[str], Awaitable[None]], own: str,
                 owner: str, mode: str, timeout: float) -> None:
        self.table, self.attach, self.own = table, attach, own
        self.link = SupervisorLink(owner, mode, timeout)
        self.server: asyncio.Server | None = None

    @classmethod
    def from_env(cls, table: LocalTable, attach: Callable[[str], Awaitable[None]],
                 s: Settings) -> ApiEnd | None:
        own, owner = os.environ.get(CONTROL_ENV), os.environ.get(OWNER_ENV)
        if not own or not owner:
            return None
        return cls(table, attach, own, owner, s.model_control, s.startup_timeout_s)

    async def start(self) -> None:
        self.server = await listen(self.own, self.handle)
        address = table_engine()  # started while this process loaded: no word reached it
        if address is not None and self.table.remote is None:
            await self.attach(address)

    async def stop(self) -> None:
        if self.server is not None:
            self.server.close()
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.own)

    async def handle(self, msg: dict[str, Any]) -> dict[str, Any]:
        op = msg["op"]
        if op == "load":
            reason = await self.table.load(msg["name"], msg["version"], Path(msg["path"]))
            return {"ok": reason is None, "reason": reason}
        if op == "switch":
            await self.table.switch(msg["name"], msg["default"])
        elif op == "unload":
            await self.table.unload(msg["name"], msg["version"], bool(msg.get("keep_failed")))
        elif op == "engine":
            await self.attach(msg["address"])
        elif op == "rows":
            return {"ok": True, "rows": self.table.rows()}
        return {"ok": True}


# -- the supervisor's end ---------------------------------------------------------------------

class Fleet:
    """The `Executor` over every process (module doc)."""

    def __init__(self, settings: Settings, sockets: list[str], engine: EngineClient | None,
                 table_file: Path, copies: Snapshots,
                 on_demand: Callable[[], Awaitable[str | None]] | None = None) -> None:
        self.settings, self.sockets, self.engine = settings, sockets, engine
        self.table_file, self.copies = table_file, copies
        self.on_demand = on_demand
        """Starts the engine process for a bundle that keeps sessions (hybrid, several API
        processes, none at start): None once every process reaches it, else why not."""
        self.loaded: dict[tuple[str, int], str] = {}
        """What serves: (name, version) -> its copy (the table file's bundles)."""
        self.defaults: dict[str, int] = {}

    def in_engine(self, path: Path) -> bool:
        if self.engine is None:
            return False
        return self.settings.layout == "engine" or keeps_sessions(path)

    def needs_engine(self, path: Path) -> bool:
        """Whether `path` runs in an engine process this server has not started yet."""
        return self.on_demand is not None and self.settings.sessions_in_engine() \
            and keeps_sessions(path)

    async def _all(self, message: dict[str, Any]) -> list[dict[str, Any]]:
        """`message` to every API process at once; one that is not up (it restarts: it loads
        the table file) answers {"ok": True, "absent": True}."""
        async def one(path: str) -> dict[str, Any]:
            try:
                return await call(path, message, self.settings.startup_timeout_s)
            except (FileNotFoundError, ConnectionRefusedError):
                return {"ok": True, "absent": True}
        return list(await asyncio.gather(*(one(p) for p in self.sockets)))

    async def load(self, name: str, version: int, path: Path) -> str | None:
        """Load the version's copy everywhere (module doc); the copy stays only if it serves."""
        try:
            copy = await asyncio.to_thread(self.copies.copy, name, version, path)
        except OSError as exc:
            return f"its files could not be copied for serving: {failure_reason(exc, path)}"
        if self.loaded.get((name, version)) == str(copy):
            return None  # the bytes that serve (files touched, or put back): nothing to do
        try:
            return await self._load(name, version, copy)
        finally:
            self.copies.collect(self.loaded.values())

    async def _load(self, name: str, version: int, path: Path) -> str | None:
        timeout = self.settings.startup_timeout_s
        again = (name, version) in self.loaded
        if self.needs_engine(path):
            assert self.on_demand is not None
            reason = await self.on_demand()
            if reason is not None:
                return reason
        engine = self.in_engine(path)
        if engine:
            assert self.engine is not None
            state = await self.engine.load_model(name, version, str(path), timeout)
            if state.state != "ready":
                return state.reason or "the engine did not load it"
        answers = await self._all({"op": "load", "name": name, "version": version,
                                   "path": str(path)})
        failed = [a for a in answers if not a.get("ok")]
        if failed:
            if not again:  # what loaded goes again: all or nothing (a failure stays listed)
                await self._unload_everywhere(name, version, engine, keep_failed=True)
            first = failed[0]
            return str(first.get("reason") or first.get("error") or first.get("refused"))
        self.loaded[name, version] = str(path)
        self._write()
        return None

    async def switch(self, name: str, default: int | None) -> None:
        await self._all({"op": "switch", "name": name, "default": default})
        if default is None:
            self.defaults.pop(name, None)
        else:
            self.defaults[name] = default
        self._write()

    async def unload(self, name: str, version: int) -> None:
        self.loaded.pop((name, version), None)
        self._write()
        await self._unload_everywhere(name, version, self.engine is not None)
        self.copies.collect(self.loaded.values())

    async def _unload_everywhere(self, name: str, version: int, engine: bool,
                                 keep_failed: bool = False) -> None:
        await self._all({"op": "unload", "name": name, "version": version,
                         "keep_failed": keep_failed})
        if engine and self.engine is not None:
            await self.engine.unload_model(name, version, self.settings.drain_timeout_s + 5)

    def adopt(self, rows: list[tuple[str, int, str, bool, str | None]],
              defaults: dict[str, int | None]) -> None:
        """The table as the processes report it once up: what is ready, and what the
        startup table holds that no process reports failed (a version still loading there,
        or whose engine is restarting, still serves: a restart must load it)."""
        failed = {(n, v) for n, v, _, ready, reason in rows if not ready and reason}
        try:
            startup = json.loads(self.table_file.read_text())["bundles"]
        except (OSError, ValueError, KeyError):
            startup = []
        for name, version, path in startup:
            if (name, int(version)) not in failed:
                self.loaded[name, int(version)] = str(path)
        for name, version, path, ready, _ in rows:
            if ready:
                self.loaded[name, version] = path
        self.defaults = {n: d for n, d in defaults.items() if d is not None}
        self._write()
        self.copies.collect(self.loaded.values())

    def _write(self) -> None:
        write_table(self.table_file, [(n, v, p) for (n, v), p in sorted(self.loaded.items())],
                    self.defaults, None if self.engine is None else self.engine.address)


class SupervisorControl:
    """The supervisor's model control: the `Controller` over the `Fleet`, on an event loop in
    a thread of its own (the supervisor's own loop watches the processes), and the socket the
    API processes' requests arrive on."""

    def __init__(self, settings: Settings, workdir: Path, api: int, address: str,
                 engine: bool) -> None:
        self.settings = settings
        self.metrics: Metrics | None = None
        self.own = str(workdir / "control.sock")
        self.sockets = [api_socket(workdir, i) for i in range(api)]
        self.address = address
        """The engine process's address (whether or not it runs)."""
        self.with_engine = engine
        """Whether the engine process runs from the start (else it starts on demand)."""
        self.engine_wanted = threading.Event()
        """Set when a bundle that keeps sessions needs the engine process this server started
        without: the supervisor's watch starts it."""
        self.table_file = workdir / "models.json"
        self.copies = Snapshots(workdir / "bundles")
        self.prints: dict[tuple[str, int], str] = {}
        """The fingerprints of the versions copied at start, taken before the copy: the
        model control's starting point (a change after them reloads)."""
        self.controller: Controller | None = None
        self.adopted = threading.Event()
        self.engine_down: str | None = None
        """Why the engine process last ended (the supervisor's words, its restart's backoff
        included): the reason the index gives its versions while it is down."""
        self._fleet: Fleet | None = None
        self._demand: EngineClient | None = None
        """This thread's client of the engine started on demand, until every process has it."""
        self.hung = threading.Event()
        """Set when the engine answered nothing for `engine_hang_timeout_s` (this thread's
        `EngineClient` pings it): the supervisor's watch kills it and starts another."""
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._run, name="model-control", daemon=True)
        write_table(self.table_file, self._startup_copies(), {}, address if engine else None)

    def _startup_copies(self) -> list[tuple[str, int, str]]:
        """The copies of what the processes load at start (a version whose files cannot be
        copied is left out, with why in the log: the model control tries it again)."""
        s = self.settings
        out = []
        for name, version, path in startup_bundles(s.repo, s.model_control, s.load_model):
            self.prints[name, version] = fingerprint(path)  # before the copy reads them
            try:
                out.append((name, version, str(self.copies.copy(name, version, path))))
            except OSError as exc:
                log.error("model %s version %d not served: its files could not be copied "
                          "for serving: %s", name, version, failure_reason(exc, path))
        return out

    def env(self, slot: int) -> dict[str, str]:
        """What API process `slot` needs of the channel (its environment)."""
        return {CONTROL_ENV: self.sockets[slot], OWNER_ENV: self.own,
                TABLE_ENV: str(self.table_file)}

    def start(self, metrics: Metrics) -> None:
        """Run it (its events into `metrics`) until `stop`."""
        self.metrics = metrics
        self._thread.start()

    def stop(self) -> None:
        """End the model control (a change under way is cut short: draining comes next)."""
        if self._loop is not None and self._stop is not None:
            with contextlib.suppress(RuntimeError):  # its loop already ended
                self._loop.call_soon_threadsafe(self._stop.set)
        if self._thread.ident is not None:
            self._thread.join(10)

    def _run(self) -> None:
        try:
            asyncio.run(self._main())
        except Exception:
            log.exception("the model control stopped")

    async def _main(self) -> None:
        self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
        s = self.settings
        engine = await self._client() if self.with_engine else None
        fleet = self._fleet = Fleet(s, self.sockets, engine, self.table_file, self.copies,
                                    None if self.with_engine else self._engine_on_demand)
        assert self.metrics is not None
        self.controller = Controller(s.repo, s.model_control, fleet, self.metrics,
                                     s.load_model, s.repository_poll_s)
        server = await listen(self.own, self._handle)
        try:
            rows = await self._rows()
            if rows is None:
                return
            self.controller.adopt(rows, self.prints)
            fleet.adopt(rows, self.controller.defaults)
            self.adopted.set()
            self.controller.start()
            await self._stop.wait()
        finally:
            server.close()
            await self.controller.stop()
            for client in (fleet.engine, self._demand):
                if client is not None:
                    await client.close()

    async def _client(self) -> EngineClient:
        """This thread's client of the engine process (its heartbeat tells the supervisor's
        watch of a hang: `hung`)."""
        s = self.settings
        engine = EngineClient(self.address, s.retry_after_s,
                              hang_timeout_s=s.engine_hang_timeout_s)
        engine.hang_listeners.append(self.hung.set)
        await engine.start()
        return engine

    async def _engine_on_demand(self) -> str | None:
        """The engine process for a bundle that keeps sessions (module doc): None once it
        answered and every API process connected to it, else why not (the load fails with
        it; the next load of such a bundle tries again)."""
        fleet = self._fleet
        assert fleet is not None
        if fleet.engine is not None:
            return None
        if self._demand is None:
            log.info("a bundle that keeps sessions is loaded: starting the engine process")
            self.engine_wanted.set()
            self._demand = await self._client()
        timeout = self.settings.startup_timeout_s
        try:
            await self._demand.hello(timeout)
        except Exception as exc:
            return f"the engine process started for it did not answer within {timeout:g} s " \
                   f"({type(exc).__name__}: {exc})"
        fleet.engine = self._demand
        fleet._write()  # a process that starts from now on connects to it
        answers = await fleet._all({"op": "engine", "address": self.address})
        failed = [a for a in answers if not a.get("ok")]
        if failed:
            fleet.engine = None
            fleet._write()
            return f"an API process did not connect to the engine process started for it: " \
                   f"{failed[0].get('error') or failed[0]}"
        self._demand = None
        return None

    def _engine_rows(self, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The index's rows, those of versions the engine serves UNAVAILABLE with the reason
        while the engine is down (dead, restarting after its backoff, or hung)."""
        fleet = self._fleet
        engine = None if fleet is None else fleet.engine
        if fleet is None or engine is None or engine.down is None:
            return rows
        why = self.engine_down or engine.down
        for row in rows:
            key = (row["name"], int(row["version"] or 0))
            copy = fleet.loaded.get(key)  # what serves (not the repository's files)
            if row["state"] == READY and copy is not None and fleet.in_engine(Path(copy)):
                row["state"], row["reason"] = UNAVAILABLE, why
        return rows

    async def _rows(self) -> list[tuple[str, int, str, bool, str | None]] | None:
        """Every API process's table once each is up: a version is ready where it is ready
        in every one (else failed, with the first reason)."""
        assert self._stop is not None
        merged: dict[tuple[str, int], tuple[str, int, str, bool, str | None]] = {}
        for path in self.sockets:
            while True:
                if self._stop.is_set():
                    return None
                try:
                    answer = await call(path, {"op": "rows"}, self.settings.startup_timeout_s)
                    break
                except (FileNotFoundError, ConnectionRefusedError):
                    await asyncio.sleep(0.2)  # not up yet
            for name, version, where, ready, reason in answer["rows"]:
                before = merged.get((name, version))
                if before is None or (before[3] and not ready):
                    merged[name, version] = (name, version, where, ready, reason)
        return sorted(merged.values())

    async def _handle(self, msg: dict[str, Any]) -> dict[str, Any]:
        while not self.adopted.is_set():  # the processes are still starting
            await asyncio.sleep(0.1)
        controller = self.controller
        assert controller is not None
        op = msg["op"]
        if op == "index":
            rows = self._engine_rows(await controller.index())
            if msg.get("ready"):
                rows = [r for r in rows if r["state"] == READY]
            return {"ok": True, "rows": rows}
        if op == "load":
            await controller.load(msg["name"])
        elif op == "unload":
            await controller.unload(msg["name"])
        return {"ok": True}


def api_socket(workdir: Path, slot: int) -> str:
    return str(workdir / f"control-{slot}.sock")
