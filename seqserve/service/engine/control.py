"""The model control: the owner of the model table, which changes while the server serves.

One `Controller` per server, in the process that owns the table: the one-process server
itself, else the supervisor (every API process and the engine process then carry out its
changes: `server/fleet.py`). It scans the repository (`engine.scan`) every
`repository_poll_s` (`--model-control poll`), or on request (`explicit`: `load(name)`,
`unload(name)`; `none`: never), and turns what it finds into changes, each carried out by an
`Executor` in two phases:

1. `load(name, version, path)`: verify, open and warm the version up wherever it will run
   (every process that runs it), off the event loops: the serving version answers meanwhile;
   a failure (its reason) leaves the table as it was;
2. `switch(name, default)`: once it is ready everywhere, unpinned requests go to the new
   default (each model's policy default while ready, else its highest ready version);
3. `unload(name, version)`: a version no longer wanted (removed from disk, out of its policy)
   leaves the table: pinned requests to it are 404 from then on, what it admitted finishes
   (batches, beam searches, streams; its sessions until they end or expire), then its
   runtimes are freed.

A version that fails to load never replaces a serving one: it is listed UNAVAILABLE with its
reason (and the model's serving version, even one its policy no longer wants, serves on) and
it is tried again only when its files change (`scan.fingerprint`). A serving version whose
files changed in place and do not load serves on from the copy verified when it loaded (with
a supervisor, the copy every process loads from: server/snapshots.py): READY, with the change
and why in the index's reason, `seqserve_model_files_changed` 1 and an error in the log. A
model whose policy.json cannot be read keeps what it serves; the index says why.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from seqserve.service.core.metrics import Metrics
from seqserve.service.engine.scan import Found, Mode, ModelDir, scan

log = logging.getLogger("seqserve.control")

READY, UNAVAILABLE, LOADING, UNLOADING = "READY", "UNAVAILABLE", "LOADING", "UNLOADING"
"""Triton's model states (the repository index)."""


class Executor(Protocol):
    """Carries out the table's changes in every process that serves (module doc)."""

    async def load(self, name: str, version: int, path: Path) -> str | None:
        """Load (or, same version, reload) everywhere: None when ready, else why not."""
        ...

    async def switch(self, name: str, default: int | None) -> None: ...

    async def unload(self, name: str, version: int) -> None: ...


@dataclass
class Version:
    """One version in the table."""

    version: int
    path: str
    print: str
    """Its files' fingerprint when it was loaded (or failed)."""
    state: str
    reason: str | None = None
    failed: str | None = None
    """The fingerprint its last load failed with: not tried again until its files change."""


class Refused(Exception):
    """A request the model control does not carry out, with its HTTP status: 400 a load that
    failed (the reason), 404 a model it does not know, 409 what its mode does not allow."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


class Controller:
    """See the module doc."""

    def __init__(self, repo: str | Path, mode: Mode, executor: Executor, metrics: Metrics,
                 load_models: Iterable[str] = (), poll_s: float = 5.0) -> None:
        self.repo, self.mode, self.executor = Path(repo), mode, executor
        self.metrics = metrics
        self.poll_s = poll_s
        self.table: dict[str, dict[int, Version]] = {}
        self.defaults: dict[str, int | None] = {}
        self.requested: set[str] = set(load_models) if mode == "explicit" else set()
        """explicit: the models loaded on request (and at start)."""
        self.problems: dict[str, str] = {}
        """Models whose policy.json cannot be read: why."""
        self.last_scan: float | None = None
        self.lock = asyncio.Lock()
        """One change at a time (the poll's and the requests')."""
        self._task: asyncio.Task[None] | None = None

    # -- start and stop -------------------------------------------------------------------

    def adopt(self, rows: Iterable[tuple[str, int, str, bool, str | None]],
              prints: Mapping[tuple[str, int], str] | None = None) -> None:
        """The versions loaded at start, as (name, version, path, ready, reason): the table
        the changes start from, with their files' fingerprints as `prints` gives them (taken
        before they were read for loading: a change since then is a change), else as they
        are now."""
        rows = list(rows)
        found = scan(self.repo, {r[0] for r in rows})
        for name, version, path, ready, reason in rows:
            for outcome in ("ready", "failed"):  # every series exists from the start, at 0
                self.metrics.loads.labels(name, str(version), outcome)
            self.metrics.unloads.labels(name, str(version))
            self.metrics.files_changed.labels(name, str(version))
            on_disk = found.get(name, ModelDir(name)).versions.get(version)
            now = on_disk.print if on_disk is not None else ""
            if prints is not None and (name, version) in prints:
                now = prints[name, version]
            self.table.setdefault(name, {})[version] = Version(
                version, path, now, READY if ready else UNAVAILABLE, reason,
                None if ready else now)
            if self.mode == "explicit":
                self.requested.add(name)
        for name, versions in self.table.items():
            policy = found[name].policy if name in found else None
            serving = [v for v, e in versions.items() if e.state == READY]
            self.defaults[name] = (policy.choose_default(serving) if policy is not None
                                   else max(serving, default=None))
            self._count(name)

    def start(self) -> None:
        """Poll the repository (mode poll) until `stop`."""
        if self.mode == "poll" and self._task is None:
            self._task = asyncio.ensure_future(self._poll_forever())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    async def _poll_forever(self) -> None:
        while True:
            await asyncio.sleep(self.poll_s)
            try:
                await self.sync()
            except Exception:  # a bad scan must not end the polling
                log.exception("the repository scan failed")

    # -- changes ---------------------------------------------------------------------------

    async def sync(self, names: Iterable[str] | None = None, retry: bool = False) -> None:
        """Scan the repository (or the folders of `names`) and carry out every change;
        `retry`: load the versions that failed again even if their files did not change (a
        load request)."""
        async with self.lock:
            only = None if names is None else sorted(set(names))
            found = await asyncio.to_thread(scan, self.repo, only)
            self.last_scan = time.time()
            self.metrics.last_scan.set(self.last_scan)
            for name in sorted(set(found) | set(self.table) if only is None else only):
                await self._reconcile(name, found.get(name), retry)

    async def _reconcile(self, name: str, model: ModelDir | None, retry: bool) -> None:
        if model is not None and model.error is not None:
            if self.problems.get(name) != model.error:
                log.error("model %s: %s (what it serves stays)", name, model.error)
            self.problems[name] = model.error
            return
        self.problems.pop(name, None)
        wanted = model is not None and (self.mode != "explicit" or name in self.requested)
        targets = model.wanted() if model is not None and wanted else {}
        current = self.table.setdefault(name, {})
        for version, found in sorted(targets.items()):
            now = current.get(version)
            if now is None or found.print not in (now.print, now.failed) \
                    or (retry and now.failed is not None):
                await self._load(name, found, now)
        keep = set(targets)
        ready = [v for v in keep if v in current and current[v].state == READY]
        serving = self.defaults.get(name)
        if not ready and serving is not None and model is not None and wanted \
                and serving in model.versions and serving in current \
                and current[serving].state == READY:
            keep.add(serving)  # a failed replacement never replaces the serving version
            ready = [serving]
        chosen = model.policy.choose_default(ready) if model is not None else None
        if chosen != serving and (chosen is not None or name in self.defaults):
            await self.executor.switch(name, chosen)
            log.info("model %s: default version %s (was %s)", name, chosen, serving)
        self.defaults[name] = chosen
        for version in sorted(set(current) - keep):
            await self._unload(name, version)
        self._count(name)
        if not current:
            del self.table[name]
            self.defaults.pop(name, None)

    async def _load(self, name: str, found: Found, now: Version | None) -> None:
        versions = self.table[name]
        reload = now is not None and now.state == READY
        if not reload:
            versions[found.version] = Version(found.version, str(found.path), found.print,
                                              LOADING)
        started = time.monotonic()
        reason = await self.executor.load(name, found.version, found.path)
        seconds = time.monotonic() - started
        outcome = "ready" if reason is None else "failed"
        self.metrics.loads.labels(name, str(found.version), outcome).inc()
        changed = self.metrics.files_changed.labels(name, str(found.version))
        if reason is None:
            versions[found.version] = Version(found.version, str(found.path), found.print,
                                              READY)
            changed.set(0)
            log.info("model %s version %d %s everywhere in %.2f s", name, found.version,
                     "reloaded" if reload else "loaded", seconds)
            return
        if reload and now is not None:  # the loaded copy serves on
            now.reason = f"its files changed in the repository and do not load (the copy " \
                         f"verified when it loaded serves on): {reason}"
            now.failed = found.print
            changed.set(1)
            log.error("model %s version %d: %s (%.2f s)", name, found.version, now.reason,
                      seconds)
            return
        log.error("model %s version %d failed to load (%.2f s): %s", name, found.version,
                  seconds, reason)
        versions[found.version] = Version(found.version, str(found.path), found.print,
                                          UNAVAILABLE, reason, found.print)

    async def _unload(self, name: str, version: int) -> None:
        entry = self.table[name][version]
        was = entry.state
        entry.state = UNLOADING
        started = time.monotonic()
        await self.executor.unload(name, version)
        del self.table[name][version]
        self.metrics.files_changed.labels(name, str(version)).set(0)
        if was != UNAVAILABLE:
            self.metrics.unloads.labels(name, str(version)).inc()
            log.info("model %s version %d unloaded everywhere in %.2f s", name, version,
                     time.monotonic() - started)

    def _count(self, name: str) -> None:
        ready = sum(e.state == READY for e in self.table.get(name, {}).values())
        self.metrics.versions_loaded.labels(name).set(ready)

    # -- requests (the repository extension, /v1/admin/models) -----------------------------

    async def load(self, name: str) -> None:
        """Load a model (explicit), or scan its folder now (poll): returns once every
        version its policy serves is ready everywhere; Refused with the reason otherwise."""
        if self.mode == "none":
            raise Refused("the model control is 'none' (--model-control): models change "
                          "only with a restart", 409)
        if name.startswith(".") or "/" in name or not (self.repo / name).is_dir():
            raise Refused(f"no model folder {name!r} in the repository", 404)
        added = name not in self.requested
        if self.mode == "explicit":
            self.requested.add(name)
        await self.sync([name], retry=True)
        if name in self.problems:
            raise Refused(self.problems[name])
        versions = self.table.get(name, {})
        failed = [f"version {v}: {e.reason}" for v, e in sorted(versions.items())
                  if e.state != READY or e.failed]
        if failed or not versions:
            if not versions and added:
                self.requested.discard(name)
            raise Refused(f"model {name!r} did not load: "
                          + ("; ".join(failed) or "no version folder with a manifest.json"))

    async def unload(self, name: str) -> None:
        """Unload every version of a model (explicit): it answers 404 from then on."""
        if self.mode != "explicit":
            how = ("remove its folder from the repository" if self.mode == "poll"
                   else "restart without it")
            raise Refused(f"the model control is {self.mode!r} (--model-control): to unload "
                          f"a model, {how}, or serve with --model-control explicit", 409)
        if name not in self.table and name not in self.requested:
            raise Refused(f"model {name!r} is not loaded", 404)
        self.requested.discard(name)
        await self.sync([name])

    async def index(self, ready_only: bool = False) -> list[dict[str, Any]]:
        """Triton's repository index: every version in the table with its state (and the
        reason of one that is not ready), and every other model folder as UNAVAILABLE."""
        rows: list[dict[str, Any]] = []
        for name in sorted(self.table):
            for v, e in sorted(self.table[name].items()):
                row = {"name": name, "version": str(v), "state": e.state,
                       "reason": e.reason or ""}
                if name in self.problems:
                    row["reason"] = self.problems[name]
                rows.append(row)
        if self.repo.is_dir():
            for folder in sorted(self.repo.iterdir()):
                if folder.is_dir() and not folder.name.startswith(".") \
                        and folder.name not in self.table:
                    rows.append({"name": folder.name, "version": "", "state": UNAVAILABLE,
                                 "reason": self.problems.get(folder.name, "unloaded")})
        return [r for r in rows if r["state"] == READY] if ready_only else rows
