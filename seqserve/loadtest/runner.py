"""The load generator: an open-loop scheduler and a closed-loop client pool."""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from seqserve.loadtest.client import Client, Response, make_client
from seqserve.loadtest.config import LoadConfig
from seqserve.loadtest.live import LiveStats, ProgressFn, report_progress
from seqserve.loadtest.protocol import (
    SHED_STATUSES,
    TokenWatch,
    build_payload,
    chunk_sizes,
    count_generated_tokens,
    parse_retry_after,
    parse_server_timing,
    series_payload,
)
from seqserve.loadtest.records import RequestRecord
from seqserve.loadtest.schedule import poisson_arrivals
from seqserve.loadtest.stats import summarize
from seqserve.loadtest.texts import TextSampler

ERROR_PAUSE_S = 0.01
"""Closed loop: pause after an error or a shed answer without Retry-After (no hot loop)."""


@dataclass
class RunResult:
    """Everything one run produced."""

    config: LoadConfig
    records: list[RequestRecord]
    started_at: str
    """UTC ISO time the run started."""
    wall_s: float
    """Start to last completion, seconds."""
    summary: dict[str, Any] = field(default_factory=dict)
    """Filled by `stats.summarize`."""


class _Run:
    """Shared state of one run: clock origin, client, texts, counters."""

    def __init__(self, cfg: LoadConfig, sampler: TextSampler, client: Client) -> None:
        self.cfg = cfg
        self.sampler = sampler
        self.client = client
        self.live = LiveStats()
        self.records: list[RequestRecord] = []
        self.rng = random.Random(cfg.seed)
        self.t0 = time.perf_counter()

    def now(self) -> float:
        return time.perf_counter() - self.t0

    def new_record(self, scheduled_s: float) -> RequestRecord:
        record = RequestRecord(len(self.records), scheduled_s, texts=self.cfg.texts_per_request)
        self.records.append(record)
        return record

    async def send(self, record: RequestRecord, payload: dict[str, Any] | None = None) -> None:
        """Send one request (`payload`, else one drawn for the task) and fill in the record;
        never raises for network or HTTP trouble."""
        cfg = self.cfg
        if payload is None and cfg.task == "predict":
            payload = series_payload(self.rng, cfg.series_steps, cfg.features,
                                     cfg.texts_per_request)
        elif payload is None:
            payload = build_payload(cfg.task, self.sampler.draw(record.texts), cfg.beam_size,
                                    max_new_tokens=cfg.max_new_tokens,
                                    temperature=cfg.temperature, stream=cfg.stream)
        watch = TokenWatch(self.now) if cfg.stream else None
        record.sent_s = self.now()
        self.live.on_sent()
        try:
            response = await self.client.post_json(
                cfg.path, payload, None if watch is None else watch.feed)
        except Exception as exc:  # every transport failure is a counted error, not a crash
            record.done_s = self.now()
            record.outcome, record.error = "error", type(exc).__name__
            self.live.on_done(record)
            return
        record.done_s = self.now()
        _fill_from_response(record, response, cfg.task, streamed=watch is not None)
        if watch is not None and record.outcome == "ok":
            _fill_from_stream(record, watch)
        self.live.on_done(record)


def _fill_from_response(record: RequestRecord, response: Response, task: str,
                        streamed: bool = False) -> None:
    record.status = response.status
    timing = parse_server_timing(response.headers.get("server-timing"))
    record.server_queue_ms = timing.get("queue")
    record.server_compute_ms = timing.get("compute")
    if 200 <= response.status < 300:
        record.outcome = "ok"
        if task in ("translate", "generate") and not streamed:
            try:
                record.tokens = count_generated_tokens(response.json())
            except ValueError:
                record.outcome, record.error = "http_error", "InvalidJSON"
    elif response.status in SHED_STATUSES:
        record.outcome = "shed"
        record.retry_after_s = parse_retry_after(response.headers.get("retry-after"))
    else:
        record.outcome = "http_error"


def _fill_from_stream(record: RequestRecord, watch: TokenWatch) -> None:
    """A 200 event stream: its token times, and a failure if it broke or never finished."""
    record.first_token_s = watch.first_token_s
    record.token_gaps_s = watch.gaps_s
    record.tokens = watch.tokens if watch.tokens is not None else watch.token_events
    if watch.error is not None:
        record.outcome, record.error = "error", "StreamError"
    elif not watch.done:
        record.outcome, record.error = "error", "IncompleteStream"


async def _open_loop(run: _Run) -> None:
    """Launch each request at its Poisson arrival time without waiting for earlier ones."""
    cfg = run.cfg
    assert cfg.rate is not None
    arrivals = poisson_arrivals(cfg.rate, cfg.duration_s, cfg.requests, cfg.seed)
    in_flight: set[asyncio.Task[None]] = set()
    for at in arrivals:
        await asyncio.sleep(max(0.0, at - run.now()))  # also yields when behind schedule
        record = run.new_record(at)
        if len(in_flight) >= cfg.max_in_flight:
            record.outcome = "dropped"  # client-side overflow: counted, never sent
        else:
            task = asyncio.create_task(run.send(record))
            in_flight.add(task)
            task.add_done_callback(in_flight.discard)
        run.live.on_scheduled(record)
    if in_flight:
        await asyncio.gather(*in_flight)


async def _closed_worker(run: _Run, budget: list[int], client: int = 0) -> None:
    """One client: send, wait for the answer (and any Retry-After), send again. With session
    chunks, each request is the next chunk of this client's session; a chunk that fails
    starts the series over (a new session from its first chunk)."""
    cfg = run.cfg
    chunks: list[dict[str, Any]] = []
    series = 0
    while cfg.duration_s is None or run.now() < cfg.duration_s:
        if budget[0] <= 0:
            return
        budget[0] -= 1
        payload = None
        if cfg.session_chunks is not None:
            if not chunks:
                chunks = _session_chunks(run, f"lt-{cfg.seed}-{client}-{series}")
                series += 1
            payload = chunks.pop(0)
        record = run.new_record(run.now())
        run.live.on_scheduled(record)
        await run.send(record, payload)
        if cfg.session_chunks is not None and record.outcome != "ok":
            chunks = []  # the session's state is not known to be advanced: start over
        pause = 0.0
        if record.outcome == "shed" and record.retry_after_s is not None:
            pause = min(record.retry_after_s, cfg.max_retry_after_s)
        elif record.outcome in ("shed", "error"):
            pause = ERROR_PAUSE_S
        if cfg.duration_s is not None:
            pause = min(pause, max(0.0, cfg.duration_s - run.now()))
        if pause > 0:
            await asyncio.sleep(pause)


async def _closed_loop(run: _Run) -> None:
    cfg = run.cfg
    assert cfg.concurrency is not None
    budget = [cfg.requests if cfg.requests is not None else 2**62]
    await asyncio.gather(*(_closed_worker(run, budget, i) for i in range(cfg.concurrency)))


def _session_chunks(run: _Run, session: str) -> list[dict[str, Any]]:
    """One random series as the predict bodies of its session's chunks."""
    cfg = run.cfg
    assert cfg.session_chunks is not None
    steps = series_payload(run.rng, cfg.series_steps, cfg.features)["series"][0]
    out, at = [], 0
    sizes = chunk_sizes(cfg.series_steps, cfg.session_chunks)
    for i, n in enumerate(sizes):
        out.append({"series": [steps[at : at + n]], "session": session, "start": i == 0,
                    "end": i == len(sizes) - 1})
        at += n
    return out


async def arun_load(
    cfg: LoadConfig, sampler: TextSampler, progress: ProgressFn | None = None, label: str = ""
) -> RunResult:
    """Run one load test (open or closed loop) and return its records and summary."""
    connections = cfg.max_in_flight if cfg.mode == "open" else (cfg.concurrency or 1)
    started_at = datetime.now(UTC).isoformat(timespec="seconds")
    client = make_client(cfg.http_client, cfg.url, connections, cfg.timeout_s)
    try:
        run = _Run(cfg, sampler, client)
        reporter = None
        if progress is not None:
            reporter = asyncio.create_task(report_progress(run.live, progress, label))
        try:
            await (_open_loop(run) if cfg.mode == "open" else _closed_loop(run))
        finally:
            if reporter is not None:
                reporter.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await reporter
        wall_s = run.now()
    finally:
        await client.aclose()
    result = RunResult(cfg, run.records, started_at, wall_s)
    result.summary = summarize(result)
    return result


def run_load(
    cfg: LoadConfig, sampler: TextSampler, progress: ProgressFn | None = None, label: str = ""
) -> RunResult:
    """Blocking wrapper of `arun_load`."""
    return asyncio.run(arun_load(cfg, sampler, progress, label))
