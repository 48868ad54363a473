"""Saturation verdicts and plots from synthetic runs (records built here, no server)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from seqserve.loadtest.config import LoadConfig
from seqserve.loadtest.records import RequestRecord
from seqserve.loadtest.report import results_payload, write_results
from seqserve.loadtest.runner import RunResult
from seqserve.loadtest.stats import saturation_verdict, summarize
from seqserve.loadtest.tables import results_markdown, saturation_text

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _step(rate: float, capacity: float, n: int = 60, refused: int = 0) -> RunResult:
    """An open-loop step of `n` arrivals every 1/rate s at a one-at-a-time server taking
    1/capacity s per request; the last `refused` arrivals get a 429 after 1 ms."""
    records: list[RequestRecord] = []
    free_at = 0.0
    for i in range(n):
        at = (i + 1) / rate
        rec = RequestRecord(i, scheduled_s=at, sent_s=at)
        if i >= n - refused:
            rec.done_s, rec.outcome, rec.status = at + 0.001, "shed", 429
        else:
            free_at = max(free_at, at) + 1 / capacity
            rec.done_s, rec.outcome, rec.status = free_at, "ok", 200
        records.append(rec)
    cfg = LoadConfig("http://x", "m", rate=rate, requests=n, duration_s=None)
    result = RunResult(cfg, records, "t", wall_s=max(r.done_s or 0.0 for r in records))
    result.summary = summarize(result)
    return result


def test_a_sweep_past_capacity_is_saturated() -> None:
    """Capacity 25 req/s: 10 and 20 req/s are answered at their arrival pace, 40 req/s only
    at 25 (the queue grows)."""
    steps = [_step(rate, capacity=25.0) for rate in (10.0, 20.0, 40.0)]
    verdict = saturation_verdict([s.summary for s in steps], max_error_rate=0.01)
    assert verdict is not None and verdict["saturated"]
    assert verdict["saturated_at_rate"] == 40.0 and verdict["highest_unsaturated_rate"] == 20.0
    text = saturation_text(verdict)
    assert text is not None and text.startswith("saturated at 40 req/s offered")
    assert "highest rate without saturating: 20 req/s" in text
    payload = results_payload(steps)
    assert payload["saturation"] == verdict
    assert payload["saturation_rps"] == pytest.approx(verdict["peak_ok_rps"])
    assert 20.0 <= payload["saturation_rps"] <= 25.0
    assert "saturated at 40 req/s" in results_markdown([payload])


def test_refused_load_is_saturation() -> None:
    """Half of the 10 req/s step shed with 429: saturated at once, however fast the rest."""
    verdict = saturation_verdict([_step(10.0, capacity=1000.0, refused=30).summary], 0.01)
    assert verdict is not None and verdict["saturated"]
    assert verdict["saturated_at_rate"] == 10.0 and verdict["highest_unsaturated_rate"] is None
    assert "highest rate without saturating: none" in str(saturation_text(verdict))
    # Within a 60% error budget the same step kept up.
    assert not saturation_verdict([_step(10.0, 1000.0, refused=30).summary], 0.6)["saturated"]


def test_a_sweep_within_capacity_is_not_called_saturation() -> None:
    steps = [_step(rate, capacity=100.0) for rate in (10.0, 20.0, 40.0)]
    payload = results_payload(steps)
    verdict = payload["saturation"]
    assert verdict["saturated"] is False and verdict["saturated_at_rate"] is None
    assert verdict["highest_unsaturated_rate"] == 40.0 and payload["saturation_rps"] is None
    text = saturation_text(verdict)
    assert text is not None and text.startswith("no saturation: highest rate reached 40 req/s")
    md = results_markdown([payload])
    assert "no saturation: highest rate reached 40 req/s offered" in md
    assert "saturated at" not in md and "saturation 4" not in md


def test_closed_loop_and_schema_1_results_have_no_verdict() -> None:
    closed = _step(10.0, 100.0)
    closed.config = LoadConfig("http://x", "m", concurrency=4, requests=60, duration_s=None)
    closed.summary = summarize(closed)
    assert saturation_verdict([closed.summary], 0.01) is None
    assert results_payload([closed])["saturation_rps"] is None
    old = {"label": "old", "saturation_rps": 12.34, "steps": [closed.summary]}
    assert "peak 12.3 ok req/s" in results_markdown([old])


def _assert_png(path: Path) -> None:
    assert path.read_bytes()[:8] == PNG_MAGIC and path.stat().st_size > 5000


def test_single_rate_run_gets_latency_over_time_and_no_rate_plots(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    paths = write_results(tmp_path, [_step(20.0, 25.0, refused=5)], slo_p99_ms=100.0)
    _assert_png(paths["timeline_plot"])
    assert paths["timeline_plot"].name == "latency_over_time.png"
    _assert_png(tmp_path / "latency_hist.png")
    assert not (tmp_path / "latency_vs_rate.png").exists()
    assert not (tmp_path / "throughput_vs_rate.png").exists()
    assert "plots against rate skipped: one rate" in capsys.readouterr().out
    res = json.loads((tmp_path / "results.json").read_text())
    assert res["plots"] == {"timeline_plot": "latency_over_time.png",
                            "histogram": "latency_hist.png"}


def test_sweep_gets_every_plot(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    steps = [_step(rate, capacity=25.0) for rate in (10.0, 20.0, 40.0)]
    paths = write_results(tmp_path, steps)
    for key in ("timeline_plot", "histogram", "latency_plot", "throughput_plot"):
        _assert_png(paths[key])
    assert "skipped" not in capsys.readouterr().out
    res = json.loads((tmp_path / "results.json").read_text())
    assert set(res["plots"]) == {"timeline_plot", "histogram", "latency_plot",
                                 "throughput_plot"}
