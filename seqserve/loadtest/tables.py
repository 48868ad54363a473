"""Text tables for the terminal and a markdown table for docs/performance.md."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from seqserve.loadtest.stats import CLIENT_LAG_WARN_MS

ROW_COLUMNS = (
    "offered", "sent", "ok", "errors", "shed", "dropped", "ok req/s", "tok/s",
    "p50 ms", "p90 ms", "p99 ms", "max ms", "srv queue p99", "srv compute p99", "send lag p99",
)  # fmt: skip


STREAM_COLUMNS = ("ttft p50", "ttft p99", "itl p50", "itl p99")
"""Extra columns of streamed generate runs (milliseconds)."""


def _num(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _pct(block: dict[str, float] | None, key: str) -> str:
    return "-" if not block else _num(block.get(key))


def _offered(summary: dict[str, Any]) -> str:
    if summary.get("offered_rate") is not None:
        return f"{summary['offered_rate']:g}/s"
    return f"c={summary.get('concurrency')}"


def columns_of(steps: Sequence[dict[str, Any]]) -> tuple[str, ...]:
    """ROW_COLUMNS, plus STREAM_COLUMNS when the steps timed tokens."""
    return ROW_COLUMNS + (STREAM_COLUMNS if any("ttft_ms" in s for s in steps) else ())


def summary_row(summary: dict[str, Any]) -> list[str]:
    """One step as the cells of ROW_COLUMNS (and STREAM_COLUMNS for a streamed run)."""
    lat = summary.get("latency_ms")
    extra = []
    if "ttft_ms" in summary:
        ttft, itl = summary.get("ttft_ms"), summary.get("inter_token_ms")
        extra = [_pct(ttft, "p50"), _pct(ttft, "p99"), _pct(itl, "p50"), _pct(itl, "p99")]
    return [
        _offered(summary),
        str(summary["sent"]),
        str(summary["ok"]),
        str(summary["errors"]),
        str(summary["shed"]),
        str(summary["dropped"]),
        _num(summary["throughput_rps"]),
        _num(summary.get("tokens_per_s")),
        _pct(lat, "p50"),
        _pct(lat, "p90"),
        _pct(lat, "p99"),
        _pct(lat, "max"),
        _pct(summary.get("server_queue_ms"), "p99"),
        _pct(summary.get("server_compute_ms"), "p99"),
        _pct(summary.get("send_lag_ms"), "p99") + (" (!)" if summary.get("client_behind") else ""),
        *extra,
    ]


def text_table(rows: Sequence[Sequence[str]], header: Sequence[str]) -> str:
    """Right-aligned columns separated by two spaces."""
    widths = [max(len(str(c)) for c in col) for col in zip(header, *rows, strict=True)]
    lines = [
        "  ".join(str(c).rjust(w) for c, w in zip(r, widths, strict=True)) for r in [header, *rows]
    ]
    return "\n".join(lines)


def _breakdown(summary: dict[str, Any]) -> str:
    parts = [f"{k}: {v}" for k, v in summary["errors_by_status"].items()]
    parts += [f"{k}: {v}" for k, v in summary["errors_by_kind"].items()]
    return ", ".join(parts) if parts else "none"


def _block_line(name: str, block: dict[str, float] | None) -> str:
    if not block:
        return f"{name:<24} -"
    cells = "  ".join(f"{k} {block[k]:.2f}" for k in ("p50", "p90", "p99", "max"))
    return f"{name:<24} {cells}"


def summary_text(summary: dict[str, Any]) -> str:
    """The end-of-run report of one step: counts, rates, latency and server timing."""
    lines = [
        f"{'requests':<24} scheduled {summary['scheduled']}  sent {summary['sent']}  "
        f"ok {summary['ok']}  errors {summary['errors']}  dropped (client) {summary['dropped']}",
        f"{'errors by status/kind':<24} {_breakdown(summary)}  (shed load 429/503: "
        f"{summary['shed']})",
        f"{'rates':<24} offered {_offered(summary)}  sent {_num(summary['sent_rps'])} req/s  "
        f"ok {_num(summary['throughput_rps'])} req/s  texts {_num(summary['texts_per_s'])}/s",
    ]
    if summary.get("tokens_per_s") is not None:
        lines.append(
            f"{'generated tokens':<24} {summary['generated_tokens']}  "
            f"({_num(summary['tokens_per_s'])} tokens/s)"
        )
    lines += [
        _block_line("latency ms (scheduled)", summary.get("latency_ms")),
        *([_block_line("first token ms (sched.)", summary.get("ttft_ms")),
           _block_line("first token ms (sent)", summary.get("ttft_sent_ms")),
           _block_line("inter-token ms", summary.get("inter_token_ms"))]
          if "ttft_ms" in summary else []),
        _block_line("latency ms (sent)", summary.get("service_ms")),
        _block_line("server queue ms", summary.get("server_queue_ms")),
        _block_line("server compute ms", summary.get("server_compute_ms")),
    ]
    if summary.get("send_lag_ms"):
        lines.append(_block_line("client send lag ms", summary["send_lag_ms"]))
    if summary.get("client_behind"):
        lines.append(CLIENT_WARNING)
    return "\n".join(lines)


CLIENT_WARNING = (
    "WARNING: the load generator fell behind its schedule (p99 send lag > "
    f"{CLIENT_LAG_WARN_MS:g} ms): latencies include client delay; run the tool on another "
    "machine or split the rate over several processes."
)


def steps_text(steps: Sequence[dict[str, Any]]) -> str:
    """One row per step (sweeps)."""
    table = text_table([summary_row(s) for s in steps], columns_of(steps))
    if any(s.get("client_behind") for s in steps):
        table += "\n(!) " + CLIENT_WARNING
    return table


def saturation_text(verdict: dict[str, Any] | None) -> str | None:
    """`stats.saturation_verdict` in words: "saturated at R req/s offered ..." only when a step
    saturated, else the highest rate reached without saturating (None for closed loop)."""
    if not verdict:
        return None
    peak = f"peak {verdict['peak_ok_rps']:.1f} ok req/s"
    highest = verdict["highest_unsaturated_rate"]
    if verdict["saturated"]:
        below = "none" if highest is None else f"{highest:g} req/s"
        return (f"saturated at {verdict['saturated_at_rate']:g} req/s offered ({peak}); "
                f"highest rate without saturating: {below}")
    return f"no saturation: highest rate reached {highest:g} req/s offered ({peak})"


def _md_row(cells: Sequence[str]) -> str:
    return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"


def results_markdown(results: Sequence[dict[str, Any]]) -> str:
    """A markdown section per results.json payload: a table of its steps and its command."""
    out: list[str] = []
    for res in results:
        cfg = res.get("config", {})
        title = res.get("label") or f"{cfg.get('model')} {cfg.get('task')}"
        out += [f"### {title}", ""]
        facts = [f"mode {res['steps'][0]['mode'] if res.get('steps') else '?'}"]
        if res.get("slo_p99_ms") is not None:
            best = res.get("best_rate")
            facts.append(
                f"p99 SLO {res['slo_p99_ms']:g} ms: highest passing rate "
                f"{'none' if best is None else f'{best:g} req/s'}"
            )
        verdict = saturation_text(res.get("saturation"))
        if verdict is None and res.get("saturation_rps") is not None and "saturation" not in res:
            verdict = f"peak {res['saturation_rps']:.1f} ok req/s"  # schema 1: no verdict
        if verdict is not None:
            facts.append(verdict)
        out += ["; ".join(facts) + ".", ""]
        columns = columns_of(res.get("steps", []))
        out += [_md_row(columns), _md_row(["---:"] * len(columns))]
        out += [_md_row(summary_row(step)) for step in res.get("steps", [])]
        if res.get("command"):
            out += ["", "```sh", res["command"], "```"]
        out.append("")
    return "\n".join(out)
