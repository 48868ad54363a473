"""Prometheus metrics of one process (a private CollectorRegistry, never the global one).

Names and labels follow docs/contracts.md. `ModelMetrics` is the one adapter through which
the schedulers (batcher, decode scheduler) record into it.

Across processes (API processes + engine): with `PROMETHEUS_MULTIPROC_DIR` set before
prometheus_client is imported (the supervisor sets it for every child), every process writes
its samples there and `/metrics` of any API process reports the sum over all of them
(prometheus-client's multiprocess mode). Gauges say how they combine: request gauges add up
over live processes, engine gauges come from the one engine.
"""

from __future__ import annotations

import asyncio
import os
import resource
import threading
import time
from bisect import bisect_left
from collections.abc import Sequence
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client import values as prometheus_values
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.multiprocess import MultiProcessCollector

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"

_pid = os.getpid()


def _after_fork() -> None:
    global _pid
    _pid = os.getpid()


def cached_pid() -> int:
    """This process's pid, read once and again after a fork (`os.register_at_fork`).
    prometheus-client's multiprocess values ask for the pid on every increment and observation
    (to notice a fork); `os.getpid()` is a system call each time: 22 of them per translation
    request (strace of an API process under load), more calls than any other."""
    return _pid


os.register_at_fork(after_in_child=_after_fork)
if prometheus_values.ValueClass is not prometheus_values.MutexValue:
    # prometheus-client chose multiprocess values (from its environment variable at import):
    # the same values, with the pid from `cached_pid` (for the metrics made from here on)
    prometheus_values.ValueClass = prometheus_values.MultiProcessValue(cached_pid)

LATENCY_BUCKETS = (
    0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0,
)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
TOKEN_BUCKETS = (16, 64, 256, 1024, 4096, 16384, 65536)
SESSION_BUCKETS = (0.1, 1.0, 10.0, 60.0, 300.0, 1800.0, 3600.0, 4 * 3600.0, 24 * 3600.0)
RATIO_BUCKETS = (1.0, 1.05, 1.1, 1.15, 1.25, 1.5, 2.0, 3.0, 5.0)
LOAD_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
WAIT_ERROR_BUCKETS = (-2.0, -1.0, -0.5, -0.25, -0.1, -0.05, -0.02, -0.01, -0.005, 0.005, 0.01,
                      0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0)
"""Signed seconds, actual minus expected queue wait: symmetric around 0 (within +-5 ms: the
estimate was right), out to the 0.5 s default `--max-queue-wait-s` and beyond, so that an
estimate running high (negative: it would refuse what meets the bound) and one running low
(positive: it admits what waits past the bound) read apart from the bucket counts."""
MODEL = ("model",)
PROCESS_EVERY_S = 5.0
"""How often each process records its own process metrics (`Metrics.watch_process`)."""
PAGE = os.sysconf("SC_PAGE_SIZE")
TICKS = os.sysconf("SC_CLK_TCK")


def _boot_time() -> float:
    try:
        with open("/proc/stat", "rb") as f:
            for line in f:
                if line.startswith(b"btime "):
                    return float(line.split()[1])
    except OSError:
        pass
    return 0.0


def read_process(gauges: dict[str, Any], seen: list[float]) -> None:
    """Set the process metrics (`Metrics.process`, label-bound; `seen`: the CPU seconds
    counted so far) from /proc/self: what
    prometheus-client's own process collector reports, which its multiprocess mode cannot
    (every process's numbers would be read by the one answering the scrape)."""
    try:
        with open("/proc/self/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        with open("/proc/self/statm", "rb") as f:
            vms, rss = (int(x) for x in f.read().split()[:2])
        fds = len(os.listdir("/proc/self/fd"))
    except OSError:  # no /proc (not Linux): nothing to report
        return
    cpu = (int(fields[11]) + int(fields[12])) / TICKS  # utime + stime
    gauges["cpu"].inc(max(0.0, cpu - seen[0]))  # a counter: what was used since last time
    seen[0] = max(seen[0], cpu)
    gauges["start"].set(_boot_time() + int(fields[19]) / TICKS)  # starttime
    gauges["rss"].set(rss * PAGE)
    gauges["vms"].set(vms * PAGE)
    gauges["fds"].set(fds)
    gauges["max_fds"].set(resource.getrlimit(resource.RLIMIT_NOFILE)[0])


class Tally:
    """The request path's increments, added up over an event-loop turn and written once at
    its end: a turn that answers 16 requests writes each touched series once, not 16 times
    (in multiprocess mode each write is a locked mmap write of ~1.5 us, and a request touches
    ~15 series). Only calls on a thread that runs an event loop wait for the turn's end (the
    loop's `call_soon`); any other thread's are written at once. `/metrics` writes what is
    pending first (`Metrics.exposition`)."""

    def __init__(self) -> None:
        self._adds: dict[Any, float] = {}  # a counter or gauge child, or a histogram's value
        self._sets: dict[Any, float] = {}  # a gauge child
        self._loop: asyncio.AbstractEventLoop | None = None  # the one whose turn is pending

    def _deferred(self) -> bool:
        """Whether this call's write may wait for its loop turn's end (scheduled here)."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return False
        if self._loop is not loop and self._loop is not None and self._loop.is_closed():
            self.flush()  # its loop ended before the turn's end came: written now
        if self._loop is None:
            self._loop = loop
            loop.call_soon(self.flush)
        return self._loop is loop

    def inc(self, child: Any, amount: float = 1.0) -> None:
        """`child.inc(amount)` (a counter's or gauge's child; a gauge's may be negative)."""
        if self._deferred():
            self._adds[child] = self._adds.get(child, 0.0) + amount
        else:
            child.inc(amount)

    def observe(self, child: Any, amount: float) -> None:
        """`child.observe(amount)` of a histogram's child: its sum and its bucket (the
        first whose bound is >= amount, as prometheus-client's `observe` picks it)."""
        if not self._deferred():
            child.observe(amount)
            return
        adds = self._adds
        total = child._sum  # noqa: SLF001
        adds[total] = adds.get(total, 0.0) + amount
        if amount == amount:  # NaN falls in no bucket
            bucket = child._buckets[bisect_left(child._upper_bounds, amount)]  # noqa: SLF001
            adds[bucket] = adds.get(bucket, 0.0) + 1.0

    def set(self, child: Any, value: float) -> None:
        """`child.set(value)` of a gauge's child: the turn's last value is written."""
        if self._deferred():
            self._sets[child] = value
        else:
            child.set(value)

    def flush(self) -> None:
        """Write what is pending."""
        adds, sets = self._adds, self._sets
        self._adds, self._sets, self._loop = {}, {}, None
        for target, amount in adds.items():
            if amount:
                target.inc(amount)
        for child, value in sets.items():
            child.set(value)


class Metrics:
    """Every instrument of the server, registered in `self.registry`."""

    def __init__(self) -> None:
        r = self.registry = CollectorRegistry(auto_describe=True)
        self.tally = Tally()
        """Where the request path's series are written from (`Tally`)."""
        self._children: dict[tuple[int, tuple[str, ...]], Any] = {}
        self._requests: dict[tuple[str, str, int], tuple[Any, Any, Any, Any]] = {}
        self._per_version: dict[tuple[str, int, bool], tuple[Any, ...]] = {}

        def histogram(name: str, doc: str, buckets: tuple[float, ...] = LATENCY_BUCKETS,
                      labels: tuple[str, ...] = MODEL) -> Histogram:
            return Histogram(name, doc, labels, registry=r, buckets=buckets)

        def gauge(name: str, doc: str, mode: str = "livesum",
                  labels: tuple[str, ...] = MODEL) -> Gauge:
            return Gauge(name, doc, labels, registry=r, multiprocess_mode=mode)  # type: ignore[arg-type]

        def counter(name: str, doc: str, labels: tuple[str, ...] = MODEL) -> Counter:
            return Counter(name, doc, labels, registry=r)

        me = ("model", "endpoint")
        self.request_duration = histogram("seqserve_request_duration_seconds",
                                          "Request wall time in the server.", labels=me)
        self.queue_time = histogram("seqserve_queue_time_seconds",
                                    "Time a request waited for its batch.", labels=me)
        self.compute_time = histogram("seqserve_compute_time_seconds",
                                      "Runtime time of the request's batch.", labels=me)
        self.batch_size = histogram("seqserve_batch_size", "Rows per batch.", BATCH_BUCKETS)
        self.batch_tokens = histogram("seqserve_batch_tokens",
                                      "Padded tokens per batch (rows x longest row).",
                                      TOKEN_BUCKETS)
        self.padding_ratio = histogram("seqserve_padding_ratio",
                                       "Padded tokens / real tokens per batch.", RATIO_BUCKETS)
        self.queue_depth = gauge("seqserve_queue_depth", "Rows waiting in the model's queue.")
        self.in_flight = gauge("seqserve_in_flight_requests",
                               "Requests admitted and not yet answered.")
        self.requests = counter("seqserve_requests", "Answered requests by status.",
                                ("model", "endpoint", "status"))
        self.model_ready = gauge("seqserve_model_ready", "1 when the model version serves, "
                                 "else 0.", "livemax", ("model", "version"))
        self.load_failures = counter("seqserve_model_load_failures", "Bundles that failed "
                                     "verification or loading.", ("model", "version"))
        self.encoder_time = histogram("seqserve_encoder_time_seconds",
                                      "Encoder runtime per admission batch.")
        self.decoder_step_time = histogram("seqserve_decoder_step_time_seconds",
                                           "Decoder step runtime.")
        self.live_hypotheses = gauge("seqserve_live_hypotheses",
                                     "Hypothesis rows in the decode scheduler.")
        self.generated_tokens = counter("seqserve_generated_tokens",
                                        "Tokens emitted by decoding.")
        self.decode_steps = counter("seqserve_decode_steps", "Decoder steps run.")
        self.time_per_token = histogram("seqserve_time_per_token_seconds",
                                        "Request time / generated tokens.")
        self.time_to_first_token = histogram(
            "seqserve_time_to_first_token_seconds",
            "Language models: request start to its first generated token.")
        self.inter_token_latency = histogram(
            "seqserve_inter_token_latency_seconds",
            "Language models: time between a request's consecutive generated tokens.")
        self.live_sequences = gauge("seqserve_live_sequences",
                                    "Language models: sequences being generated.")
        self.prefix_cache = counter("seqserve_prefix_cache_events", "Language models' prefix "
                                    "cache: lookups that hit or missed, entries evicted.",
                                    ("model", "event"))
        self.prefix_cache_tokens = counter("seqserve_prefix_cache_hit_tokens",
                                           "Prompt tokens cached prefixes saved.")
        self.prefix_cache_bytes = gauge("seqserve_prefix_cache_bytes",
                                        "Bytes the language models' prefix caches hold.")
        self.live_sessions = gauge("seqserve_live_sessions",
                                   "Feature-sequence models: live stateful sessions.")
        self.session_lifetime = histogram(
            "seqserve_session_lifetime_seconds",
            "Feature-sequence models: a session's start to its end or expiry.", SESSION_BUCKETS)
        self.expired_sessions = counter("seqserve_expired_sessions",
                                        "Sessions expired after their idle timeout.")
        self.session_capacity = gauge("seqserve_session_capacity", "Feature-sequence "
                                      "models: most live sessions (max_sessions).")
        self.wait_estimate_error = histogram(
            "seqserve_queue_wait_estimate_error_seconds",
            "Admitted work: its actual queue wait (submission to the start of its batch, or "
            "its admission to decoding) minus the wait admission expected for it "
            "(--max-queue-wait-s refuses by that expectation); negative: the estimate ran "
            "high. Rows of a batcher, sources of a translator, requests of a language model; "
            "an unmeasured estimate counts as 0 (admission takes it as no wait).",
            WAIT_ERROR_BUCKETS)
        self.wait_model_error = histogram(
            "seqserve_queue_wait_model_error_seconds",
            "Admitted work: its actual queue wait minus the scheduler's cost model's estimate "
            "before the margin admission adds for the estimate's own recent error (what "
            "seqserve_queue_wait_estimate_error_seconds measures is this estimate times that "
            "margin): how well the model predicts, apart from the safety admission keeps.",
            WAIT_ERROR_BUCKETS)
        self.session_refusals = counter(
            "seqserve_session_refusals", "Session chunks the session table refused, by "
            "reason: full (max_sessions), busy (a chunk in flight), unknown (not live).",
            ("model", "reason"))
        self.engine_restarts = counter(
            "seqserve_engine_restarts", "Engine processes the supervisor started again, by "
            "why the one before ended: exit (it died) or hang (it answered nothing for "
            "engine_hang_timeout_s and was killed).", ("reason",))
        self._model_control(histogram, gauge, counter)
        role = ("role",)  # one series per live process (and its pid, across processes)
        self.process = {
            "cpu": counter("process_cpu_seconds", "CPU time (user + system) this process "
                           "used, in seconds.", ("role", "pid")),
            "rss": gauge("process_resident_memory_bytes", "Resident memory size, in bytes.",
                         "liveall", role),
            "vms": gauge("process_virtual_memory_bytes", "Virtual memory size, in bytes.",
                         "liveall", role),
            "fds": gauge("process_open_fds", "Open file descriptors.", "liveall", role),
            "max_fds": gauge("process_max_fds", "The most file descriptors this process may "
                             "open.", "liveall", role),
            "start": gauge("process_start_time_seconds", "Unix time the process started.",
                           "liveall", role),
        }
        self._watching: threading.Event | None = None

    def watch_process(self, role: str, every_s: float = PROCESS_EVERY_S) -> None:
        """Record this process's CPU, memory, descriptors and start time under `role` (api,
        engine, supervisor, server) now and every `every_s` seconds from a daemon thread,
        until `stop_watching` (module doc)."""
        if self._watching is not None:
            return
        stop = self._watching = threading.Event()
        gauges = {k: g.labels(role=role) for k, g in self.process.items() if k != "cpu"}
        gauges["cpu"] = self.process["cpu"].labels(role=role, pid=str(os.getpid()))
        seen = [0.0]
        read_process(gauges, seen)

        def run() -> None:
            while not stop.wait(every_s):
                read_process(gauges, seen)

        threading.Thread(target=run, name="seqserve-process-metrics", daemon=True).start()

    def stop_watching(self) -> None:
        """At the app's end: the process watch stops, and what the last turn left is
        written."""
        self.tally.flush()
        if self._watching is not None:
            self._watching.set()
            self._watching = None

    def _model_control(self, histogram: Any, gauge: Any, counter: Any) -> None:
        """Models loaded and unloaded while serving (`engine.control`), and the statistics
        of each version's requests (the OIP statistics extension, summed over processes)."""
        mv = ("model", "version")
        self.load_seconds = histogram("seqserve_model_load_seconds", "One process's load of "
                                      "a model version: verify, open runtimes, warm up.",
                                      LOAD_BUCKETS)
        self.unload_seconds = histogram("seqserve_model_unload_seconds", "One process's "
                                        "unload of a model version: drain, then free.",
                                        LOAD_BUCKETS)
        self.loads = counter("seqserve_model_loads", "Model versions loaded by the model "
                             "control, by outcome (ready, failed).", (*mv, "outcome"))
        self.unloads = counter("seqserve_model_unloads", "Model versions unloaded by the "
                               "model control.", mv)
        self.versions_loaded = gauge("seqserve_model_versions_loaded", "Versions of the "
                                     "model that serve.", "livemax")
        self.files_changed = gauge("seqserve_model_files_changed", "1 while the version "
                                   "serves the copy verified when it loaded and its files in "
                                   "the repository changed since and do not load (the "
                                   "repository index gives why), else 0.", "livemax", mv)
        self.last_scan = gauge("seqserve_repository_last_scan_timestamp_seconds", "Unix time "
                               "of the model control's last repository scan.", "max", ())
        self.inferences = counter("seqserve_model_inferences", "Requests answered per model "
                                  "version, by outcome (success, fail).", (*mv, "outcome"))
        self.inference_seconds = counter("seqserve_model_inference_seconds", "Cumulative "
                                         "seconds per model version: requests (success, "
                                         "fail), queue and compute.", (*mv, "stage"))
        self.last_inference = gauge("seqserve_model_last_inference_timestamp_seconds",
                                    "Unix time of the version's last answered request.",
                                    "max", mv)

    def request_series(self, model: str, endpoint: str, status: int
                       ) -> tuple[Any, Any, Any, Any]:
        """The label-bound series of one (model, endpoint, status) answer, looked up once:
        its request count, duration, queue and compute time (HTTP and gRPC alike)."""
        key = (model, endpoint, status)
        found = self._requests.get(key)
        if found is None:
            found = self._requests[key] = (
                self.requests.labels(model, endpoint, str(status)),
                self.request_duration.labels(model, endpoint),
                self.queue_time.labels(model, endpoint), self.compute_time.labels(model, endpoint))
        return found

    def on_request(self, model: str, endpoint: str, status: int, seconds: float,
                   call: Any = None) -> None:
        """One answer (HTTP or gRPC): its count and duration, and its call's queue and compute
        time when it computed (`call`: the request's context, with `computed`, `queue_s` and
        `compute_s`)."""
        requests, duration, queue, compute = self.request_series(model, endpoint, status)
        tally = self.tally
        tally.inc(requests)
        tally.observe(duration, seconds)
        if call is not None and call.computed:
            tally.observe(queue, call.queue_s)
            tally.observe(compute, call.compute_s)

    def child(self, metric: Any, *labels: str) -> Any:
        """`metric.labels(*labels)`, looked up once per label values (prometheus-client's own
        lookup takes a lock and builds the key on every call)."""
        key = (id(metric), labels)
        found = self._children.get(key)
        if found is None:
            found = self._children[key] = metric.labels(*labels)
        return found

    def on_inference(self, model: str, version: int, ok: bool, seconds: float,
                     timing: Any) -> None:
        """One request answered by a model version (its statistics, `timing`: the request's
        context, with `computed`, `queue_s` and `compute_s`)."""
        key = (model, version, ok)
        found = self._per_version.get(key)
        if found is None:
            v, outcome = str(version), "success" if ok else "fail"
            found = self._per_version[key] = (
                self.inferences.labels(model, v, outcome),
                self.inference_seconds.labels(model, v, outcome),
                self.inference_seconds.labels(model, v, "queue"),
                self.inference_seconds.labels(model, v, "compute"),
                self.last_inference.labels(model, v))
        count, total, queue, compute, last = found
        tally = self.tally
        tally.inc(count)
        tally.inc(total, seconds)
        if timing.computed:
            tally.inc(queue, timing.queue_s)
            tally.inc(compute, timing.compute_s)
        tally.set(last, time.time())

    def exposition(self) -> tuple[bytes, str]:
        """Body and content type of `/metrics`: this process's registry, or every process's
        samples in multiprocess mode."""
        self.tally.flush()
        return generate_latest(self.readable()), CONTENT_TYPE_LATEST

    def readable(self) -> CollectorRegistry:
        """Where every process's samples are read: in multiprocess mode a collector of them
        all, else this process's registry."""
        if os.environ.get(MULTIPROC_ENV):
            registry = CollectorRegistry()
            MultiProcessCollector(registry)
            return registry
        return self.registry

    def observer(self, model: str) -> ModelMetrics:
        """The scheduler-side instruments of one model, labels bound (a scheduling Observer)."""
        return ModelMetrics(self, model)


def shared_metrics(directory: str) -> Metrics:
    """A process's instruments written to `directory` beside its children's, for a process
    that imported prometheus-client before that folder existed (the supervisor: the model
    control's events)."""
    os.environ[MULTIPROC_ENV] = directory
    prometheus_values.ValueClass = prometheus_values.MultiProcessValue(cached_pid)
    return Metrics()


class ModelMetrics:
    """Records what a batcher or decode scheduler reports
    (`seqserve.service.scheduling.base.Observer`)
    into the app's instruments, labels bound to one model."""

    def __init__(self, metrics: Metrics, model: str) -> None:
        m = metrics
        self.batch_size = m.batch_size.labels(model)
        self.batch_tokens = m.batch_tokens.labels(model)
        self.padding_ratio = m.padding_ratio.labels(model)
        self.queue_depth = m.queue_depth.labels(model)
        self.live = m.live_hypotheses.labels(model)
        self.encoder_time = m.encoder_time.labels(model)
        self.step_time = m.decoder_step_time.labels(model)
        self.steps = m.decode_steps.labels(model)
        self.tokens = m.generated_tokens.labels(model)
        self.per_token = m.time_per_token.labels(model)
        self.live_sequences = m.live_sequences.labels(model)
        self.live_sessions = m.live_sessions.labels(model)
        self.session_lifetime = m.session_lifetime.labels(model)
        self.expired_sessions = m.expired_sessions.labels(model)
        self.session_capacity = m.session_capacity.labels(model)
        self._session_refusals = m.session_refusals
        self._wait_errors = (m.wait_estimate_error.labels(model),
                             m.wait_model_error.labels(model))
        self._model = model
        self._cache = {e: m.prefix_cache.labels(model, e) for e in ("hit", "miss", "evicted")}
        self._cache_tokens = m.prefix_cache_tokens.labels(model)
        self._cache_bytes = m.prefix_cache_bytes.labels(model)
        self._cache_seen = (0, 0, 0, 0)
        self._tally = m.tally

    def on_batch(self, rows: int, padded_tokens: int, real_tokens: int) -> None:
        tally = self._tally
        tally.observe(self.batch_size, rows)
        tally.observe(self.batch_tokens, padded_tokens)
        tally.observe(self.padding_ratio, padded_tokens / max(real_tokens, 1))

    def on_depth(self, waiting: int, live_rows: int | None = None) -> None:
        self._tally.set(self.queue_depth, waiting)
        if live_rows is not None:
            self._tally.set(self.live, live_rows)

    def on_encode(self, seconds: float, batch: int) -> None:
        self._tally.observe(self.encoder_time, seconds)

    def on_step(self, seconds: float, rows: int) -> None:
        tally = self._tally
        tally.observe(self.step_time, seconds)
        tally.observe(self.batch_size, rows)
        tally.inc(self.steps)

    def on_live_sequences(self, sequences: int) -> None:
        self.live_sequences.set(sequences)

    def on_prefix_cache(self, cache: Any) -> None:
        """A prefix cache's cumulative stats (`scheduling.prefix_cache`): the counters move
        by what changed since the last report."""
        st = cache.stats
        now = (st.hits, st.misses, st.evictions, st.hit_tokens)
        for child, new, old in zip((*self._cache.values(), self._cache_tokens), now,
                                   self._cache_seen, strict=True):
            if new > old:
                child.inc(new - old)
        self._cache_seen = now
        self._cache_bytes.set(cache.bytes)

    def on_sessions(self, live: int) -> None:
        self.live_sessions.set(live)

    def on_session_closed(self, lifetime_s: float, expired: bool) -> None:
        self.session_lifetime.observe(lifetime_s)
        if expired:
            self.expired_sessions.inc()

    def on_session_capacity(self, most: int) -> None:
        """The session table's size (`scheduling.sessions`)."""
        self.session_capacity.set(most)

    def on_session_refused(self, reason: str) -> None:
        """A chunk the session table refused: "full", "quota", "busy" or "unknown"."""
        self._session_refusals.labels(self._model, reason).inc()

    def on_wait_errors(self, errors: Sequence[float], model_errors: Sequence[float]) -> None:
        """A batch's admitted estimate errors, through the `Tally`: a batch of 16 rows is one
        or two bucket writes and one of the sum per histogram, not 16 observations."""
        tally = self._tally
        for values, child in zip((errors, model_errors), self._wait_errors, strict=True):
            for e in values:
                tally.observe(child, e)

    def on_finish(self, tokens: int, seconds: float) -> None:
        self._tally.inc(self.tokens, tokens)
        if tokens:
            self._tally.observe(self.per_token, seconds / tokens)
