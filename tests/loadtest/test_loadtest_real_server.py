"""The load tool against the real seqserve app (tiny bundles of tests/conftest.py `tiny_repo`)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from seqserve.loadtest.config import LoadConfig
from seqserve.loadtest.runner import run_load
from seqserve.loadtest.texts import TextSampler

pytestmark = pytest.mark.timeout(120)

TEXTS = ["one two three", "twenty", "forty five thousand and six", "un deux", "cent et dix"]


@pytest.fixture(scope="module")
def real_server(tiny_repo: Path) -> Iterator[str]:
    from server_support import serve_app

    from seqserve.service.server.app import create_app
    from seqserve.service.web.settings import Settings

    settings = Settings(repo=tiny_repo, intra_op_threads=1, inter_op_threads=1, queue_size=64)
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
