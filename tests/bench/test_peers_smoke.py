"""The peers benchmark's plumbing (bench/peers), fast and without timing assertions: the text
numbering, wrk's script against the same numbering, and the whole command against the
per-request FastAPI peers (classify at two settings, beam-search translate) on the tiny
bundles (mosec and TorchServe are reported as not installed unless their virtualenv exists)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bench.peers import servers as sv
from bench.peers.load import Load, run_load, wrk_path
from bench.peers.texts import translate_workload, workloads

pytestmark = pytest.mark.timeout(180)

ROOT = Path(__file__).resolve().parents[2]
ROWS = [(f"{a} {b}", lab) for lab, words in (("en", ["one", "two", "three", "four"]),
                                             ("fr", ["un", "deux", "trois", "quatre"]))
        for a in words for b in words]


def test_every_text_number_gives_a_new_text() -> None:
    loads = workloads(ROWS, seed=1)
    for w in loads.values():
        texts = [w.text(g) for g in range(w.capacity)]
        assert len(set(texts)) == len(texts) == w.capacity
    short, long = loads["short"].text(0).split(), loads["long"].text(5).split()
    assert len(short) == 4 and 10 <= len(long) <= 60


@pytest.mark.parametrize("client", ["wrk", "python"])
def test_the_load_tools_send_the_numbered_texts(tmp_path: Path, client: str) -> None:
    if client == "wrk" and wrk_path() is None:
        pytest.skip("wrk is not installed")
    record = tmp_path / "bodies.txt"
    server = sv.trivial(sys.executable, record)
    port = sv.free_port()
    proc = sv.start(server, port, tmp_path / "trivial.log")
    try:
        sv.wait_ready(proc, port, server.path, "probe", 30)
        record.write_bytes(b"")
        for name, w in workloads(ROWS, seed=1).items():
            data = w.data_file(tmp_path / f"{name}.txt")
            result = run_load(client, Load(f"http://127.0.0.1:{port}", server.path, w, data,
                                           start=7, seconds=1, connections=4, threads=2))
            assert result.requests > 0 and not result.errors
            time.sleep(0.2)  # the server writes the last bodies
            sent = [json.loads(line)["texts"][0] for line in record.read_text().splitlines()]
            record.write_bytes(b"")
            expected = {w.text(g) for g in range(7, 7 + 2 * len(sent) + 8)}
            assert set(sent) <= expected
            if len(sent) <= w.capacity:
                assert len(set(sent)) == len(sent)
    finally:
        sv.stop(proc)


def test_the_command_end_to_end(tiny_repo: Path, tmp_path: Path) -> None:
    client = "wrk" if wrk_path() else "python"
    out = tmp_path / "results"
    cmd = [sys.executable, str(ROOT / "bench" / "peers" / "run.py"), "--repo", str(tiny_repo),
           "--model", "tiny-clf", "--servers", "fastapi,mosec,torchserve",
           "--workloads", "short,long,translate", "--translate-model", "tiny-mt",
           "--fastapi-settings", "1x1,2x1", "--translate-settings", "1x1",
           "--translate-sample", "8",
           "--peers-venv", str(tmp_path / "no-venv"), "--duration", "1", "--warmup", "0",
           "--connections", "4", "--client", client, "--client-check-seconds", "1",
           "--ceiling-batches", "1,4", "--ceiling-threads", "1", "--ceiling-seconds", "0.05",
           "--ceiling-texts", "64", "--out", str(out)]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=170)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "| fastapi per request |" in done.stdout
    assert "| fastapi beam search per request |" in done.stdout
    assert "| mosec (not measured) |" in done.stdout
    assert "| torchserve (not measured) |" in done.stdout
    assert "| torchserve beam search per batch (not measured) |" in done.stdout
    res = json.loads(next(out.glob("peers-*.json")).read_text())
    fastapi = [s for s in res["servers"] if s["peer"] == "fastapi per request"]
    assert sorted(s["setting"] for s in fastapi) == ["1 worker x 1 thread",
                                                      "2 workers x 1 thread"]
    for server in fastapi:
        assert server["answers"]["matched"] == server["answers"]["checked"] == 16
        assert server["processes"] >= 1
        for name in ("short", "long"):
            r = server[name]
            assert r["requests"] > 0 and not r["errors"]
            assert 0 < r["cpu_ms_per_request"] < 1e3 * r["cpu_s"]
    for name in ("short", "long"):
        assert res["ceiling"][name]["best"]["seq_s"] > 0
        assert res["ceiling"][name]["floor"]["cpu_ms"] > 0
        assert res["client_ceiling"]["python"][name]["requests"] > 0
    translate = next(s for s in res["servers"] if s["peer"] == "fastapi beam search per request")
    assert translate["answers"]["matched"] == translate["answers"]["checked"] == 8
    assert translate["translate"]["requests"] > 0 and not translate["translate"]["errors"]
    assert translate["translate"]["cpu_ms_per_request"] > 0
    assert res["ceiling"]["translate"]["mean_out_tokens"] > 0


def test_the_batch_handlers_beam_search_answers_as_the_per_request_one(tiny_repo: Path) -> None:
    """TorchServe's translate handler searches a whole batch at once; every text must get the
    per-request search's hypothesis and score, whatever else shares its batch."""
    sys.path.insert(0, str(ROOT / "bench" / "peers" / "apps"))
    try:
        from common import TranslatorBundle
    finally:
        sys.path.pop(0)
    bundle = TranslatorBundle(next((tiny_repo / "tiny-mt").iterdir()))
    w = translate_workload(0)
    texts = [w.text(g) for g in range(24)] + ["", "NINE, nine."]
    one = [bundle.translate(t, 4) for t in texts]
    for size in (1, 5, len(texts)):
        batched = [r for i in range(0, len(texts), size)
                   for r in bundle.translate_batch(texts[i: i + size], 4)]
        assert [r["token_ids"] for r in batched] == [r["token_ids"] for r in one]
        assert [r["score"] for r in batched] == pytest.approx([r["score"] for r in one],
                                                              abs=1e-4)
