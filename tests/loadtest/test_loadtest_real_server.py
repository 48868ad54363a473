"""The load tool and the Locust file against the real seqserve app (tiny bundles of
tests/conftest.py `tiny_repo`)."""

from __future__ import annotations

import csv
import importlib.util
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from seqserve.loadtest.config import LoadConfig
from seqserve.loadtest.runner import run_load
from seqserve.loadtest.texts import TextSampler
from seqserve.models.errors import UserError

pytestmark = pytest.mark.timeout(120)

LOCUSTFILE = Path(__file__).resolve().parents[2] / "deploy/loadtest/locustfile.py"
TEXTS = ["one two three", "twenty", "forty five thousand and six", "un deux", "cent et dix"]


@pytest.fixture(scope="module")
def real_server(tiny_repo: Path) -> Iterator[str]:
    from server_support import serve_app

    from seqserve.service.server.app import create_app
    from seqserve.service.web.settings import Settings

    # (a request may wait 30 s: tests that count every answer as a 200 are not about admission,
    # and the shared 2-core CI box stalls; service_fakes.SERVE_REPO_WAIT_S)
    settings = Settings(repo=tiny_repo, intra_op_threads=1, inter_op_threads=1, queue_size=64,
                        max_queue_wait_s=30.0)
    with serve_app(create_app(settings)) as url:
        yield url


def test_classify_against_the_real_server(real_server: str) -> None:
    cfg = LoadConfig(real_server, "tiny-clf", "classify", rate=30.0, requests=45, duration_s=None)
    s = run_load(cfg, TextSampler(TEXTS, seed=1)).summary
    assert s["sent"] == s["ok"] + s["errors"] == 45
    assert s["ok"] + s["shed"] == 45 and s["ok"] > 0, s["errors_by_status"]
    lat = s["latency_ms"]
    assert 0 < lat["p50"] <= lat["p99"] <= lat["max"]
    # The server's own Server-Timing breakdown was read for every answer.
    assert s["server_queue_ms"] is not None and s["server_compute_ms"]["max"] > 0


def test_translate_against_the_real_server(real_server: str) -> None:
    cfg = LoadConfig(real_server, "tiny-mt", "translate", concurrency=2, requests=12,
                     duration_s=None, beam_size=3)  # fmt: skip
    result = run_load(cfg, TextSampler(TEXTS, seed=2))
    s = result.summary
    assert s["sent"] == s["ok"] == 12, (s["errors_by_status"], s["errors_by_kind"])
    # A random tiny model still emits tokens (up to its length cap); each answer was counted.
    assert s["generated_tokens"] == sum(r.tokens for r in result.records) > 0
    assert s["tokens_per_s"] > 0


@pytest.fixture(scope="module")
def lm_server(endless_lm_repo: Path) -> Iterator[str]:
    """The real app serving "endless-lm" (eos all but impossible: every sequence runs to its
    max_new_tokens, so token counts are exact)."""
    from server_support import serve_app

    from seqserve.service.server.app import create_app
    from seqserve.service.web.settings import Settings

    settings = Settings(repo=endless_lm_repo, intra_op_threads=1, inter_op_threads=1,
                        queue_size=64, max_queue_wait_s=30.0)
    with serve_app(create_app(settings)) as url:
        yield url


def test_streamed_generate_times_every_token(lm_server: str) -> None:
    cfg = LoadConfig(lm_server, "endless-lm", "generate", concurrency=4, requests=12,
                     duration_s=None, stream=True, max_new_tokens=6)
    result = run_load(cfg, TextSampler(TEXTS, seed=3))
    s = result.summary
    assert s["sent"] == s["ok"] == 12, (s["errors_by_status"], s["errors_by_kind"])
    # usage.completion_tokens of every stream: 6 tokens per request.
    assert s["generated_tokens"] == 72 and s["tokens_per_s"] > 0
    for r in result.records:
        assert r.sent_s is not None and r.first_token_s is not None and r.done_s is not None
        assert r.sent_s < r.first_token_s <= r.done_s
        # Gaps are measured within each sequence; tokens whose text is empty may not send an
        # event, so at most 5 gaps per sequence of 6 tokens.
        assert 0 < len(r.token_gaps_s) <= 5 and all(g >= 0 for g in r.token_gaps_s)
    ttft, itl, lat = s["ttft_ms"], s["inter_token_ms"], s["latency_ms"]
    assert 0 < ttft["p50"] <= ttft["p99"] <= lat["max"]
    assert itl["min"] >= 0 and itl["p99"] <= lat["max"]


def test_generate_json_counts_tokens_and_cli_writes_token_plot(
    lm_server: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import argparse
    import csv
    import json

    from seqserve.cli import loadtest as command

    cfg = LoadConfig(lm_server, "endless-lm", "generate", concurrency=2, requests=4,
                     duration_s=None, max_new_tokens=5, temperature=0.0)
    s = run_load(cfg, TextSampler(TEXTS, seed=4)).summary
    assert s["ok"] == 4 and s["generated_tokens"] == 20 and "ttft_ms" not in s

    parser = argparse.ArgumentParser()
    command.add_arguments(parser)
    out = tmp_path / "gen"
    args = parser.parse_args([lm_server, "--model", "endless-lm", "--task", "generate",
                              "--stream", "--concurrency", "3", "--requests", "9",
                              "--max-new-tokens", "4", "--prompt-chars", "16", "--out", str(out),
                              "--quiet"])
    assert command.run(args) == 0  # prompts: the pydoc-topics test split (the default), cut
    # to 16 characters (the tiny model takes 48 tokens)
    printed = capsys.readouterr().out
    assert "first token ms (sched.)" in printed and "inter-token ms" in printed
    res = json.loads((out / "results.json").read_text())
    step = res["steps"][0]
    assert step["ok"] == 9 and step["generated_tokens"] == 36, (
        step["errors_by_status"], step["errors_by_kind"])
    assert step["ttft_ms"]["p99"] > 0 and "--stream" in res["command"]
    with (out / "results.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 9 and all(float(r["ttft_ms"]) > 0 for r in rows)
    png = (out / "token_latency.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5000


@pytest.fixture(scope="module")
def series_server(tiny_series_repo: Path) -> Iterator[str]:
    """The real app serving "tiny-series" (a stateful GRU tagger, 3 features, 16 steps)."""
    from server_support import serve_app

    from seqserve.service.server.app import create_app
    from seqserve.service.web.settings import Settings

    # these tests compare answers, not admission: a busy box's expected-wait estimate (the
    # default 0.5 s bound) refused 2 of 32 chunks once in CI
    settings = Settings(repo=tiny_series_repo, intra_op_threads=1, inter_op_threads=1,
                        queue_size=64, warmup=False, max_queue_wait_s=30.0)
    with serve_app(create_app(settings)) as url:
        yield url


def test_predict_random_series_against_the_real_server(series_server: str) -> None:
    cfg = LoadConfig(series_server, "tiny-series", "predict", concurrency=3, requests=12,
                     duration_s=None, features=3, series_steps=9, texts_per_request=2)
    s = run_load(cfg, TextSampler([""], seed=4)).summary
    assert s["sent"] == s["ok"] == 12, (s["errors_by_status"], s["errors_by_kind"])


def test_predict_session_chunks_against_the_real_server(series_server: str) -> None:
    """Each client streams 16-step series in 4 chunks through its own session: every chunk
    is answered (a 404 or 409 would mean the chunks of a session crossed)."""
    import httpx

    cfg = LoadConfig(series_server, "tiny-series", "predict", concurrency=4, requests=32,
                     duration_s=None, features=3, series_steps=16, session_chunks=4)
    s = run_load(cfg, TextSampler([""], seed=5)).summary
    assert s["sent"] == s["ok"] == 32, (s["errors_by_status"], s["errors_by_kind"])
    metrics = httpx.get(f"{series_server}/metrics", timeout=5).text

    def value(prefix: str) -> float:
        found = [line for line in metrics.splitlines() if line.startswith(prefix)]
        return float(found[0].split()[-1]) if found else 0.0

    ended = value('seqserve_session_lifetime_seconds_count{model="tiny-series"}')
    live = value('seqserve_live_sessions{model="tiny-series"}')
    # 32 chunks: 4 per ended series, 1 to 3 per series still open (at most one per client)
    assert ended >= 1 and live <= 4 and 4 * ended <= 32 <= 4 * ended + 3 * live, (ended, live)
    with pytest.raises(UserError):
        LoadConfig(series_server, "tiny-series", "predict", rate=5.0, session_chunks=2)


@pytest.mark.skipif(importlib.util.find_spec("locust") is None, reason="locust not installed")
def test_locustfile_runs_without_seqserve(real_server: str, tmp_path: Path) -> None:
    """deploy/loadtest/locustfile.py, headless for 2 s against the real server, from an
    isolated interpreter (-I, a temporary cwd) in which `import seqserve` fails: a plain
    locust install is all it needs."""
    texts = tmp_path / "texts.txt"
    texts.write_text("\n".join(TEXTS) + "\n", encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {
        "SEQSERVE_LOADTEST_TEXTS": str(texts),
        "SEQSERVE_LOADTEST_MODEL": "tiny-clf",
        "SEQSERVE_LOADTEST_TRANSLATE_MODEL": "tiny-mt",
        "SEQSERVE_LOADTEST_BEAM_SIZE": "2",
        "SEQSERVE_LOADTEST_WAIT": "0.05",
    }
    launch = ("import sys; sys.modules['seqserve'] = None; from locust.main import main; "
              "sys.argv[0] = 'locust'; sys.exit(main())")
    prefix = tmp_path / "locust"
    cmd = [sys.executable, "-I", "-c", launch, "-f", str(LOCUSTFILE), "--headless",
           "--host", real_server, "-u", "4", "-r", "4", "-t", "2s", "--only-summary",
           "--csv", str(prefix), "--loglevel", "WARNING"]  # fmt: skip
    proc = subprocess.run(cmd, env=env, cwd=tmp_path, capture_output=True, text=True,
                          timeout=90)
    assert proc.returncode == 0, proc.stderr[-2000:]
    with Path(f"{prefix}_stats.csv").open() as f:
        stats = {row["Name"]: row for row in csv.DictReader(f)}
    assert int(stats["classify"]["Request Count"]) > 0
    assert int(stats["translate"]["Request Count"]) > 0
    assert int(stats["Aggregated"]["Failure Count"]) == 0, proc.stderr[-2000:]
