"""`--api-workers auto`, `--instances auto`: the process and thread layout for this machine.

Chosen by measurement on the 2-core CPU box (docs/performance.md, "Process layout"): the
API processes and the engine's runtime instances share the cores, so the API processes take
half of them and the runtime instances the other half, one thread each. On CUDA the device
does the compute; API processes take every core but two (the engine's loop and the load
balancer's share), and two instances keep two batches in flight on the device.
"""

from __future__ import annotations

import os
from typing import Any

from service.settings import Settings


def cores() -> int:
    """CPU cores this process may run on (its affinity, else the machine's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def resolve(settings: Settings, available: int | None = None) -> Settings:
    """`settings` with every "auto" replaced by a count (threads too, when left at 0)."""
    n = available or cores()
    update: dict[str, Any] = {}
    gpu = settings.device == "cuda"
    api = settings.api_workers
    if api == "auto":
        api = update["api_workers"] = max(1, n - 2) if gpu else max(1, n // 2)
    if settings.instances == "auto":
        update["instances"] = 2 if gpu else max(1, n - int(api)) if api else max(1, n // 2)
    instances = update.get("instances", settings.instances)
    if settings.intra_op_threads == 0 and settings.instances == "auto" and not gpu:
        update["intra_op_threads"] = max(1, (n - int(api)) // int(instances)) if api else 1
    return settings.model_copy(update=update)


def describe(settings: Settings) -> str:
    """One line for the start-up log: the layout in force."""
    threads = settings.intra_op_threads or "runtime default"
    if settings.api_workers == 0:
        return (f"one process (API and engine), {settings.instances} instance(s) per model, "
                f"{threads} intra-op thread(s) each; {cores()} cores")
    return (f"{settings.api_workers} API process(es) + 1 engine process, "
            f"{settings.instances} instance(s) per model, {threads} intra-op thread(s) each; "
            f"{cores()} cores")
