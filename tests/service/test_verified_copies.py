"""One truth across API processes (issue 50): every process serves the bytes verified when a
version loaded, from the supervisor's copy of it (server/snapshots.py). A signed repository
under `--model-control poll`: a translator's graph truncated in place, then one API process
SIGKILLed: the restarted process loads the verified copy, so every translation before and
after answers 200 with the same text, readiness and `/v1/models` say the same in each
process, and the change is reported (the index's reason, `seqserve_model_files_changed`, the
log) while the verified copy serves on; put right, it loads again and is no longer
reported."""

from __future__ import annotations

import contextlib
import json
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
from control_support import MT, wait_for
from process_support import Server, counts, serve
from test_supervisor import kill_and_replace_an_api_process

from seqserve.export.signing import new_key, sign_bundle

TEXT = {"texts": ["twenty one"], "beam_size": 2}
REQUESTS = 40


def _pid(client: httpx.Client) -> int:
    pid: int = client.get("/v1/admin/config").json()["api"]["process"]["pid"]
    return pid


@contextlib.contextmanager
def one_client_per_process(server: Server) -> Iterator[dict[int, httpx.Client]]:
    """A keep-alive client on each API process: new connections are opened (a few held at a
    time, so that the balanced accepting hands the next one to a process that holds fewer)
    until every API process holds one (a restarted process accepts once it is up)."""
    api = {pid for pid, role in server.children().items() if role == "api"}
    chosen: dict[int, httpx.Client] = {}
    extra: list[httpx.Client] = []
    deadline = time.monotonic() + 60
    try:
        while set(chosen) != api:
            assert time.monotonic() < deadline, (set(chosen), api)
            for pid, held in list(chosen.items()):  # kept alive, and where it is
                if _pid(held) != pid:  # closed while idle: it reconnected elsewhere
                    del chosen[pid]
                    extra.append(held)
            client = httpx.Client(base_url=server.url, timeout=30)
            pid = _pid(client)
            if pid in chosen:
                extra.append(client)
            else:
                chosen[pid] = client
            if len(extra) >= 4:
                for other in extra:
                    other.close()
                extra.clear()
                time.sleep(0.2)
        yield chosen
    finally:
        for client in [*chosen.values(), *extra]:
            client.close()


def _every_process_answers_the_same(server: Server) -> dict[str, object]:
    """REQUESTS translations spread over the API processes, and what each says of its
    readiness and of the translator: one answer, whichever process is asked."""
    answers: list[tuple[int, str]] = []
    seen: dict[int, tuple[int, str, int]] = {}
    with one_client_per_process(server) as clients:
        pids = sorted(clients)
        for i in range(REQUESTS):
            pid = pids[i % len(pids)]
            r = clients[pid].post(f"/v1/models/{MT}/translate", json=TEXT)
            if r.status_code == 503:
                assert "retry-after" in r.headers, r.text  # every 503 says when
            answers.append((r.status_code, r.text if r.status_code != 200
                            else json.dumps(r.json()["results"])))
        for pid, client in clients.items():
            model = client.get(f"/v1/models/{MT}").json()
            (version,) = model["versions"]
            seen[pid] = (client.get("/v2/health/ready").status_code, version["state"],
                         version["version"])
            assert _pid(client) == pid  # the same connection throughout
    assert {status for status, _ in answers} == {200}, answers
    assert len({text for _, text in answers}) == 1, answers
    assert set(seen.values()) == {(200, "ready", 1)}, seen
    return {"text": answers[0][1], "processes": pids}


def _mt_row(url: str) -> dict[str, str]:
    rows = httpx.post(f"{url}/v2/repository/index", timeout=10).json()
    row: dict[str, str] = next(r for r in rows if r["name"] == MT and r["version"] == "1")
    return row


def test_a_version_changed_in_place_then_an_api_process_crash_serves_one_truth(
        tiny_repo: Path, tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    shutil.copytree(tiny_repo, repo)
    private, _ = new_key(tmp_path / "keys", "release")
    for version in repo.glob("*/1"):
        sign_bundle(version, private)
    graph = repo / MT / "1" / "decoder_step.onnx"
    with serve(repo, "--layout", "hybrid", "--api-workers", "2", "--no-grpc",
               "--model-control", "poll", "--repository-poll-s", "0.3",
               "--trusted-keys", str(tmp_path / "keys")) as server:
        url = server.url
        before = _every_process_answers_the_same(server)
        good = graph.read_bytes()
        with open(graph, "r+b") as f:  # in place: the same file, half of it
            f.truncate(graph.stat().st_size // 2)
        wait_for(lambda: "changed" in _mt_row(url)["reason"], timeout=60)
        row = _mt_row(url)
        assert row["state"] == "READY", row  # the verified copy serves on
        assert "sha256 mismatch" in row["reason"] and f"{MT}/1/decoder_step.onnx" in \
            row["reason"] and str(tmp_path) not in row["reason"], row
        metrics = httpx.get(f"{url}/metrics", timeout=10).text
        assert counts(metrics, "seqserve_model_files_changed", "model")[MT] == 1
        assert _every_process_answers_the_same(server) == before

        kill_and_replace_an_api_process(server)
        after = _every_process_answers_the_same(server)
        assert after["text"] == before["text"] and after["processes"] != before["processes"]
        assert _mt_row(url)["state"] == "READY"
        graph.write_bytes(good)  # put right: loaded again, the change no longer reported
        wait_for(lambda: _mt_row(url)["reason"] == "", timeout=60)
        metrics = httpx.get(f"{url}/metrics", timeout=10).text
        assert counts(metrics, "seqserve_model_files_changed", "model")[MT] == 0
        assert _every_process_answers_the_same(server) == after
    log = server.output()
    assert "changed in the repository and do not load" in log, log
