"""A bundle with sessions published to a hybrid server that started without an engine process
(no bundle had sessions at start; issue 34): it is not served (each API process would hold
its own sessions), and /v1/models (in every API process) and the repository index say why;
the server stays ready and its other models answer."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import httpx
from control_support import CLF, wait_for
from process_support import counts, serve

from seqserve.service.web.control import NO_ENGINE

SERIES = "tiny-series"


def _index_row(url: str) -> dict[str, str] | None:
    rows = httpx.post(f"{url}/v2/repository/index", timeout=10).json()
    return next((r for r in rows if r["name"] == SERIES and r["version"] == "1"), None)


def test_a_late_session_bundle_in_hybrid_without_an_engine_is_refused_with_its_reason(
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
        wait_for(lambda: (_index_row(url) or {}).get("state") == "UNAVAILABLE", timeout=60)
        row = _index_row(url)
        assert row is not None and NO_ENGINE in row["reason"], row
        for _ in range(6):  # new connections: both API processes list it, failed
            model = httpx.get(f"{url}/v1/models/{SERIES}", timeout=10).json()
            (version,) = model["versions"]
            assert version["state"] == "failed" and NO_ENGINE in version["reason"], version
            r = httpx.post(f"{url}/v1/models/{SERIES}/predict",
                           json={"series": [[[0.1, 0.2, 0.3]]]}, timeout=10)
            assert r.status_code == 503 and "engine process" in r.json()["error"], r.text
        assert httpx.get(f"{url}/v2/health/ready", timeout=10).status_code == 200
        assert httpx.post(f"{url}/v1/models/{CLF}/classify", json={"texts": ["one"]},
                          timeout=10).status_code == 200
        time.sleep(1.0)  # several polls: not tried again while its files do not change
        metrics = httpx.get(f"{url}/metrics", timeout=10).text
        assert counts(metrics, "seqserve_model_loads_total", "model")[SERIES] == 1
        assert sorted(server.children().values()) == ["api", "api"]
