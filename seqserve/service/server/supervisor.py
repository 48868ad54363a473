"""The supervisor of `seqserve serve`: one engine process, N API processes, one port.

With `layout = "replicated"` there is no engine process: each API process loads its own
copy of every model (the one-process server, N times over the one port); everything below
holds without the engine's part. With `layout = "hybrid"` (what `auto` picks on a CPU) the
same, except that the bundles that keep sessions run in one engine process, started only
when there is more than one API process and the repository has such bundles at start
(`needs_engine`) or the model control loads one later (on demand: the model control sets
`SupervisorControl.engine_wanted`, this watch starts the engine, which is restarted from
then on like one there from the start).

It binds the listening socket once (every API process inherits it and accepts on it, the
least loaded process taking each new connection: accept.py's shared counters), starts
the engine (`python -m seqserve.service.engine`) and the API processes (`python -m
seqserve.service.server.api_process`), and watches them:

- a child that exits, an API process or the engine, is restarted (its live gauges are marked
  dead). A restarted engine loads the current model table (the one the model control keeps,
  `fleet.Fleet`'s file, `ENGINE_TABLE_ENV`), and the API processes' engine clients connect
  to it again by themselves (engine/client.py). Meanwhile the other models serve on: in the
  hybrid layout every model an API process runs itself; the engine's models answer 503 +
  Retry-After and their model-ready endpoints say not ready (`composition.Composition`),
  while the server's readiness stays true unless the engine stays away longer than
  `client.RESTART_BOUND_S`; sessions the dead engine held are gone (their next chunk: 404
  naming the restart).
- a hung engine (its model control's `EngineClient` heard nothing for
  `engine_hang_timeout_s`: `fleet.SupervisorControl.hung`) is killed and restarted the same
  way; `seqserve_engine_restarts_total{reason}` counts each restart (exit, hang);
- crash loops are contained per role: the `MAX_DEATHS`th death of an API process within
  `DEATH_WINDOW_S` (5 in 30 s) ends the server non-zero, after draining what still runs; a
  dying engine is restarted with backoff instead (`engine_backoff_s`: its first death in the
  window at once, then `engine_restart_backoff_s` doubled each time, capped at
  `ENGINE_BACKOFF_MAX_S`), its models answering 503 + Retry-After meanwhile with the reason
  in the repository index (`SupervisorControl.engine_down`), the other models serving on;
- SIGTERM or SIGINT drains: the API processes first (readiness false, `shutdown_delay_s` of
  serving as usual with `Connection: close`, then they stop listening, read and answer what
  their connections already sent, and answer what they admitted, which still needs the
  engine), each given `api_stop_bound_s` (delay + drain + margin) before it is killed; then
  the engine, given `engine_stop_bound_s`. A second signal stops at once.

Every child gets the settings as SEQSERVE_* variables and `PROMETHEUS_MULTIPROC_DIR`, so
`/metrics` of any API process reports all of them (the supervisor's own too: the model
control's events).

The supervisor owns the model table (server/fleet.py): its model control polls the
repository or takes the API processes' load and unload requests, and changes every process's
table in two phases (load everywhere, then switch the default); every process loads the
supervisor's copy of each version (server/snapshots.py, in its private folder), so all serve
the same verified bytes whatever happens to the repository's files.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType

from pydantic import SecretStr

from seqserve.models.errors import UserError
from seqserve.service.core.metrics import MULTIPROC_ENV, Metrics, shared_metrics
from seqserve.service.core.process import SUPERVISOR_ENV
from seqserve.service.engine.loading import engine_bundles
from seqserve.service.engine.options import ADDRESS_ENV, OPTIONS_ENV
from seqserve.service.engine.server import ENGINE_TABLE_ENV
from seqserve.service.server.accept import GONE, SLOT_ENV, SLOTS_ENV, STARTING, Slots
from seqserve.service.server.api_process import LISTEN_FD_ENV
from seqserve.service.server.fleet import SupervisorControl
from seqserve.service.web.auth import key_file_path
from seqserve.service.web.settings import Settings

log = logging.getLogger("seqserve.supervisor")

DEATH_WINDOW_S = 30.0
MAX_DEATHS = 5
"""The API processes' crash-loop rule: the MAX_DEATHS-th death of one within DEATH_WINDOW_S
ends the server non-zero (after a drain of what still runs). The engine's deaths are not
counted there: it is restarted with backoff (`engine_backoff_s`)."""
ENGINE_BACKOFF_MAX_S = 30.0
"""The longest delay before a crash-looping engine is started again."""
STOP_MARGIN_S = 5.0
"""Beyond a child's own stop budget, before the supervisor kills it: what its exit takes
(the lifespan's shutdown, closing its sockets, the interpreter's exit)."""


def api_stop_bound_s(settings: Settings) -> float:
    """How long an API process may take to stop after SIGTERM: `shutdown_delay_s` of
    serving as usual, then its drain (`drain_timeout_s`: the requests it admitted, then its
    own models' batchers), then `STOP_MARGIN_S`. Killing it sooner cut its drain short (the
    old stop timeout equalled the delay: SIGKILL 2 ms into the drain)."""
    return settings.shutdown_delay_s + settings.drain_timeout_s + STOP_MARGIN_S


def engine_stop_bound_s(settings: Settings) -> float:
    """How long the engine may take to stop after SIGTERM (sent once every API process
    stopped): its drain (`drain_timeout_s`), then `STOP_MARGIN_S`."""
    return settings.drain_timeout_s + STOP_MARGIN_S


def settings_env(settings: Settings) -> dict[str, str]:
    """The SEQSERVE_* variables that make a child's `Settings()` equal `settings`."""
    env = {}
    for name, value in settings.model_dump().items():
        if value is None:
            continue  # the field's default, None
        if isinstance(value, SecretStr):
            continue  # secrets travel in files (Supervisor.key_file), never in environments
        if isinstance(value, bool):
            text = "true" if value else "false"
        elif isinstance(value, list | tuple):
            text = ",".join(str(v) for v in value)
        else:
            text = str(value)
        env[f"SEQSERVE_{name.upper()}"] = text
    return env


def listen(host: str, port: int) -> socket.socket:
    """The server's listening socket, bound once, inheritable by the API processes.
    (proto IPPROTO_TCP: asyncio then sets TCP_NODELAY on accepted connections.)"""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def engine_backoff_s(deaths: int, first_s: float) -> float:
    """The delay before restarting an engine whose `deaths`-th death within DEATH_WINDOW_S
    this is: none for the first (a one-off crash restarts at once), then `first_s` doubled at
    each further death, at most ENGINE_BACKOFF_MAX_S."""
    if deaths <= 1:
        return 0.0
    return min(first_s * 2.0 ** min(deaths - 2, 32), ENGINE_BACKOFF_MAX_S)


def needs_engine(settings: Settings) -> bool:
    """Whether the server starts with an engine process: always in the engine layout; in the
    hybrid one when several API processes serve a repository with bundles that keep sessions
    (else the model control starts it on demand, once such a bundle is loaded)."""
    if settings.layout == "engine":
        return True
    return settings.sessions_in_engine() and bool(engine_bundles(settings.engine_options()))


@dataclass
class Child:
    role: str
    proc: subprocess.Popen[bytes]
    started: float = field(default_factory=time.monotonic)
    ended: str = "exit"
    """Why it ended: exit (by itself), hang (killed: it answered nothing)."""


class Supervisor:
    """See the module doc. `run()` returns the process exit status."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.workdir = Path(tempfile.mkdtemp(prefix="seqserve-"))
        self.metrics_dir = self.workdir / "metrics"
        self.metrics_dir.mkdir()
        self.address = f"ipc://{self.workdir / 'engine.sock'}"
        self.key_file = self._key_file(settings)
        """Where the API processes read the API keys (no child's environment holds one)."""
        self.sock: socket.socket | None = None
        self.engine: Child | None = None
        self.api: list[Child] = []
        self.deaths: list[float] = []
        """When API processes died, within DEATH_WINDOW_S (the crash-loop rule)."""
        self.engine_deaths: list[float] = []
        self.engine_due: float | None = None
        """When the engine, dead, is started again (time.monotonic(); None: it runs)."""
        self.engine_ended = "exit"
        self.metrics: Metrics | None = None
        """This process's instruments (the model control's events, engine restarts)."""
        self.signals = 0
        self.with_engine = needs_engine(settings)
        self.slots_path = self.workdir / "connections"
        self.slots: Slots | None = None
        """Each API process's open connections (accept.py), with more than one."""
        if int(settings.api_workers) > 1:
            self.slots = Slots(Slots.create(self.slots_path, int(settings.api_workers)))
        self.control = SupervisorControl(settings, self.workdir, int(settings.api_workers),
                                         self.address, self.with_engine)
        """The owner of the model table (server/fleet.py): its changes reach every process."""

    def _key_file(self, settings: Settings) -> Path | None:
        """The keys' file for the children: the one configured, or the keys given inline
        written to this server's private folder (mode 0600, removed at exit)."""
        path = key_file_path(settings.api_key, settings.api_key_file)
        if path is not None or settings.api_key is None:
            return path.resolve() if path is not None else None
        path = self.workdir / "api-keys"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(settings.api_key.get_secret_value() + "\n")
        return path

    # -- processes --------------------------------------------------------------------

    def _env(self) -> dict[str, str]:
        env = {**os.environ, **settings_env(self.settings)}
        env.pop("SEQSERVE_API_KEY", None)  # the children read the keys from a file
        if self.key_file is not None:
            env["SEQSERVE_API_KEY_FILE"] = str(self.key_file)
        env[MULTIPROC_ENV] = str(self.metrics_dir)
        env.pop(ADDRESS_ENV, None)  # an API process reads it in the model table, if any
        env[SUPERVISOR_ENV] = str(os.getpid())  # children stop when this process dies
        return env

    def _start_engine(self) -> Child:
        self.control.hung.clear()  # of an engine before this one
        env = self._env()
        env[ADDRESS_ENV] = self.address
        env[OPTIONS_ENV] = self.settings.engine_options(engine_process=True).to_json()
        env[ENGINE_TABLE_ENV] = str(self.control.table_file)  # a restart loads what serves
        proc = subprocess.Popen([sys.executable, "-m", "seqserve.service.engine"], env=env)
        return Child("engine", proc)

    def _start_api(self, slot: int) -> Child:
        assert self.sock is not None
        env = self._env()
        env[LISTEN_FD_ENV] = str(self.sock.fileno())
        env.update(self.control.env(slot))
        if self.slots is not None:
            if self.slots[slot] != STARTING:  # a replacement: GONE until it accepts (a dead
                self.slots[slot] = GONE  # one's count must not stay); STARTING at the start
            env[SLOTS_ENV], env[SLOT_ENV] = str(self.slots_path), str(slot)
        proc = subprocess.Popen(
            [sys.executable, "-m", "seqserve.service.server.api_process"], env=env,
            pass_fds=(self.sock.fileno(),))
        return Child("api", proc)

    # -- the watch loop -------------------------------------------------------------------

    def run(self) -> int:
        s = self.settings
        if s.grpc:
            self._check_grpc_port()
        self.sock = listen(s.host, s.port)
        host, port = self.sock.getsockname()[:2]
        log.info("listening on http://%s:%d", host, port)
        if s.grpc:
            log.info("gRPC on port %d, bound by every API process (SO_REUSEPORT)", s.grpc_port)
        previous = {sig: signal.signal(sig, self._on_signal)
                    for sig in (signal.SIGTERM, signal.SIGINT)}
        try:
            if self.with_engine:
                self.engine = self._start_engine()
            else:
                log.info("%s layout: %d API processes, each with its own models, no engine "
                         "process", s.layout, int(s.api_workers))
            self.api = [self._start_api(i) for i in range(int(s.api_workers))]
            # this process's own metrics (the model control's) beside its children's
            self.metrics = shared_metrics(str(self.metrics_dir))
            self.metrics.watch_process("supervisor")
            self.control.start(self.metrics)
            return self._watch()
        finally:
            self.control.stop()
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            self._kill_all()
            shutil.rmtree(self.workdir, ignore_errors=True)

    def _check_grpc_port(self) -> None:
        """Every API process binds grpc_port with SO_REUSEPORT, which would silently share
        the connections with another server listening there the same way: a UserError
        instead when anything listens there now."""
        from seqserve.service.api.grpc.server import check_free

        try:
            check_free(self.settings.host, self.settings.grpc_port)
        except RuntimeError as exc:
            shutil.rmtree(self.workdir, ignore_errors=True)
            raise UserError(str(exc)) from exc

    def _on_signal(self, sig: int, frame: FrameType | None) -> None:
        self.signals += 1

    def _watch(self) -> int:
        while not self.signals:
            engine = self.engine
            if engine is not None and self.control.hung.is_set():
                self._kill_hung(engine)
            if engine is not None and engine.proc.poll() is not None:
                self._engine_died(engine)
            if not self.with_engine and self.control.engine_wanted.is_set():
                self.with_engine = True  # from now on restarted like one there from the start
                self.engine = self._start_engine()
            if self.engine_due is not None and time.monotonic() >= self.engine_due:
                self.engine_due = None
                self.engine = self._start_engine()
                if self.metrics is not None:
                    self.metrics.engine_restarts.labels(reason=self.engine_ended).inc()
            for i, child in enumerate(self.api):
                if child.proc.poll() is not None:
                    if not self._died(child):
                        return 1
                    log.error("API process %d exited (status %s): restarting it",
                              child.proc.pid, child.proc.returncode)
                    self.api[i] = self._start_api(i)
            time.sleep(0.1)
        return self._drain()

    def _kill_hung(self, engine: Child) -> None:
        """The model control's engine client heard nothing from the engine for
        `engine_hang_timeout_s` (fleet.SupervisorControl.hung): SIGKILL it (a stopped
        process too); the watch then restarts it as it does a dead one."""
        self.control.hung.clear()
        if engine.proc.poll() is None:
            log.error("the engine process %d answered nothing for %g s (hung): killing it",
                      engine.proc.pid, self.settings.engine_hang_timeout_s)
            engine.ended = "hang"
            engine.proc.kill()
            engine.proc.wait()

    def _engine_died(self, engine: Child) -> None:
        """Restart the engine, at once or after its backoff (`engine_backoff_s`); its models
        are reported failed with why meanwhile (`SupervisorControl.engine_down`)."""
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(engine.proc.pid, str(self.metrics_dir))
        now = time.monotonic()
        self.engine_deaths = [t for t in self.engine_deaths if now - t < DEATH_WINDOW_S] + [now]
        delay = engine_backoff_s(len(self.engine_deaths), self.settings.engine_restart_backoff_s)
        how = "killed: it hung" if engine.ended == "hang" else \
            f"exited with status {engine.proc.returncode}"
        why = f"the engine process {how}"
        if delay:
            why += (f"; {len(self.engine_deaths)} deaths in {DEATH_WINDOW_S:.0f} s (a crash "
                    f"loop): restarting it in {delay:g} s (--engine-restart-backoff-s)")
        log.error("%s; its models answer 503 meanwhile, the others serve on%s", why,
                  "" if delay else "; restarting it")
        self.control.engine_down = why
        self.engine, self.engine_ended, self.engine_due = None, engine.ended, now + delay

    def _died(self, child: Child) -> bool:
        """Count an API process's death (the crash-loop rule, `MAX_DEATHS`); False: give up,
        after draining what still runs."""
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(child.proc.pid, str(self.metrics_dir))
        now = time.monotonic()
        self.deaths = [t for t in self.deaths if now - t < DEATH_WINDOW_S] + [now]
        if len(self.deaths) < MAX_DEATHS:
            return True
        log.error("%s process %d exited (status %s): %d deaths of API processes in %.0f s, "
                  "giving up", child.role, child.proc.pid, child.proc.returncode, len(self.deaths),
                  DEATH_WINDOW_S)
        self.control.stop()
        self._stop_api(timeout=api_stop_bound_s(self.settings))
        self._stop(self.engine, timeout=engine_stop_bound_s(self.settings))
        return False

    # -- drain ----------------------------------------------------------------------------

    def _drain(self) -> int:
        """API processes first (they still need the engine), then the engine, each within
        its stop bound (`api_stop_bound_s`, `engine_stop_bound_s`)."""
        s = self.settings
        if self.engine is not None:
            log.info("draining: API processes first (%.0f s bound), then the engine (%.0f s)",
                     api_stop_bound_s(s), engine_stop_bound_s(s))
        else:
            log.info("draining the API processes (%.0f s bound)", api_stop_bound_s(s))
        self.control.stop()  # no change of the table while draining
        if self.sock is not None:
            self.sock.close()  # the API processes hold their own copies until they stop
        self._stop_api(timeout=api_stop_bound_s(s))
        self._stop(self.engine, timeout=engine_stop_bound_s(s))
        failed = [c for c in [*self.api, self.engine] if c and c.proc.returncode not in (0,)]
        for c in failed:
            log.warning("%s process %d exited with status %s", c.role, c.proc.pid,
                        c.proc.returncode)
        return 0

    def _stop_api(self, timeout: float) -> None:
        for child in self.api:
            if child.proc.poll() is None:
                child.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for child in self.api:
            self._wait(child, deadline)

    def _stop(self, child: Child | None, timeout: float) -> None:
        if child is None or child.proc.poll() is not None:
            return
        child.proc.send_signal(signal.SIGTERM)
        self._wait(child, time.monotonic() + timeout)

    def _wait(self, child: Child, deadline: float) -> None:
        while child.proc.poll() is None:
            if self.signals > 1 or time.monotonic() > deadline:
                log.warning("%s process %d did not stop in time: killing it", child.role,
                            child.proc.pid)
                child.proc.kill()
                child.proc.wait()
                return
            time.sleep(0.05)

    def _kill_all(self) -> None:
        for child in [*self.api, self.engine]:
            if child is not None and child.proc.poll() is None:
                child.proc.kill()
                child.proc.wait()
