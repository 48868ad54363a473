"""PNG plots (matplotlib, Agg backend): latency over time, latency and throughput against
offered rate, histogram (and token latency for streamed generate).

Latency over time puts every request at its scheduled time since the run started (a sweep's
steps one after the other, each from its own start, gaps between steps left out), with rolling
p50/p90/p99 per time bin and each step's rate marked. The plots against rate need two or more
rates: a single-rate run gets none (one dot each), its latency over time says more."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from seqserve.loadtest.runner import RunResult

MAX_HIST_STEPS = 6
TIME_BINS = 40
"""Bins of the rolling percentiles over a run's whole span."""


def _plain_log_ticks(axis: Any) -> None:
    """Label a log axis with plain numbers (120, 300) instead of 1.2x10^2."""
    from matplotlib.ticker import FuncFormatter

    def minor(v: float, _pos: int) -> str:
        return f"{v:g}" if f"{v:e}"[0] in "25" else ""  # label 2x and 5x only

    axis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:g}"))
    axis.set_minor_formatter(FuncFormatter(minor))


def _x_of(step: RunResult) -> float:
    """Offered rate (open loop) or the achieved send rate (closed loop)."""
    return step.config.rate if step.config.rate is not None else step.summary["sent_rps"]


def _x_label(steps: list[RunResult]) -> str:
    if steps[0].config.mode == "open":
        return "offered rate (req/s)"
    return "send rate (req/s, closed loop)"


def _latency_plot(plt: Any, path: Path, steps: list[RunResult], slo: float | None) -> None:
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    xs = [_x_of(s) for s in steps]
    for key in ("p50", "p90", "p99", "max"):
        ys = [(s.summary["latency_ms"] or {}).get(key, float("nan")) for s in steps]
        ax.plot(xs, ys, marker="o", label=key)
    if slo is not None:
        ax.axhline(slo, color="red", linestyle="--", label=f"SLO p99 {slo:g} ms")
    ax.set(
        xlabel=_x_label(steps),
        ylabel="latency from scheduled send (ms)",
        title=f"{steps[0].config.model} {steps[0].config.task}: latency",
    )
    ax.set_yscale("log")
    _plain_log_ticks(ax.yaxis)
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _step_name(step: RunResult) -> str:
    rate = step.config.rate
    return f"{rate:g}/s" if rate is not None else f"c={step.config.concurrency}"


def _timeline_plot(plt: Any, np: Any, path: Path, steps: list[RunResult],
                   slo: float | None) -> None:
    fig, ax = plt.subplots(figsize=(8.0, 4.0))
    t_ok: list[float] = []
    lat_ok: list[float] = []
    t_bad: list[float] = []
    lat_bad: list[float] = []
    offset = 0.0
    for i, step in enumerate(steps):
        if len(steps) > 1:
            if i:
                ax.axvline(offset, color="gray", linestyle=":", linewidth=1)
            ax.text(offset, 1.0, f" {_step_name(step)}", transform=ax.get_xaxis_transform(),
                    va="bottom", fontsize="small")
        for r in step.records:
            lat = r.latency_s
            if lat is None:
                continue
            ts, ls = (t_ok, lat_ok) if r.outcome == "ok" else (t_bad, lat_bad)
            ts.append(offset + r.scheduled_s)
            ls.append(lat * 1e3)
        offset += step.wall_s
    ax.scatter(t_ok, lat_ok, s=4, color="lightgray", label="ok request")
    if t_bad:
        ax.scatter(t_bad, lat_bad, s=10, marker="x", color="red", label="failed or shed")
    if t_ok:
        times, lats = np.array(t_ok), np.array(lat_ok)
        edges = np.linspace(0.0, max(offset, float(times.max())) + 1e-9, TIME_BINS + 1)
        which = np.digitize(times, edges) - 1
        mids = (edges[:-1] + edges[1:]) / 2
        for q in (50, 90, 99):
            ys = [np.percentile(lats[which == b], q) if np.any(which == b) else np.nan
                  for b in range(TIME_BINS)]
            ax.plot(mids, ys, marker=".", label=f"p{q}")
        ax.set_yscale("log")
        _plain_log_ticks(ax.yaxis)
    else:
        ax.text(0.5, 0.5, "no successful requests", ha="center", transform=ax.transAxes)
    if slo is not None:
        ax.axhline(slo, color="red", linestyle="--", label=f"SLO p99 {slo:g} ms")
    title = f"{steps[0].config.model} {steps[0].config.task}: latency over time"
    if len(steps) == 1:
        title += f" at {_step_name(steps[0])}"
    ax.set(xlabel="time since start, by scheduled send (s)",
           ylabel="latency from scheduled send (ms)")
    ax.set_title(title, pad=14 if len(steps) > 1 else 6)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize="small", loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _throughput_plot(plt: Any, path: Path, steps: list[RunResult]) -> None:
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    xs = [_x_of(s) for s in steps]
    ax.plot(xs, [s.summary["throughput_rps"] for s in steps], marker="o", label="ok req/s")
    ax.plot(
        xs, [s.summary["sent_rps"] for s in steps], marker="x", linestyle=":", label="sent req/s"
    )
    if steps[0].config.mode == "open":
        ax.plot(xs, xs, color="gray", linestyle="--", label="offered")
    ax.set(
        xlabel=_x_label(steps),
        ylabel="requests/s",
        title=f"{steps[0].config.model} {steps[0].config.task}: throughput",
    )
    if steps[0].config.task in ("translate", "generate"):
        ax2 = ax.twinx()
        ax2.plot(
            xs,
            [s.summary["tokens_per_s"] or 0.0 for s in steps],
            color="green",
            marker="s",
            label="generated tokens/s",
        )
        ax2.set_ylabel("generated tokens/s")
        ax2.legend(loc="lower right")
    ax.grid(True, alpha=0.3)
    ax.legend(loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _histogram_plot(plt: Any, np: Any, path: Path, steps: list[RunResult]) -> None:
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    shown = steps[-MAX_HIST_STEPS:]
    data = [np.array([r.latency_s for r in s.records if r.outcome == "ok"]) * 1e3 for s in shown]
    nonempty = [d for d in data if d.size]
    if nonempty:
        lo = max(min(float(d.min()) for d in nonempty), 1e-3)
        hi = max(max(float(d.max()) for d in nonempty), lo * 1.01)
        bins = np.geomspace(lo, hi, 50)
        for step, d in zip(shown, data, strict=True):
            if d.size:
                label = f"{_x_of(step):.1f} req/s" if len(shown) > 1 else f"n={d.size}"
                ax.hist(d, bins=bins, histtype="step", label=label)
        ax.set_xscale("log")
        _plain_log_ticks(ax.xaxis)
        ax.legend()
    else:
        ax.text(0.5, 0.5, "no successful requests", ha="center", transform=ax.transAxes)
    ax.set(
        xlabel="latency from scheduled send (ms)",
        ylabel="requests",
        title=f"{steps[0].config.model} {steps[0].config.task}: latency histogram",
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _log_hist(ax: Any, np: Any, series: list[tuple[str, Any]], xlabel: str, title: str) -> None:
    """Step histograms of millisecond samples on shared log-spaced bins."""
    nonempty = [d for _, d in series if d.size]
    if not nonempty:
        ax.text(0.5, 0.5, "no samples", ha="center", transform=ax.transAxes)
    else:
        lo = max(min(float(d.min()) for d in nonempty), 1e-3)
        hi = max(max(float(d.max()) for d in nonempty), lo * 1.01)
        bins = np.geomspace(lo, hi, 50)
        for label, d in series:
            if d.size:
                ax.hist(d, bins=bins, histtype="step", label=label)
        ax.set_xscale("log")
        _plain_log_ticks(ax.xaxis)
        ax.legend(fontsize="small")
    ax.set(xlabel=xlabel, ylabel="count", title=title)


def _token_plot(plt: Any, np: Any, path: Path, steps: list[RunResult]) -> None:
    """Streamed generate: time to first token and inter-token latency histograms, with the
    p50/p99 of each step in the legend."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(10.0, 4.0))
    shown = steps[-MAX_HIST_STEPS:]
    ttft: list[tuple[str, Any]] = []
    itl: list[tuple[str, Any]] = []
    for step in shown:
        ok = [r for r in step.records if r.outcome == "ok"]
        name = f"{_x_of(step):.1f} req/s" if len(shown) > 1 else f"n={len(ok)}"
        t = np.array([r.ttft_s for r in ok if r.ttft_s is not None]) * 1e3
        g = np.array([x for r in ok for x in r.token_gaps_s]) * 1e3
        for arr, out in ((t, ttft), (g, itl)):
            tail = (f" p50 {np.percentile(arr, 50):.1f} p99 {np.percentile(arr, 99):.1f}"
                    if arr.size else "")
            out.append((name + tail, arr))
    model = steps[0].config.model
    _log_hist(left, np, ttft, "time to first token, from scheduled send (ms)",
              f"{model}: time to first token")
    _log_hist(right, np, itl, "gap between tokens of a sequence (ms)",
              f"{model}: inter-token latency")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_plots(out: Path, steps: list[RunResult], slo_p99_ms: float | None) -> dict[str, Path]:
    """latency_over_time.png and latency_hist.png in `out`, latency_vs_rate.png and
    throughput_vs_rate.png when the steps ran at two or more rates, and token_latency.png for
    a streamed generate run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    paths = {"timeline_plot": out / "latency_over_time.png", "histogram": out / "latency_hist.png"}
    _timeline_plot(plt, np, paths["timeline_plot"], steps, slo_p99_ms)
    _histogram_plot(plt, np, paths["histogram"], steps)
    if len({_x_of(s) for s in steps}) > 1:
        paths["latency_plot"] = out / "latency_vs_rate.png"
        paths["throughput_plot"] = out / "throughput_vs_rate.png"
        _latency_plot(plt, paths["latency_plot"], steps, slo_p99_ms)
        _throughput_plot(plt, paths["throughput_plot"], steps)
    if steps[0].config.stream:
        paths["token_plot"] = out / "token_latency.png"
        _token_plot(plt, np, paths["token_plot"], steps)
    return paths
