"""Fixtures of the deploy tests: rendered overlays and one live seqserve on 127.0.0.1."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from deploy_support import (
    DEPLOY,
    OVERLAYS,
    VENV_BIN,
    free_port,
    http,
    render,
    running,
    send_traffic,
    serve_argv,
    wait_for,
)

READY_DEADLINE_S = 120.0


@pytest.fixture(scope="session")
def rendered() -> dict[str, list[dict[str, Any]]]:
    """`kubectl kustomize` of each overlay (and of the base)."""
    out = {name: render(DEPLOY / "overlays" / name) for name in OVERLAYS}
    out["base"] = render(DEPLOY / "base")
    return out


@pytest.fixture(scope="session")
def live_repo(tiny_repo: Path, tiny_lm_repo: Path,
              tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny repository's models and the tiny language model, in one repository."""
    import shutil

    repo = tmp_path_factory.mktemp("live-repo")
    for source in (tiny_repo, tiny_lm_repo):
        for model in sorted(p for p in source.iterdir() if p.is_dir()):
            shutil.copytree(model, repo / model.name)
    return repo


@pytest.fixture(scope="session")
def live_server(live_repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real `seqserve serve` on the tiny repository and tiny-lm, after some classify,
    translate and generate traffic."""
    port = free_port()
    log = tmp_path_factory.mktemp("live-server") / "seqserve.log"
    argv = serve_argv(str(VENV_BIN / "seqserve"), live_repo, port)
    with running(argv, log) as server:
        base = f"http://127.0.0.1:{port}"
        wait_for(f"{base}/v2/health/ready", READY_DEADLINE_S, server.proc, log)
        seen = send_traffic(base, n=5)
        assert seen.get("200", 0) > 0, f"no request succeeded: {seen}"
        # the supervisor's model control adopts the table the API processes report once they
        # are ready: its series (seqserve_model_loads_total, ...) exist from then on
        deadline = time.monotonic() + 30
        while b"seqserve_model_loads_total" not in http(f"{base}/metrics")[1]:
            assert time.monotonic() < deadline, "the model control never adopted the models"
            time.sleep(0.2)
        yield base


@pytest.fixture(scope="session")
def metrics_text(live_server: str) -> str:
    status, body = http(f"{live_server}/metrics")
    assert status == 200
    return body.decode()
