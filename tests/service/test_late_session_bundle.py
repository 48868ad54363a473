"""The engine on demand (issues 34, 50): a bundle with sessions published to a hybrid server
that started without an engine process (no bundle had sessions at start) is served without a
restart: the supervisor starts the engine process, every API process connects to it, and a
session's chunks reach the one state whichever API process takes them, an API process
restarted afterwards included; the server stays ready and its other models answer."""

from __future__ import annotations

import shutil
from pathlib import Path

import httpx
from control_support import CLF, wait_for
from process_support import counts, serve
from test_supervisor import kill_and_replace_an_api_process

SERIES = "tiny-series"
STEP = [0.1, 0.2, 0.3]


def _index_row(url: str) -> dict[str, str] | None:
    rows = httpx.post(f"{url}/v2/repository/index", timeout=10).json()
    return next((r for r in rows if r["name"] == SERIES and r["version"] == "1"), None)


def _chunk(url: str, session: str, **flags: bool) -> httpx.Response:
    """One chunk on a new connection (so every API process takes some)."""
    return httpx.post(f"{url}/v1/models/{SERIES}/predict",
                      json={"series": [[STEP]], "session": session, **flags}, timeout=30)


def test_a_late_session_bundle_in_hybrid_starts_the_engine_and_serves_sessions(
        tiny_repo: Path, tiny_series_repo: Path, tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    shutil.copytree(tiny_repo, repo)
    with serve(repo, "--layout", "hybrid", "--api-workers", "2", "--no-grpc",
               "--repository-poll-s", "0.3") as server:
        url = server.url
        assert sorted(server.children().values()) == ["api", "api"]  # no engine process
        hidden = repo / f".tmp-{SERIES}"
        shutil.copytree(tiny_series_repo / SERIES, hidden)
        hidden.rename(repo / SERIES)  # published atomically
        wait_for(lambda: (_index_row(url) or {}).get("state") == "READY", timeout=120)
        assert sorted(server.children().values()) == ["api", "api", "engine"]
        assert _index_row(url) == {"name": SERIES, "version": "1", "state": "READY",
                                   "reason": ""}
        first = _chunk(url, "late", start=True)
        assert first.status_code == 200 and first.json()["steps"] == 1, first.text
        for steps in range(2, 8):  # new connections: both API processes, one state
            r = _chunk(url, "late")
            assert r.status_code == 200 and r.json()["steps"] == steps, r.text
        for _ in range(6):  # both API processes list it ready, in the engine process
            model = httpx.get(f"{url}/v1/models/{SERIES}", timeout=10).json()
            (version,) = model["versions"]
            assert version["state"] == "ready", version
        kill_and_replace_an_api_process(server)  # the new one connects to the engine too
        for steps in range(8, 14):
            r = _chunk(url, "late")
            assert r.status_code == 200 and r.json()["steps"] == steps, r.text
        assert _chunk(url, "late", end=True).status_code == 200
        assert httpx.get(f"{url}/v2/health/ready", timeout=10).status_code == 200
        assert httpx.post(f"{url}/v1/models/{CLF}/classify", json={"texts": ["one"]},
                          timeout=10).status_code == 200
        metrics = httpx.get(f"{url}/metrics", timeout=10).text
        assert counts(metrics, "seqserve_model_loads_total", "model")[SERIES] == 1
        assert sum(counts(metrics, "seqserve_engine_restarts_total", "reason").values()) == 0
