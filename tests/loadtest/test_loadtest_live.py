"""The load tool against a real uvicorn server (the stub app of conftest.py) on 127.0.0.1."""

from __future__ import annotations

from pathlib import Path
from statistics import mean
from typing import Any

import pytest

from seqserve.loadtest.config import LoadConfig
from seqserve.loadtest.runner import RunResult, run_load
from seqserve.loadtest.sweep import run_sweep
from seqserve.loadtest.texts import TextSampler, load_text_file

pytestmark = pytest.mark.timeout(60)


def _run(url: str, model: str, texts: Path, **kw: Any) -> RunResult:
    cfg = LoadConfig(url, model, **kw)
    return run_load(cfg, TextSampler(load_text_file(texts), cfg.seed))


def _check_counts(summary: dict[str, Any]) -> None:
    assert summary["scheduled"] == summary["sent"] + summary["dropped"]
    assert summary["sent"] == summary["ok"] + summary["errors"]
    by_status = sum(summary["errors_by_status"].values())
    assert summary["errors"] == by_status + sum(summary["errors_by_kind"].values())


def test_open_loop_counts_latencies_and_arrival_rate(stub_server: Any, texts_file: Path) -> None:
    rate, n = 80.0, 160
    res = _run(stub_server.url, "fast", texts_file, rate=rate, requests=n, duration_s=None)
    s = res.summary
    _check_counts(s)
    assert s["scheduled"] == n and s["sent"] == n and s["ok"] == n and s["dropped"] == 0
    assert stub_server.calls["fast"] >= n
    lat = s["latency_ms"]
    assert 0 < lat["min"] <= lat["p50"] <= lat["p90"] <= lat["p99"] <= lat["max"]
    # Scheduled arrivals: Poisson at `rate` over a fixed count (seeded: sd of the estimate ~8%).
    assert s["scheduled_rate"] == pytest.approx(rate, rel=0.25)
    # Actual sends follow the schedule: never early, and at the same rate over the run.
    assert all(r.sent_s is not None and r.sent_s >= r.scheduled_s for r in res.records)
    assert s["send_rate"] == pytest.approx(s["scheduled_rate"], rel=0.35)
    # Latency counts from the scheduled time, so it is never shorter than the send-to-answer time.
    assert all(r.latency_s >= r.service_s > 0 for r in res.records)  # type: ignore[operator]
    assert s["server_queue_ms"] is not None and s["server_compute_ms"]["min"] > 0
    assert s["tokens_per_s"] is None  # classify generates nothing


def test_latency_counts_from_schedule_under_overload(stub_server: Any, texts_file: Path) -> None:
    """A 50 ms server that serves one request at a time, offered 40 req/s (2x its capacity)."""
    from conftest import SERIAL_DELAY_S

    n = 40
    res = _run(stub_server.url, "serial", texts_file, rate=40.0, requests=n, duration_s=None)
    _check_counts(res.summary)
    assert res.summary["ok"] == n
    ordered = sorted(res.records, key=lambda r: r.scheduled_s)
    latencies = [r.latency_s for r in ordered if r.latency_s is not None]
    assert len(latencies) == n and mean(latencies[-10:]) > 2 * mean(latencies[:10])
    # The server needs >= n * delay to finish them all, while the last arrival is due at
    # max(scheduled): some request waited at least the difference, and the tool shows it.
    lower_bound = n * SERIAL_DELAY_S - max(r.scheduled_s for r in res.records)
    assert lower_bound > 0.5
    assert res.summary["latency_ms"]["max"] >= 1e3 * lower_bound * 0.95
    assert res.summary["server_queue_ms"]["max"] > res.summary["server_queue_ms"]["min"]


def test_client_overflow_is_counted_as_dropped(stub_server: Any, texts_file: Path) -> None:
    res = _run(
        stub_server.url, "serial", texts_file, rate=60.0, requests=30, duration_s=None,
        max_in_flight=1,
    )  # fmt: skip
    s = res.summary
    _check_counts(s)
    assert s["dropped"] > 0 and s["scheduled"] == 30
    assert all(r.sent_s is None for r in res.records if r.outcome == "dropped")


def test_429_is_reported_as_shed_load(stub_server: Any, texts_file: Path) -> None:
    res = _run(stub_server.url, "shed", texts_file, rate=50.0, requests=25, duration_s=None)
    s = res.summary
    _check_counts(s)
    assert s["sent"] == 25 and s["ok"] == 0 and s["shed"] == 25
    assert s["errors_by_status"] == {"429": 25} and s["latency_ms"] is None
    assert all(r.retry_after_s == 1.0 for r in res.records)


def test_closed_loop_honours_retry_after(stub_server: Any, texts_file: Path) -> None:
    duration, clients = 2.5, 2
    res = _run(stub_server.url, "shed", texts_file, concurrency=clients, duration_s=duration)
    s = res.summary
    _check_counts(s)
    # Each client waits Retry-After (1 s) after every 429: at most 1 + floor(2.5 / 1) sends.
    assert clients <= s["sent"] <= clients * 3
    assert s["shed"] == s["sent"]


def test_mixed_statuses_and_connection_errors(
    stub_server: Any, texts_file: Path, closed_port: int
) -> None:
    res = _run(stub_server.url, "flaky", texts_file, concurrency=3, requests=30, duration_s=None)
    s = res.summary
    _check_counts(s)
    assert s["sent"] == 30 and s["errors_by_status"] == {"503": s["shed"]}
    assert 5 <= s["shed"] <= 15 and s["ok"] == 30 - s["shed"]
    broken = _run(stub_server.url, "broken", texts_file, rate=40.0, requests=10, duration_s=None)
    assert broken.summary["errors_by_status"] == {"500": 10} and broken.summary["shed"] == 0
    gone = _run(f"http://127.0.0.1:{closed_port}", "fast", texts_file, rate=40.0, requests=10)
    _check_counts(gone.summary)
    assert gone.summary["errors_by_kind"] == {"ConnectError": 10}


def test_translate_counts_generated_tokens(stub_server: Any, texts_file: Path) -> None:
    res = _run(
        stub_server.url, "fast", texts_file, task="translate", rate=50.0, requests=30,
        duration_s=None, texts_per_request=2,
    )  # fmt: skip
    s = res.summary
    assert s["ok"] == 30
    # The stub returns one token per input word; the tool's total must match its own texts.
    assert s["generated_tokens"] == sum(r.tokens for r in res.records) > 60
    assert s["tokens_per_s"] == pytest.approx(s["generated_tokens"] / s["duration_s"], rel=1e-3)
    assert s["texts_per_s"] == pytest.approx(2 * s["throughput_rps"], rel=1e-3)


def test_sweep_finds_the_highest_rate_within_the_slo(stub_server: Any, texts_file: Path) -> None:
    """Serial 50 ms server: 5 req/s is far below capacity, 60 req/s is 3x over it."""
    cfg = LoadConfig(stub_server.url, "serial", rate=5.0, duration_s=1.0)
    lines: list[str] = []
    sweep = run_sweep(
        cfg, [5.0, 60.0, 80.0], texts=load_text_file(texts_file), slo_p99_ms=1000.0,
        progress=lines.append,
    )  # fmt: skip
    # 60/s for 1 s is ~60 requests needing ~3 s of serial service: p99 >> 1 s, so the sweep
    # stops there and never runs the 80/s step.
    assert [s.config.rate for s in sweep.steps] == [5.0, 60.0]
    assert sweep.passed == [True, False] and sweep.best_rate == 5.0
    assert sweep.saturation is not None and sweep.saturation["saturated_at_rate"] == 60.0
    assert sweep.saturation["highest_unsaturated_rate"] == 5.0
    assert sweep.saturation_rps is not None and sweep.saturation_rps <= 1 / 0.05 * 1.1
    assert any("sent" in line and "p99" in line for line in lines)  # live progress lines
