"""Process-wide settings that every server process applies the same way at start.

The API processes (and the single-process server) take them from `Settings`; the engine
process from its `EngineOptions`, which the supervisor built from the same `Settings`.
`observed()` reads back what is in force, for the admin endpoint and the start-up line.
"""

from __future__ import annotations

import ctypes
import gc
import logging
import os
import signal
import sys
from dataclasses import dataclass
from typing import Any

from seqserve.service.core.logs import configure_logging


@dataclass(frozen=True, kw_only=True)
class ProcessSettings:
    """Logging and the GIL switch interval of one process."""

    log_level: str
    """Log level ("info", "debug", ...)."""
    log_format: str
    """"text" or "json"."""
    switch_interval_ms: float
    """Python's GIL switch interval (sys.setswitchinterval), in milliseconds."""

    def apply(self) -> None:
        """Set the switch interval and send every logger to one handler (call it again after
        uvicorn's Config exists: that reconfigures uvicorn's loggers)."""
        sys.setswitchinterval(self.switch_interval_ms / 1000.0)
        configure_logging(self.log_level, self.log_format)


SUPERVISOR_ENV = "SEQSERVE_SUPERVISOR_PID"
"""Set by the supervisor for its children: its pid (`stop_with_parent`)."""
PR_SET_PDEATHSIG = 1


def stop_with_parent(sig: int = signal.SIGTERM) -> bool:
    """A supervisor's child (engine, API process) gets `sig` when the supervisor dies, also
    when it is killed outright (SIGKILL, the OOM killer): it then drains and exits, instead of
    an API process serving on a port nobody supervises and an engine left behind (measured
    before: both ran on after `kill -9` of the supervisor, and a new server could not bind
    the port). Linux's PR_SET_PDEATHSIG; where SUPERVISOR_ENV names the parent only. A parent
    already gone by then sends `sig` at once. True when armed."""
    parent = os.environ.get(SUPERVISOR_ENV, "")
    if not parent.isdigit() or not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
            return False
    except (OSError, AttributeError):
        return False
    if os.getppid() != int(parent):  # the supervisor died before the request was made
        os.kill(os.getpid(), sig)
    return True


YOUNG_COLLECTION_THRESHOLD = 50_000
"""Allocations of tracked objects (net of frees) between two collections of the youngest
generation while serving (Python's default: 700). Each collection walks every young object
still alive, and under load that is mostly the requests in flight, which no collection can
free: measured in an API process under 64 connections (perf), the collector was 4.5% of its
main thread; with 10,000 / 50,000, short texts went 4540 -> 4815 / 4910 req/s, CPU 0.404 ->
0.378 / 0.373 ms a request (bench/peers/ab.py, 4 rounds, docs/performance.md 17). The older
generations keep their defaults; cyclic garbage waits at most this many allocations, so a
request must leave none: with ~30 objects of each translation in cycles, every collection here
walked ~47,000 of them, 26-62 ms with the loop stopped (tests/service/test_reference_cycles.py;
docs/performance.md section 39)."""


def freeze_heap() -> int:
    """Collect once, then move every object alive now (modules, models, sessions, the app)
    out of the garbage collector's reach (`gc.freeze`): a full collection while serving then
    walks only what was made since, instead of pausing every request for the whole start-up
    heap; from then on the youngest generation is collected every
    `YOUNG_COLLECTION_THRESHOLD` allocations. Call it once a process has loaded everything it
    serves; returns the objects frozen."""
    gc.collect()
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(YOUNG_COLLECTION_THRESHOLD, older, oldest)
    return gc.get_freeze_count()


def observed() -> dict[str, Any]:
    """What this process runs with now: its pid, switch interval, log level and the objects
    its start-up froze (`freeze_heap`; 0 before it, or in an app that is not a server's) and
    the collector's thresholds (`freeze_heap` raises the youngest's)."""
    level = logging.getLogger().getEffectiveLevel()
    return {"pid": os.getpid(), "switch_interval_ms": round(sys.getswitchinterval() * 1000.0, 6),
            "log_level": logging.getLevelName(level).lower(),
            "frozen_objects": gc.get_freeze_count(), "gc_threshold": list(gc.get_threshold())}
