"""A session's answers name the version it runs on (issue 34): a session started on v1 goes
on on v1 after v2 becomes the default, and after v1 leaves the table, and every chunk's
answer says 1; a new session starts on v2 and says 2. In one process and in the engine
layout (the version comes back from the engine process with the chunk's result)."""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from control_support import publish, remove, version_of
from process_support import serve
from service_fakes import serve_in_thread, settings

from seqserve.service.server.app import create_app

SERIES = "tiny-series"
STEP = [[0.1, 0.2, 0.3]]


@contextlib.contextmanager
def server(layout: str, repo: Path) -> Iterator[str]:
    if layout == "single":
        app = create_app(settings(repo, model_control="explicit", load_model=[SERIES]))
        with serve_in_thread(app) as url:
            yield url
        return
    with serve(repo, "--layout", layout, "--api-workers", "1", "--no-grpc",
               "--model-control", "explicit", "--load-model", SERIES) as running:
        yield running.url


def chunk(client: httpx.Client, session: str, version: int | None = None,
          **flags: bool) -> httpx.Response:
    path = f"/v1/models/{SERIES}" + (f"/versions/{version}" if version else "") + "/predict"
    return client.post(path, json={"series": [STEP], "session": session, **flags})


@pytest.mark.parametrize("layout", ["single", "engine"])
def test_a_session_started_on_v1_answers_as_v1_after_v2_becomes_the_default(
        tiny_series_repo: Path, tmp_path: Path, layout: str) -> None:
    repo = tmp_path / "repo"
    shutil.copytree(tiny_series_repo, repo)
    with server(layout, repo) as url, httpx.Client(base_url=url, timeout=60) as client:
        first = chunk(client, "old", start=True)
        assert first.status_code == 200 and first.json()["version"] == 1, first.text
        publish(repo, SERIES, 1, 2)
        assert client.post(f"/v2/repository/models/{SERIES}/load").status_code == 200
        assert version_of(client, SERIES) == 2
        for steps in (2, 3):
            r = chunk(client, "old")
            assert r.status_code == 200, r.text
            assert (r.json()["version"], r.json()["steps"]) == (1, steps)
        oip = client.post(f"/v2/models/{SERIES}/infer", json={  # OIP's sequence_id: the same
            "inputs": [{"name": "features", "datatype": "FP32", "shape": [1, 1, 3],
                        "data": STEP[0]}], "parameters": {"sequence_id": "oip-old",
                                                          "sequence_start": True}})
        assert oip.status_code == 200 and oip.json()["model_version"] == "2", oip.text
        pinned_oip = client.post(f"/v2/models/{SERIES}/infer", json={
            "inputs": [{"name": "features", "datatype": "FP32", "shape": [1, 1, 3],
                        "data": STEP[0]}], "parameters": {"sequence_id": "old"}})
        assert pinned_oip.status_code == 200, pinned_oip.text
        assert pinned_oip.json()["model_version"] == "1"  # the session's, not the default's
        assert "_version" not in pinned_oip.json()["parameters"]
        r = chunk(client, "old")  # (the OIP chunk above was its 4th step)
        assert (r.json()["version"], r.json()["steps"]) == (1, 5)
        new = chunk(client, "new", start=True)
        assert new.json()["version"] == 2 and new.json()["steps"] == 1
        assert chunk(client, "new").json()["version"] == 2
        pinned = chunk(client, "pinned", version=1, start=True)
        assert pinned.json()["version"] == 1
        remove(repo, SERIES, 1)  # v1 leaves the table; its live sessions finish on it
        assert client.post(f"/v2/repository/models/{SERIES}/load").status_code == 200
        assert [v["version"] for v in client.get(f"/v1/models/{SERIES}").json()[
            "versions"]] == [2]
        r = chunk(client, "old", end=True)
        assert r.status_code == 200, r.text
        assert (r.json()["version"], r.json()["steps"]) == (1, 6)
        assert chunk(client, "old").status_code == 404  # ended
        assert chunk(client, "new", end=True).json()["version"] == 2
