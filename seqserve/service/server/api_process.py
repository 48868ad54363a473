"""`python -m seqserve.service.server.api_process`: one API process (started by the supervisor).

Serves HTTP on the listening socket the supervisor bound and passed down (its descriptor in
SEQSERVE_LISTEN_FD), with its models in the engine process (its address in the supervisor's
model table, `fleet.table_engine`, when there is one) or in this process (the replicated
layout; in the hybrid layout those that keep no sessions, or all while there is no engine:
the supervisor starts one when a bundle that keeps sessions arrives, and this process then
connects to it, `Composition.attach`). The settings come from the SEQSERVE_* variables
the supervisor set; with several API processes, the shared connection counters that balance
the accepting (accept.py: SEQSERVE_CONNECTION_SLOTS, SEQSERVE_API_SLOT).
"""

from __future__ import annotations

import logging
import os
import socket
import sys

LISTEN_FD_ENV = "SEQSERVE_LISTEN_FD"


def main() -> int:
    from seqserve.service.core.process import stop_with_parent
    from seqserve.service.server.accept import slots_from_env
    from seqserve.service.server.app import create_app
    from seqserve.service.server.composition import engine_client
    from seqserve.service.server.fleet import table_engine
    from seqserve.service.server.shutdown import build_server
    from seqserve.service.web.settings import Settings

    stop_with_parent()  # SIGTERM (drain, exit) when the supervisor dies
    settings = Settings()
    process = settings.process_settings()
    process.apply()  # the same as the engine process applies from its options
    sock = socket.socket(fileno=int(os.environ[LISTEN_FD_ENV]))
    address = table_engine()
    engine = engine_client(settings, address) if address else None
    app = create_app(settings, engine=engine, freeze=True)
    server = build_server(app, app.state.seqserve, supervised=True, balance=slots_from_env())
    process.apply()  # again after uvicorn's Config, which set up its own loggers
    logging.getLogger("seqserve").debug("API process %d started", os.getpid())
    server.run(sockets=[sock])
    return 0


if __name__ == "__main__":
    sys.exit(main())
