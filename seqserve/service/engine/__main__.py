"""`python -m seqserve.service.engine`: the engine process (started by the supervisor).

Reads its `EngineOptions` (JSON) from SEQSERVE_ENGINE_OPTIONS and its socket address from
SEQSERVE_ENGINE_ADDRESS, and nothing else of its environment: the drain timeout, the log level
and format and the switch interval travel in the options, built from the same `Settings` as
the API processes'. Loads every model, then serves until SIGTERM, then drains. Ctrl-C
(SIGINT, sent to the whole process group) is left to the supervisor.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
from collections.abc import Coroutine
from typing import Any

from seqserve.service.core.metrics import Metrics
from seqserve.service.core.process import freeze_heap, observed, stop_with_parent
from seqserve.service.engine.options import ADDRESS_ENV, OPTIONS_ENV, EngineOptions
from seqserve.service.engine.server import EngineServer

log = logging.getLogger("seqserve.engine")


async def run(options: EngineOptions, address: str) -> int:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    metrics = Metrics()
    metrics.watch_process("engine")
    server = EngineServer(options, metrics)
    await server.load()
    log.debug("start-up heap frozen: %d objects", freeze_heap())
    await server.serve(address, stop)
    drained = await server.drain(options.drain_timeout_s)
    log.info("engine stopped (%s)", "all work drained" if drained else "drain timeout passed")
    return 0


def main() -> int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    stop_with_parent()  # SIGTERM (drain, exit) when the supervisor dies
    options = EngineOptions.from_json(os.environ[OPTIONS_ENV])
    options.process.apply()  # the batch threads run here: the same switch interval
    log.info("engine process started: options %s; process %s", options.to_json(), observed())
    return run_loop(run(options, os.environ[ADDRESS_ENV]))


def run_loop(main: Coroutine[Any, Any, int]) -> int:
    """`main` on uvloop where it is installed (as uvicorn runs the API processes), else on
    asyncio's own loop. The engine's loop turn is all callbacks, futures, a reader on the
    ZeroMQ descriptor and the batch threads' hand-backs: measured with py-spy under load,
    asyncio's pure-Python loop machinery was a seventh of the engine loop's busy time."""
    try:
        import uvloop
    except ImportError:  # e.g. Windows: uvloop is not a dependency there
        return asyncio.run(main)
    return uvloop.run(main)


if __name__ == "__main__":
    sys.exit(main())
