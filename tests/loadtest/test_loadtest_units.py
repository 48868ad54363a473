"""Load tool pieces without a server: schedules, header parsing, texts, summaries, tables."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from pathlib import Path

import pytest

from seqserve.loadtest.config import LoadConfig
from seqserve.loadtest.protocol import (
    build_payload,
    count_generated_tokens,
    parse_retry_after,
    parse_server_timing,
)
from seqserve.loadtest.records import RequestRecord
from seqserve.loadtest.runner import RunResult
from seqserve.loadtest.schedule import parse_sweep, poisson_arrivals
from seqserve.loadtest.stats import meets_slo, summarize
from seqserve.loadtest.tables import results_markdown, summary_text
from seqserve.loadtest.texts import TextSampler, load_text_file
from seqserve.models.errors import DataError, UserError

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("rate", [5.0, 50.0, 400.0])
def test_poisson_schedule_matches_rate_over_fixed_count(rate: float) -> None:
    arrivals = poisson_arrivals(rate, None, 2000, seed=3)
    assert len(arrivals) == 2000
    assert all(b > a for a, b in zip(arrivals, arrivals[1:], strict=False))
    # 2000 exponential gaps: the empirical rate is within a few % (sd ~2.2%).
    assert len(arrivals) / arrivals[-1] == pytest.approx(rate, rel=0.08)
    gaps = [b - a for a, b in zip(arrivals, arrivals[1:], strict=False)]
    mean = sum(gaps) / len(gaps)
    sd = (sum((g - mean) ** 2 for g in gaps) / len(gaps)) ** 0.5
    assert sd / mean == pytest.approx(1.0, abs=0.1)  # exponential: coefficient of variation 1


def test_poisson_schedule_seeded_and_bounded_by_duration() -> None:
    assert poisson_arrivals(20, 3.0, None, seed=1) == poisson_arrivals(20, 3.0, None, seed=1)
    assert poisson_arrivals(20, 3.0, None, seed=1) != poisson_arrivals(20, 3.0, None, seed=2)
    arrivals = poisson_arrivals(20, 3.0, None, seed=1)
    assert arrivals[-1] <= 3.0 and 30 < len(arrivals) < 90
    assert len(poisson_arrivals(1000, 3.0, 10, seed=1)) == 10


def test_parse_sweep() -> None:
    assert parse_sweep("10:50:20") == [10, 30, 50]
    assert parse_sweep("0.5:1:0.25") == [0.5, 0.75, 1.0]
    for bad in ("10:5:1", "1:2", "0:5:1", "a:b:c"):
        with pytest.raises(ValueError):
            parse_sweep(bad)


def test_server_timing_and_retry_after_parsing() -> None:
    assert parse_server_timing("queue;dur=1.5, compute;dur=3") == {"queue": 1.5, "compute": 3.0}
    assert parse_server_timing('queue;desc="q";dur="2.25",miss, total;dur=x') == {"queue": 2.25}
    assert parse_server_timing(None) == {}
    assert parse_retry_after("2") == 2.0
    assert parse_retry_after("0.5") == 0.5
    assert parse_retry_after("-3") == 0.0
    assert parse_retry_after("soon") is None
    date = "Wed, 21 Oct 2015 07:28:10 GMT"
    assert parse_retry_after(date, now_epoch=1445412480.0) == pytest.approx(10.0)


def test_count_generated_tokens_reads_result_shapes() -> None:
    assert count_generated_tokens({"results": [{"tokens": ["a", "b"]}, {"tokens": [7]}]}) == 3
    assert count_generated_tokens({"results": [{"token_ids": [1, 2, 3, 4]}]}) == 4
    nbest = {"results": [{"hypotheses": [{"tokens": [1, 2]}, {"tokens": [1]}]}]}
    assert count_generated_tokens(nbest) == 2
    assert count_generated_tokens({"translations": [{"num_tokens": 5}]}) == 5
    assert count_generated_tokens({"results": [{"label": "x"}]}) == 0
    assert count_generated_tokens([1, 2]) == 0
    assert build_payload("translate", ["a"], 4) == {"texts": ["a"], "beam_size": 4}
    assert build_payload("classify", ["a", "b"], 4) == {"texts": ["a", "b"]}


def test_config_checks_name_the_problem() -> None:
    with pytest.raises(UserError, match="exactly one"):
        LoadConfig("http://x", "m", rate=1, concurrency=2)
    with pytest.raises(UserError, match="exactly one"):
        LoadConfig("http://x", "m")
    with pytest.raises(UserError, match="rate"):
        LoadConfig("http://x", "m", rate=0)
    with pytest.raises(UserError, match="duration or a request count"):
        LoadConfig("http://x", "m", rate=1, duration_s=None)
    with pytest.raises(UserError, match="http://host:port"):
        LoadConfig("127.0.0.1:8000", "m", rate=1)
    cfg = LoadConfig("http://h:1/", "langid", "translate", concurrency=3)
    assert cfg.mode == "closed" and cfg.endpoint == "http://h:1/v1/models/langid/translate"
    assert cfg.with_rate(7).mode == "open"


def test_text_file_formats(tmp_path: Path) -> None:
    plain = tmp_path / "t.txt"
    plain.write_text("hello world\n\n  second line \n", encoding="utf-8")
    assert load_text_file(plain) == ["hello world", "second line"]
    jsonl = tmp_path / "t.jsonl"
    rows = [{"text": "a b", "label": "x"}, {"source": "one two", "target": "un deux"}]
    jsonl.write_text("\n".join(json.dumps(r) for r in rows), encoding="utf-8")
    assert load_text_file(jsonl) == ["a b", "one two"]
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"label": "x"}\n', encoding="utf-8")
    with pytest.raises(DataError, match="bad.jsonl:1"):
        load_text_file(bad)
    empty = tmp_path / "empty.txt"
    empty.write_text("\n", encoding="utf-8")
    with pytest.raises(DataError, match="empty"):
        load_text_file(empty)
    with pytest.raises(DataError, match="not found"):
        load_text_file(tmp_path / "missing.txt")


def test_sampler_replays_the_length_mix() -> None:
    texts = ["a"] * 90 + ["b c d e f g h i j k"] * 10
    draws = TextSampler(texts, seed=0).draw(5000)
    share_long = sum(len(t) > 1 for t in draws) / len(draws)
    assert share_long == pytest.approx(0.10, abs=0.02)
    assert TextSampler(texts, seed=5).draw(50) == TextSampler(texts, seed=5).draw(50)


def _record(i: int, outcome: str, status: int | None, latency: float) -> RequestRecord:
    rec = RequestRecord(i, scheduled_s=i * 0.1, sent_s=i * 0.1 + 0.001, done_s=i * 0.1 + latency)
    rec.outcome, rec.status = outcome, status  # type: ignore[assignment]
    rec.server_queue_ms, rec.server_compute_ms = 1.0 + i, 2.0
    return rec


def test_summary_counts_and_slo() -> None:
    records = [_record(i, "ok", 200, 0.01 * (i + 1)) for i in range(95)]
    records += [_record(95 + i, "shed", 429, 0.002) for i in range(3)]
    records.append(_record(98, "error", None, 0.003))
    records[-1].error = "ConnectError"
    dropped = RequestRecord(99, scheduled_s=9.9, outcome="dropped")
    records.append(dropped)
    cfg = LoadConfig("http://x", "m", rate=10, requests=100)
    summary = summarize(RunResult(cfg, records, "t", wall_s=10.0))
    assert summary["scheduled"] == 100 and summary["dropped"] == 1 and summary["sent"] == 99
    assert summary["ok"] + summary["errors"] == summary["sent"]
    assert summary["errors_by_status"] == {"429": 3} and summary["shed"] == 3
    assert summary["errors_by_kind"] == {"ConnectError": 1}
    lat = summary["latency_ms"]
    assert lat["min"] == pytest.approx(10.0) and lat["max"] == pytest.approx(950.0)
    assert lat["p50"] <= lat["p90"] <= lat["p99"] <= lat["max"]
    assert summary["throughput_rps"] == pytest.approx(9.5)
    assert summary["server_queue_ms"]["max"] == pytest.approx(95.0)
    # 5 of 100 bad: passes a 5% error budget, not a 1% one; p99 ~941 ms vs the SLO.
    assert meets_slo(summary, 1000, 0.05) and not meets_slo(summary, 1000, 0.01)
    assert not meets_slo(summary, 500, 0.05)
    text = summary_text(summary)
    assert "429: 3" in text and "ConnectError: 1" in text and "shed load" in text
    md = results_markdown([{"label": "demo", "steps": [summary], "command": "seqserve x"}])
    assert "### demo" in md and "| 10/s | 99 | 95 | 4 | 3 | 1 |" in md and "seqserve x" in md


def test_tool_imports_without_torch() -> None:
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "import seqserve.loadtest, seqserve.cli.loadtest\n"
        "from seqserve.loadtest import run_load, run_sweep, write_results\n"
        "assert 'torch' not in [m for m in sys.modules if sys.modules[m] is not None]\n"
        "assert 'httpx' not in sys.modules and 'matplotlib' not in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True, timeout=60)


def test_a_late_client_is_flagged() -> None:
    cfg = LoadConfig("http://x", "m", rate=10, requests=20)
    on_time = [_record(i, "ok", 200, 0.02) for i in range(20)]
    late = [_record(i, "ok", 200, 0.5) for i in range(20)]
    for rec in late[10:]:
        rec.sent_s = rec.scheduled_s + 0.3  # the client sent 300 ms after the schedule
    good = summarize(RunResult(cfg, on_time, "t", wall_s=2.0))
    bad = summarize(RunResult(cfg, late, "t", wall_s=2.0))
    assert not good["client_behind"] and "WARNING" not in summary_text(good)
    assert bad["client_behind"] and "fell behind" in summary_text(bad)
    assert bad["send_lag_ms"]["max"] == pytest.approx(300.0)


def test_generate_payloads_and_token_counts() -> None:
    assert build_payload("generate", ["a"], 5, max_new_tokens=7, temperature=0.0) == {
        "prompt": "a", "max_new_tokens": 7, "temperature": 0.0, "stream": False}
    both = build_payload("generate", ["a", "b"], 5, stream=True)
    assert both["prompts"] == ["a", "b"] and both["stream"] is True
    answer = {"results": [{"text": "xyz"}], "usage": {"prompt_tokens": 3,
                                                      "completion_tokens": 9}}
    assert count_generated_tokens(answer) == 9
    with pytest.raises(UserError, match="generate task only"):
        LoadConfig("http://x", "m", "classify", rate=1, stream=True)
    with pytest.raises(UserError, match="max_new_tokens"):
        LoadConfig("http://x", "m", "generate", rate=1, max_new_tokens=0)


def test_token_watch_times_sequences_from_split_bytes() -> None:
    from seqserve.loadtest.protocol import SSEParser, TokenWatch

    clock = itertools.count(1.0, 0.5)
    watch = TokenWatch(lambda: next(clock))
    body = (b'data: {"prompt_index": 0, "index": 0, "text": "a"}\n\n'
            b'data: {"prompt_index": 0, "index": 1, "text": "b"}\r\n\r\n'
            b'data: {"prompt_index": 0, "index": 0, "text": "c"}\n\n'
            b'data: {"prompt_index": 0, "index": 0, "finish_reason": "length"}\n\n'
            b'data: {"prompt_index": 0, "index": 1, "text": "d"}\n\n'
            b'data: {"usage": {"prompt_tokens": 1, "completion_tokens": 4}}\n\n'
            b"data: [DONE]\n\n")
    cuts = [0, 30, 60, 110, 150, 260, 330, len(body)]
    # the pieces arrive at clock 1.0, 1.5, 2.0, ... (a piece may end mid-event)
    for a, b in zip(cuts, cuts[1:], strict=False):
        if a < len(body):
            watch.feed(body[a:b])
    assert watch.done and watch.error is None and watch.tokens == 4
    assert watch.token_events == 4 and watch.first_token_s is not None
    assert len(watch.gaps_s) == 2 and all(g > 0 for g in watch.gaps_s)
    failed = TokenWatch(lambda: 0.0)
    failed.feed(b'event: error\ndata: {"error": {"code": "inference_failed"}}\n\n')
    assert failed.error is not None and not failed.done
    assert SSEParser().feed(b": comment\n\ndata: x\ndata: y\n\n") == [(None, "x\ny")]
