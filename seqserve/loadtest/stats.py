"""Summaries of a run: counts, rates, client latency and Server-Timing percentiles."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any, Protocol

from seqserve.loadtest.config import LoadConfig
from seqserve.loadtest.records import RequestRecord

PERCENTILES = (50, 90, 99)


def percentiles_ms(values_s: Iterable[float | None], scale: float = 1e3) -> dict[str, float] | None:
    """{"p50", "p90", "p99", "max", "mean", "min"} of the non-None values, times `scale`."""
    import numpy as np

    arr = np.array([v for v in values_s if v is not None], dtype=np.float64) * scale  # (N,)
    if arr.size == 0:
        return None
    out = {f"p{q}": float(np.percentile(arr, q)) for q in PERCENTILES}
    out |= {"max": float(arr.max()), "mean": float(arr.mean()), "min": float(arr.min())}
    return {k: round(v, 3) for k, v in out.items()}


def _span_rate(times: Sequence[float]) -> float | None:
    """Events per second over a sorted series: (n - 1) / (last - first)."""
    if len(times) < 2 or times[-1] <= times[0]:
        return None
    return (len(times) - 1) / (times[-1] - times[0])


def count_outcomes(records: Sequence[RequestRecord]) -> dict[str, Any]:
    """Scheduled = dropped + sent; sent = ok + errors; shed is the 429/503 part of errors."""
    outcomes = Counter(r.outcome for r in records)
    sent = [r for r in records if r.sent_s is not None]
    failed = [r for r in sent if r.outcome != "ok"]
    by_status = Counter(str(r.status) for r in failed if r.status is not None)
    by_kind = Counter(r.error or "unknown" for r in failed if r.status is None)
    return {
        "scheduled": len(records),
        "dropped": outcomes["dropped"],
        "sent": len(sent),
        "ok": outcomes["ok"],
        "errors": len(failed),
        "shed": outcomes["shed"],
        "errors_by_status": dict(sorted(by_status.items())),
        "errors_by_kind": dict(sorted(by_kind.items())),
    }


class Run(Protocol):
    """What a summary reads of a run (`runner.RunResult` is one)."""

    config: LoadConfig
    records: list[RequestRecord]
    wall_s: float


def summarize(result: Run) -> dict[str, Any]:
    """The numbers reported for one run (milliseconds, seconds, per-second rates)."""
    cfg, records, wall = result.config, result.records, max(result.wall_s, 1e-9)
    ok = [r for r in records if r.outcome == "ok"]
    counts = count_outcomes(records)
    tokens = sum(r.tokens for r in ok)
    texts = sum(r.texts for r in ok)
    sent_times = sorted(r.sent_s for r in records if r.sent_s is not None)
    summary: dict[str, Any] = {
        "mode": cfg.mode,
        "offered_rate": cfg.rate,
        "concurrency": cfg.concurrency,
        **counts,
        "duration_s": round(wall, 4),
        "scheduled_rate": _span_rate([r.scheduled_s for r in records]),
        "send_rate": _span_rate(sent_times),
        "completion_rate": _span_rate(sorted(r.done_s for r in ok if r.done_s is not None)),
        "sent_rps": counts["sent"] / wall,
        "throughput_rps": len(ok) / wall,
        "texts_per_s": texts / wall,
        "generated_tokens": tokens,
        "tokens_per_s": tokens / wall if cfg.task in ("translate", "generate") else None,
        "latency_ms": percentiles_ms(r.latency_s for r in ok),
        "service_ms": percentiles_ms(r.service_s for r in ok),
        "send_lag_ms": percentiles_ms(r.send_lag_s for r in records)
        if cfg.mode == "open"
        else None,
        "server_queue_ms": percentiles_ms((r.server_queue_ms for r in ok), scale=1.0),
        "server_compute_ms": percentiles_ms((r.server_compute_ms for r in ok), scale=1.0),
    }
    if cfg.stream:
        summary["ttft_ms"] = percentiles_ms(r.ttft_s for r in ok)
        summary["inter_token_ms"] = percentiles_ms(g for r in ok for g in r.token_gaps_s)
        first = [r.first_token_s - r.sent_s for r in ok
                 if r.first_token_s is not None and r.sent_s is not None]
        summary["ttft_sent_ms"] = percentiles_ms(first)
    summary["client_behind"] = client_behind(summary)
    return {k: round(v, 4) if isinstance(v, float) else v for k, v in summary.items()}


CLIENT_LAG_WARN_MS = 50.0
"""Open loop: a p99 send lag above this means the client, not the server, set the pace."""


def client_behind(summary: dict[str, Any]) -> bool:
    """True when the load generator could not send on schedule (its numbers then over-state
    latency and under-state the rate the server could take)."""
    lag = summary.get("send_lag_ms")
    return lag is not None and float(lag["p99"]) > CLIENT_LAG_WARN_MS


def meets_slo(summary: dict[str, Any], slo_p99_ms: float, max_error_rate: float) -> bool:
    """p99 (from scheduled time) within the SLO and errors plus drops within the error budget."""
    latency = summary.get("latency_ms")
    if not latency or summary["ok"] == 0:
        return False
    bad = summary["errors"] + summary["dropped"]
    return latency["p99"] <= slo_p99_ms and bad <= max_error_rate * summary["scheduled"]


KEEP_UP = 0.9
"""An open-loop step kept up while its ok answers came at >= this fraction of its arrival rate."""


def saturated(summary: dict[str, Any], max_error_rate: float) -> bool:
    """True when an open-loop step offered more than the server could take: it refused, failed
    or (client side) dropped more than `max_error_rate` of the scheduled requests, or its ok
    answers came back slower than the requests arrived (`completion_rate` below KEEP_UP of
    `scheduled_rate`, both counted over their own span: an unsaturated server answers at the
    pace of the arrivals, a saturated one at its capacity while its queue grows). A slow but
    keeping-up server is not saturated (that is the SLO's business); closed-loop steps never
    are (the client sets their pace)."""
    scheduled = summary["scheduled"]
    if summary.get("offered_rate") is None or scheduled == 0:
        return False
    if summary["errors"] + summary["dropped"] > max_error_rate * scheduled:
        return True
    arrivals, answers = summary.get("scheduled_rate"), summary.get("completion_rate")
    return arrivals is not None and answers is not None and answers < KEEP_UP * arrivals


def saturation_verdict(
    summaries: Sequence[dict[str, Any]], max_error_rate: float
) -> dict[str, Any] | None:
    """Where a series of open-loop steps at rising rates saturated the server (None for
    closed-loop runs): `saturated`, `saturated_at_rate` (the first saturated step's offered
    rate), `highest_unsaturated_rate` (the highest offered rate before it, or of all steps
    when none saturated) and `peak_ok_rps` (the best ok throughput of any step)."""
    if not summaries or any(s.get("offered_rate") is None for s in summaries):
        return None
    first = next((i for i, s in enumerate(summaries) if saturated(s, max_error_rate)), None)
    before = summaries if first is None else summaries[:first]
    return {
        "saturated": first is not None,
        "saturated_at_rate": None if first is None else summaries[first]["offered_rate"],
        "highest_unsaturated_rate": max((s["offered_rate"] for s in before), default=None),
        "peak_ok_rps": max(s["throughput_rps"] for s in summaries),
    }
