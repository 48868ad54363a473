"""The session table's use in /metrics (issue 37): a real server with the stateful tiny-series
bundle and max_sessions 1 reports its capacity, its live sessions, and each refusal by its
reason (full: 429, unknown: 404)."""

from __future__ import annotations

from pathlib import Path

import httpx
from process_support import counts, serve

STEP = [0.1, 0.2, 0.3]


def test_sessions_open_capacity_and_refusals_by_reason_in_metrics(
        tiny_series_repo: Path) -> None:
    with serve(tiny_series_repo, "--api-workers", "0", "--max-sessions", "1") as server:
        url = f"{server.url}/v1/models/tiny-series/predict"
        assert httpx.post(url, json={"series": [[STEP]], "session": "a", "start": True},
                          timeout=30).status_code == 200
        full = httpx.post(url, json={"series": [[STEP]], "session": "b", "start": True},
                          timeout=30)
        assert full.status_code == 429 and full.headers["retry-after"], full.text
        unknown = httpx.post(url, json={"series": [[STEP]], "session": "c"}, timeout=30)
        assert unknown.status_code == 404, unknown.text
        metrics = httpx.get(f"{server.url}/metrics", timeout=30).text
    assert counts(metrics, "seqserve_session_capacity", "model") == {"tiny-series": 1.0}
    assert counts(metrics, "seqserve_live_sessions", "model") == {"tiny-series": 1.0}
    refused = counts(metrics, "seqserve_session_refusals_total", "reason")
    assert refused == {"full": 1.0, "unknown": 1.0}, refused
