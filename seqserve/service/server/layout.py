"""`--api-workers auto`, `--instances auto`: the process and thread layout for this machine.

Chosen by measurement on the 2-core CPU box (docs/performance.md, "Peers"): the API
processes take half the cores and the runtime instances the rest, one thread each, at least
two instances (on 2 cores, 1 API process + 2 instances served long texts 1.33x faster than
one instance, short texts 0.9x; two API processes were slower on both). On CUDA the device
does the compute; API processes take every core but two (the engine's loop and the
system's share), and two instances keep two batches in flight on the device.

`--layout replicated` (no engine process, every API process with its own models): one API
process per core, one instance each with one thread (on CUDA one process: one device context).
`--layout hybrid`: the same, with the bundles that keep sessions in one engine process.
`--layout auto` (the default): hybrid on a CPU, engine on CUDA, in one process, or when a copy
of the repository per core would not fit in a quarter of the memory (`auto_layout`).

`sources` and `speed_block`: the block `seqserve serve` prints at start, each speed setting in
force with where it came from (docs/performance.md, section 11, says what chose each default),
and where the decode loops run and why (`decoders`).
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Literal

from seqserve.export.versions import list_bundles
from seqserve.service.web.settings import Settings


def cores() -> int:
    """CPU cores this process may use: its affinity (else the machine's count), capped by a
    container's CPU limit (cgroup v2 `cpu.max`, or v1 `cpu.cfs_quota_us`), rounded up."""
    try:
        n = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        n = os.cpu_count() or 1
    limit = cgroup_cpu_limit()
    return max(1, min(n, math.ceil(limit))) if limit else n


def cgroup_cpu_limit(root: Path = Path("/sys/fs/cgroup")) -> float | None:
    """The container's CPU limit in cores, or None when there is none (or no cgroup)."""
    try:
        quota, period = (root / "cpu.max").read_text().split()[:2]
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError):
        pass
    try:
        quota_us = int((root / "cpu" / "cpu.cfs_quota_us").read_text())
        period_us = int((root / "cpu" / "cpu.cfs_period_us").read_text())
        return quota_us / period_us if quota_us > 0 else None
    except (OSError, ValueError):
        return None


def resolve(settings: Settings, available: int | None = None,
            memory: int | None = None) -> Settings:
    """`settings` with every "auto" replaced by a count (threads too, when left at 0) and
    the auto layout by the one chosen for this machine (`auto_layout`)."""
    n = available or cores()
    update: dict[str, Any] = {}
    gpu = settings.device == "cuda"
    api = settings.api_workers
    layout: str = settings.layout
    if layout == "auto":
        layout = update["layout"] = auto_layout(settings, n, memory)
    if layout in ("replicated", "hybrid"):  # every process the whole server: one per core
        if api == "auto":
            update["api_workers"] = 1 if gpu else n
        if settings.instances == "auto":
            update["instances"] = 1
        if settings.intra_op_threads == 0 and settings.instances == "auto" and not gpu:
            update["intra_op_threads"] = 1
        if settings.runtime_calls == "auto":
            update["runtime_calls"] = runtime_calls(
                settings, update.get("instances", settings.instances))
        return _calls(settings, layout, update)
    if api == "auto":
        api = update["api_workers"] = max(1, n - 2) if gpu else max(1, n // 2)
    if settings.instances == "auto":
        update["instances"] = 2 if gpu else max(2, n - int(api)) if api else max(1, n // 2)
    instances = update.get("instances", settings.instances)
    if settings.intra_op_threads == 0 and settings.instances == "auto" and not gpu:
        update["intra_op_threads"] = max(1, (n - int(api)) // int(instances)) if api else 1
    if settings.runtime_calls == "auto":  # one engine (or the one process) for every request
        update["runtime_calls"] = "threads"
    return _calls(settings, layout, update)


def _calls(settings: Settings, layout: str, update: dict[str, Any]) -> Settings:
    """`settings` with `update`, the decode groups and the live-hypothesis cap resolved too."""
    calls = update.get("runtime_calls", settings.runtime_calls)
    if settings.max_live_hypotheses == "auto":  # by the device (`Settings.live_hypotheses`)
        update["max_live_hypotheses"] = settings.live_hypotheses
    if settings.decode_groups == "auto":  # one translator per process: one group measured best
        one = layout in ("replicated", "hybrid") or calls != "threads"  # no thread to overlap
        update["decode_groups"] = 1 if one else 2
    return settings.model_copy(update=update)


def runtime_calls(settings: Settings, instances: int | str) -> Literal["steps", "threads"]:
    """`--runtime-calls auto` where each API process has its own models (hybrid,
    replicated): the decode loops' calls on the event loop's thread where each model has one
    instance on a CPU and the native front reads requests while a call runs (a thread
    hand-off per step saved; only calls measured short run there, `lanes.JobLane`; the
    batchers' stay on threads: long texts' batches were slower there); on threads for
    several instances
    (batches at once), a device (it computes while the loop goes on) or a front in the
    interpreter (it reads nothing while a call runs). The engine layout, the one-process
    server and the engine process keep threads."""
    if settings.device == "cuda" or instances != 1 or settings.front != "native":
        return "threads"
    from seqserve.service.server.native import native_front

    return "steps" if native_front()[0] is not None else "threads"


MEMORY_SHARE = 4
"""The auto layout copies the models into every API process only while a copy per core of
the repository's files fits in 1/MEMORY_SHARE of the memory."""


def auto_layout(settings: Settings, n: int, memory: int | None = None) -> str:
    """`layout = "auto"`: hybrid on a CPU (measured on the 2-core box, docs/performance.md
    section 15), engine on CUDA (one device context), in the one-process server (api_workers
    0), or when `n` copies of the repository would not fit in a quarter of the memory."""
    if settings.device == "cuda" or settings.api_workers == 0:  # 0: one process, no copies
        return "engine"
    limit = memory if memory is not None else memory_bytes()
    if limit and n * repository_bytes(settings.repo) * MEMORY_SHARE > limit:
        return "engine"
    return "hybrid"


def repository_bytes(repo: Path) -> int:
    """Size of every bundle version's files (what each API process would load)."""
    total = 0
    for _, _, path in list_bundles(repo):
        for f in path.iterdir():
            if f.is_file():
                total += f.stat().st_size
    return total


def memory_bytes(root: Path = Path("/sys/fs/cgroup")) -> int | None:
    """Physical memory, capped by a container's limit (cgroup v2 `memory.max`, v1
    `memory.limit_in_bytes`); None when unknown."""
    try:
        total: int | None = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        total = None
    for name in ("memory.max", "memory/memory.limit_in_bytes"):
        try:
            text = (root / name).read_text().strip()
        except OSError:
            continue
        if text.isdigit():
            total = min(total or int(text), int(text))
    return total


def describe(settings: Settings) -> str:
    """One line for the start-up log: the layout in force."""
    threads = settings.intra_op_threads or "runtime default"
    if settings.api_workers == 0:
        return (f"one process (HTTP and every model, no engine process), "
                f"{settings.instances} instance(s) per model, "
                f"{threads} intra-op thread(s) each; {cores()} cores")
    if settings.layout in ("replicated", "hybrid"):
        engine = (" (bundles that keep sessions: in 1 engine process, when there are any)"
                  if settings.layout == "hybrid" else "")
        return (f"{settings.api_workers} API process(es), each with its own models "
                f"({settings.layout}){engine}, {settings.instances} instance(s) per model, "
                f"{threads} intra-op thread(s) each; {cores()} cores")
    return (f"{settings.api_workers} API process(es) + 1 engine process, "
            f"{settings.instances} instance(s) per model, {threads} intra-op thread(s) each; "
            f"{cores()} cores")


def decoders(settings: Settings) -> str:
    """Where translators and language models decode in this layout, and why (the start-up
    block's last line)."""
    if settings.api_workers == 0:
        return "in this one process (one decode loop per model)"
    if settings.layout in ("replicated", "hybrid"):
        return ("one decode loop per model in each API process, on the requests that process "
                "took: on 2 CPU cores this served 1,479 translations/s against 1,348 with one "
                "loop in an engine process batching every API process's requests "
                "(docs/performance.md section 18); --layout engine for the other")
    return ("one decode loop per model in the engine process, batching every API process's "
            "requests into one step: wider steps, what a GPU wants (on 2 CPU cores one loop "
            "per API process served 1,479 translations/s against this layout's 1,348, "
            "docs/performance.md section 18)")


SPEED_SETTINGS = ("layout", "api_workers", "instances", "intra_op_threads", "max_batch_size",
                  "max_batch_tokens", "max_wait_ms", "max_queue_wait_s", "decode_groups",
                  "max_live_hypotheses", "runtime_calls")
"""The settings that decide how fast the server serves: the start-up block shows these."""


def sources(settings: Settings, cli: Iterable[str] = (),
            env: Mapping[str, str] | None = None) -> dict[str, str]:
    """Where each of `settings`' fields came from: `cli --flag` (given on the command line),
    `env SEQSERVE_X` (the environment), `set by the caller` (a program built the Settings,
    e.g. `seqserve demo`), or `default`. (`seqserve serve` reads no config file.)"""
    env = os.environ if env is None else env
    names = {k.upper() for k in env}
    given = set(cli)
    out = {}
    for name in Settings.model_fields:
        var = f"SEQSERVE_{name.upper()}"
        if name in given:
            out[name] = "cli --" + name.replace("_", "-")
        elif var in names:
            out[name] = f"env {var}"
        elif name in settings.model_fields_set:
            out[name] = "set by the caller"
        else:
            out[name] = "default"
    return out


def resolved_sources(before: Settings, after: Settings, origin: Mapping[str, str],
                     available: int | None = None) -> dict[str, str]:
    """`origin` with the fields `resolve` chose for this machine marked so (auto, N cores)."""
    n = available or cores()
    out = dict(origin)
    for name in Settings.model_fields:
        if getattr(before, name) != getattr(after, name):
            out[name] = f"auto: {n} cores, {after.device} ({origin[name]} was "\
                        f"{getattr(before, name)!r})"
    return out


def speed_block(settings: Settings, origin: Mapping[str, str]) -> str:
    """The start-up block: each speed setting in force and where it came from."""
    values = {name: getattr(settings, name) for name in SPEED_SETTINGS}
    if settings.intra_op_threads == 0:
        values["intra_op_threads"] = "0 (runtime default)"
    width = max(len(n) for n in SPEED_SETTINGS)
    vwidth = max(len(str(v)) for v in values.values())
    lines = [f"serving settings ({describe(settings)}):"]
    lines += [f"  {name:<{width}}  {values[name]!s:<{vwidth}}  {origin.get(name, 'default')}"
              for name in SPEED_SETTINGS]
    lines.append(f"  translators and language models decode: {decoders(settings)}")
    return "\n".join(lines)
