"""The translator's gauges after cancellations, on a real server: clients that hang up while
their requests are queued or mid-decode leave `seqserve_queue_depth` and
`seqserve_live_hypotheses` at 0 once the engine is idle, with no further translate traffic."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

import httpx
from fake_translator import FakeTranslator
from server_support import RawConnection, serve_app
from service_fakes import served, settings

from seqserve.export.manifest import Manifest
from seqserve.service.runtimes import load_runtime
from seqserve.service.runtimes.base import RuntimeSpec
from seqserve.service.scheduling.decoding import DecodeLoop
from seqserve.service.scheduling.models import DecodedModel
from seqserve.service.server.app import create_app

LONG = {"beam_size": 8, "n_best": 1, "min_length": 35, "max_length": 40}
"""Each request holds 8 hypothesis rows for at least 35 slow steps."""


def _slow_translator(spec: RuntimeSpec, path: Path, manifest: Manifest) -> Any:
    if manifest.task != "translator":
        return load_runtime(spec, path, manifest)
    return FakeTranslator(vocab_size=manifest.tokenizer.vocab_size, delay=0.01, eos_slope=0.0)


def _gauge(metrics: str, name: str) -> float:
    found = re.search(rf'^{name}{{model="tiny-mt"}} (\S+)$', metrics, re.M)
    assert found, name
    return float(found.group(1))


def _idle(metrics: str) -> bool:
    return (_gauge(metrics, "seqserve_queue_depth") == 0
            and _gauge(metrics, "seqserve_live_hypotheses") == 0)


def _wait_for(condition: Any, what: str, limit_s: float = 30.0) -> None:
    """Poll `condition()` (bounded, so a bug fails instead of hanging)."""
    deadline = time.monotonic() + limit_s
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.005)


def test_cancelled_queued_and_admitted_requests_leave_the_gauges_at_zero(
        tiny_repo: Path) -> None:
    app = create_app(settings(tiny_repo, max_live_hypotheses=16, queue_size=64),
                     _slow_translator)
    with serve_app(app) as url:
        model = served(app, "tiny-mt")
        assert isinstance(model, DecodedModel)
        engine: DecodeLoop = model.loop
        body = json.dumps({"texts": ["one two three"] * 2, **LONG}).encode()
        clients = []
        for _ in range(4):  # 2 x 8 rows fill the budget; the other 6 sources wait
            conn = RawConnection(url)
            head = {"host": conn.host, "content-type": "application/json",
                    "content-length": str(len(body))}
            lines = ["POST /v1/models/tiny-mt/translate HTTP/1.1",
                     *(f"{k}: {v}" for k, v in head.items())]
            conn.sock.sendall("\r\n".join(lines).encode() + b"\r\n\r\n" + body)
            clients.append(conn)
        _wait_for(lambda: engine.live_rows == 16 and engine.queued == 6,
                  "requests admitted (16 rows) and queued (6 sources)")
        with httpx.Client(base_url=url, timeout=30) as client:
            busy = client.get("/metrics").text
            assert _gauge(busy, "seqserve_live_hypotheses") == 16
            assert _gauge(busy, "seqserve_queue_depth") == 6
            for conn in clients:  # every client hangs up: admitted and queued ones
                conn.close()
            # Scrapes only (no translate traffic): the gauges must reach 0 by themselves.
            _wait_for(lambda: _idle(client.get("/metrics").text),
                      "queue_depth and live_hypotheses back to 0 after the cancellations")
        assert engine.live_rows == 0 and engine.queued == 0
        assert engine.stats.steps < 35  # nobody decoded to min_length: the work was dropped
