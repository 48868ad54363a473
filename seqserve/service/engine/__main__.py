"""`python -m seqserve.service.engine`: the engine process (started by the supervisor).

Reads its `EngineOptions` (JSON) from SEQSERVE_ENGINE_OPTIONS and its socket address from
SEQSERVE_ENGINE_ADDRESS; loads every model, then serves until SIGTERM, then drains. Ctrl-C
(SIGINT, sent to the whole process group) is left to the supervisor.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys

from seqserve.service.core.logs import configure_logging
from seqserve.service.core.metrics import Metrics
from seqserve.service.engine.options import ADDRESS_ENV, OPTIONS_ENV, EngineOptions
from seqserve.service.engine.server import EngineServer

DRAIN_ENV = "SEQSERVE_DRAIN_TIMEOUT_S"


async def run(options: EngineOptions, address: str, drain_timeout_s: float) -> int:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    server = EngineServer(options, Metrics())
    await server.load()
    await server.serve(address, stop)
    drained = await server.drain(drain_timeout_s)
    logging.getLogger("seqserve.engine").info(
        "engine stopped (%s)", "all work drained" if drained else "drain timeout passed")
    return 0


def main() -> int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    configure_logging(os.environ.get("SEQSERVE_LOG_LEVEL", "info"),
                      os.environ.get("SEQSERVE_LOG_FORMAT", "text"))
    options = EngineOptions.from_json(os.environ[OPTIONS_ENV])
    drain = float(os.environ.get(DRAIN_ENV, "20"))
    return asyncio.run(run(options, os.environ[ADDRESS_ENV], drain))


if __name__ == "__main__":
    sys.exit(main())
