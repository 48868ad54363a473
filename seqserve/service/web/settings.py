"""Server settings: `SEQSERVE_*` environment variables, with CLI flags on top.

Nothing is read at import time: `Settings()` reads the environment when called, and
`create_app(settings)` takes the object it is given (tests pass their own). Each field's
docstring is its description, which `seqserve serve --help` shows with the field's flag
(`seqserve.cli.serve` generates the flags from these fields).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, SecretStr, ValidationInfo, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from seqserve.service.core.process import ProcessSettings
from seqserve.service.core.state_token import load_secrets
from seqserve.service.engine.options import EngineOptions
from seqserve.service.runtimes.base import RuntimeSpec
from seqserve.service.scheduling.search import MAX_BEAM_SIZE

LIVE_HYPOTHESES_CPU = 256
"""`max_live_hypotheses` auto on a CPU (docs/performance.md section 44)."""
LIVE_HYPOTHESES_CUDA = 1024
"""`max_live_hypotheses` auto on CUDA."""


class Settings(BaseSettings):
    """Everything `seqserve serve` can be told; each field is also `SEQSERVE_<FIELD>`."""

    model_config = SettingsConfigDict(env_prefix="SEQSERVE_", extra="ignore", frozen=True,
                                      use_attribute_docstrings=True)

    repo: Path = Path("model_repository")
    """Model repository: `repo/NAME/VERSION/` bundles."""
    model_control: Literal["none", "poll", "explicit"] = "poll"
    """How models come and go while serving: poll, the repository is scanned every
    repository_poll_s and new models, new and removed versions and changed files are loaded
    or unloaded (each model's policy.json chooses its versions); explicit, only on request
    (POST /v2/repository/models/NAME/load or unload, /v1/admin/models, `seqserve models`)
    and the load_model models at start; none, what is there at start until a restart."""
    repository_poll_s: float = Field(default=5.0, gt=0)
    """poll: seconds between two scans of the repository."""
    load_model: Annotated[list[str], NoDecode] = Field(
        default_factory=list, json_schema_extra={"repeatable": True})
    """explicit: a model loaded at start (repeat the flag for several; comma-separated in
    the environment)."""
    host: str = "127.0.0.1"
    """Address to bind."""
    port: int = Field(default=8000, ge=0, le=65535)
    """Port to bind (0 picks a free one)."""
    front: Literal["native", "uvicorn"] = "native"
    """The HTTP front. native (the default): requests parsed, bodies read and answers
    written outside the interpreter (`service/server/_front`, built by native/build.sh, which
    the README's commands run; server/native.py), uvicorn's protocol where it is not built;
    uvicorn: uvicorn with httptools (our protocol, web/http_protocol.py). The choice and its
    reason are logged at start."""
    grpc: bool = True
    """Also serve the KServe v2 gRPC protocol as Triton does (inference.GRPCInferenceService,
    and grpc.health.v1 for probes) on grpc_port, in every API process, through the same
    lifecycle, keys, limits, metrics and drain as HTTP; --no-grpc: HTTP only."""
    grpc_port: int = Field(default=8001, ge=0, le=65535)
    """Port of the gRPC protocol (Triton's 8001), bound by every API process with
    SO_REUSEPORT (the kernel spreads connections over them); 0 picks a free one (per
    process)."""
    grpc_idle_timeout_s: float = Field(default=30.0, gt=0)
    """A gRPC connection with no RPC for this long is closed (GOAWAY, then closed; grpc's
    max_connection_idle), HTTP's keepalive_timeout_s for gRPC. Longer than HTTP's 5 s: a
    gRPC channel is one multiplexed connection a client keeps between calls (reopened by
    itself after a GOAWAY, at a TCP and HTTP/2 handshake's cost), so 30 s keeps a client
    that calls every few seconds on one connection while an idle flood holds each socket
    for 30 s at most (before: for ever)."""
    stream_idle_timeout_s: float = Field(default=30.0, gt=0)
    """A gRPC ModelStreamInfer stream with no request for this long while none of its
    requests is in flight is ended (UNAVAILABLE, saying so: open a new stream), as an idle
    connection is (`grpc_idle_timeout_s`): an open stream keeps its connection from being
    idle, so a client that opened one and went quiet held it until the connection's age
    (`grpc_max_connection_age_s`) ran out."""
    grpc_max_connection_age_s: float = Field(default=600.0, gt=0)
    """A gRPC connection is asked to close (GOAWAY) after this long, busy or not, and its
    RPCs in flight then get drain_timeout_s to finish (grpc's max_connection_age and its
    grace): the kernel spreads only new connections over the API processes (and a load
    balancer over replicas), so a channel held for hours would stay on one of them; 10
    minutes rebalances a long-lived client a few times an hour at one reconnect each."""
    runtime: Literal["onnx", "torchscript"] = "onnx"
    """Which graph format runs: ONNX Runtime or TorchScript (imports torch)."""
    device: Literal["cpu", "cuda"] = "cpu"
    """Device; with onnx it picks the default provider list."""
    providers: Annotated[list[str], NoDecode] = Field(default_factory=list)
    """Ordered ONNX Runtime providers (comma-separated in env); empty = from `device`."""
    api_workers: int | Literal["auto"] = "auto"
    """API processes (HTTP, validation, tokenization; the models too, but in the engine
    layout); 0 = one process does everything; auto = chosen for this machine's cores and the
    layout (printed at start)."""
    layout: Literal["auto", "engine", "replicated", "hybrid"] = "auto"
    """Where the models run. engine: the API processes share one engine process that batches
    every request; replicated: no engine, each API process runs its own copy of every model
    (the one-process server, api_workers times over one port: no hop between processes,
    batches per process; api_workers auto = one per core, one on CUDA; sessions refused
    with several processes); hybrid: replicated, except that the bundles that keep sessions
    run in one engine process (started only when there are such bundles and more than one
    API process; with one, it keeps them itself); auto: hybrid on a CPU, engine on CUDA, in
    one process, or when a copy of the repository per core would not fit in a quarter of
    the memory (chosen by measurement, printed at start)."""
    instances: int | Literal["auto"] = "auto"
    """Runtime instances per classifier/tagger in the engine: batches in flight at once, each
    with its own session and intra_op_threads threads; auto = chosen for this machine."""
    startup_timeout_s: float = Field(default=600.0, gt=0)
    """How long API processes wait for the engine to load and warm up every model."""
    engine_hang_timeout_s: float = Field(default=10.0, gt=0)
    """An engine process that answers nothing for this long is hung: each API process pings
    it every quarter of this (over its ZeroMQ socket) and, after this long without an answer,
    answers its requests, pending and new, with 503 + Retry-After at once (its models not
    ready) while the supervisor, pinging it the same way, kills it (SIGKILL) and starts a new
    one (seqserve_engine_restarts_total{reason="hang"}). 10 s: far beyond any loop turn of a
    working engine, so a busy one is never killed, and what a stalled request waits at most
    beyond its own queueing."""
    engine_restart_backoff_s: float = Field(default=1.0, gt=0)
    """A crash-looping engine process is restarted after a delay: its first death in 30 s at
    once, the next ones after this long, doubled each time (capped at 30 s), while its models
    answer 503 + Retry-After with the reason (/v2/repository/index) and every other model
    serves on; API processes keep the crash-loop rule that ends the server (their fifth death
    in 30 s)."""
    intra_op_threads: int = Field(default=0, ge=0)
    """Threads inside one operator, per runtime instance (0 = runtime default, or chosen
    with the instances when those are auto)."""
    inter_op_threads: int = Field(default=0, ge=0)
    """Threads across operators (0 = runtime default)."""
    max_batch_size: int = Field(default=16, ge=1)
    """Most rows in one batch (16: best seq/s of the canonical classifier on CPU here;
    docs/performance.md, section 11)."""
    max_batch_tokens: int = Field(default=4096, ge=1)
    """Padded-token budget of one batch: rows x longest row."""
    max_wait_ms: float = Field(default=2.0, ge=0)
    """Longest a batch waits for more rows after its first arrived, while another instance
    of the model is busy (with every instance idle a batch starts at once; 2: 0.5 and 5
    were no better; docs/performance.md, sections 11 and 14)."""
    batch_overhead_tokens: float = Field(default=64.0, ge=0)
    """Cost of starting a batch, in padded tokens: how much padding length grouping accepts
    to run fewer, larger batches (0 = only equal lengths share a batch)."""
    queue_size: int = Field(default=2048, ge=1)
    """Most texts waiting per model (sources for a translator, rows for a language model);
    beyond it requests get 429. A memory bound: the expected wait (`max_queue_wait_s`) is
    what should refuse. At 256 it refused first under 3x overload of 16-text requests (16
    such requests per API process), and only after parsing and tokenizing them, where the
    wait refuses before the body is parsed: goodput 0.48 vs 0.7 of capacity
    (docs/performance.md section 20)."""
    request_timeout_s: float = Field(default=30.0, gt=0)
    """Per-request deadline; passed -> 504. A request may ask for a shorter one with the
    `X-Request-Timeout` header (seconds) or the OIP `timeout` parameter (microseconds)."""
    max_queue_wait_s: float = Field(default=0.5, gt=0)
    """Admission by expected wait: a request whose expected wait in its model's queue (the
    batches the queue needs at the recently measured fixed cost per batch, plus its tokens at
    the measured cost per token) exceeds this, or its own deadline, gets 429 at once, before
    it is tokenized, with Retry-After from the backlog."""
    drain_timeout_s: float = Field(default=20.0, ge=0)
    """On SIGTERM, how long admitted work may take before the process exits."""
    shutdown_delay_s: float = Field(default=5.0, ge=0)
    """On SIGTERM, first say not ready but keep serving new work as usual for this long
    (answers carry Connection: close) while load balancers take the instance out, then stop
    listening and drain. 5 s: Kubernetes endpoint removal (deploy/ sets no preStop sleep:
    this is it)."""
    max_in_flight: int = Field(default=1024, ge=1)
    """Inference requests one API process works on at once; beyond it new ones get 429 at
    once. A safety valve against a backlog inside a saturated API process (which the engine's
    admission cannot see), not a latency control: measured here, a 429 costs the API process
    more than half of what a served request costs, so a low bound under clients that retry
    at once spends the CPU on refusals (docs/performance.md, "Overload")."""
    header_timeout_s: float = Field(default=10.0, gt=0)
    """A connection must send complete request headers this soon after opening (or after
    its request's first byte), else 408 and closed (slowloris, idle sockets)."""
    max_headers: int = Field(default=100, ge=1)
    """Most header fields in one request (trailers included); more: 431 and the connection
    closed, before any route or API key check."""
    max_header_bytes: int = Field(default=65_536, ge=1)
    """Largest request head in bytes (request line and header fields, as they arrive: an
    unterminated header is cut off at this size), also the bound of a chunked body's
    framing and trailers; more: 431 and the connection closed."""
    max_url_bytes: int = Field(default=8192, ge=1)
    """Longest request target (path and query) in bytes; longer: 414 and the connection
    closed."""
    body_timeout_s: float = Field(default=10.0, gt=0)
    """A request body must arrive within this time of its headers, else 408 and closed
    (a Content-Length longer than the body sent, a stalled upload)."""
    keepalive_timeout_s: float = Field(default=5.0, gt=0)
    """An idle keep-alive connection is closed after this long."""
    retry_after_s: int = Field(default=1, ge=0)
    """Value of Retry-After on 429 and 503."""
    refusal_pace_s: float = Field(default=0.25, ge=0)
    """A 429 due less than this long after its connection's last 429 is written this long
    after that one: a client that resends at once, ignoring Retry-After, costs one refusal
    per connection per this long instead of one per round trip (a closed loop of 128 such
    clients refused ~14,000 requests a second and kept a fifth of the capacity:
    docs/performance.md section 29). A request the server takes is never delayed. 0: every
    429 is written at once."""
    max_texts: int = Field(default=64, ge=1)
    """Most texts in one request."""
    max_sessions: int = Field(default=1024, ge=1)
    """Feature-sequence models with state: most live sessions per model version (docs:
    "Stateful sessions"); a new one beyond it gets 429 + Retry-After, a live one is never
    evicted. The engine holds one float32 state row per session: at most max_sessions x
    state_dim x 4 bytes per model (1024 x 256 x 4 = 1 MiB)."""
    max_sessions_per_key: int = Field(default=0, ge=0)
    """Most live sessions one API key may hold per model version (without keys: one client
    address; behind a proxy every client shares its address, so set it there only with
    keys); a new one beyond it gets 429 naming the quota, so one client cannot take every
    slot of max_sessions. 0 = no quota (max_sessions bounds everyone together)."""
    session_idle_timeout_s: float = Field(default=300.0, gt=0)
    """A session that received no chunk for this long expires (its state is freed); its next
    chunk gets 404 and the client restarts it with its history."""
    max_chars: int = Field(default=4000, ge=1)
    """Most characters in one text."""
    max_tokens: int = Field(default=256, ge=1)
    """Most tokens in one text (also capped by the bundle's own limit)."""
    truncate: bool = False
    """Over `max_tokens`: truncate (and say so in the answer) instead of rejecting."""
    max_unknown_fraction: float | None = Field(default=None, ge=0, le=1)
    """Refuse (422) a classify, tag or translate text whose share of tokens unknown to the
    model's tokenizer is above this (0.5: half of it unreadable); unset: never refuse (each
    answer still says its `unknown_fraction`)."""
    max_body_bytes: int = Field(default=1_048_576, ge=1)
    """Largest request body, as sent and, for a gzip or deflate body, decompressed; bigger is
    refused (413), before it is read where its Content-Length says so."""
    max_new_tokens: int = Field(default=512, ge=1)
    """Language models: most tokens one generated sequence may ask for (`max_new_tokens`,
    OpenAI's `max_tokens`); more is a 400."""
    max_live_hypotheses: int | Literal["auto"] = "auto"
    """Translators: most live beam hypotheses decoded per step (language models: live
    sequences); beyond it requests wait. auto: 256 on a CPU, where a decoder step's cost a
    row rises by a fifth past ~200 rows as the rows' memory leaves the cache, and 3x
    overloaded translations were served faster and sooner with 256 than 1,024
    (docs/performance.md section 44); on CUDA the former default, 1,024 (a device wants wide
    steps; not measured against 256)."""
    decode_admit_steps: int = Field(default=4, ge=0)
    """Translators: while others decode, sources that arrive wait up to this many decoder
    steps (until max_batch_size of them wait) to be encoded together, where at least one
    arrives a step on average (sparser, they are encoded at once); 0 = at the next step.
    An encoder call between decoder steps finds its weights out of the cache and costs twice
    as much a source in batches of 4 as alone; 2: the encoder's CPU a served translation
    0.11 ms against 0.15 (docs/performance.md, section 42); 4: 2-3% more translations a
    second than 2 once hopeless hypotheses are dropped (section 43)."""
    decode_groups: int | Literal["auto"] = "auto"
    """Translators: live requests split into this many groups (1 to 8) whose decoder steps
    take turns, so one group's beam bookkeeping overlaps the other's step (1 = one call per
    step); auto = 2 in the engine layout, 1 where each API process runs its own translator
    (hybrid, replicated: measured, docs/performance.md section 15)."""
    runtime_calls: Literal["auto", "loop", "steps", "threads"] = "auto"
    """Where a process runs its runtime calls (a batch, an encoder batch, a decoder step).
    threads: on a thread per model instance and decode lane, so the event loop goes on while
    they compute; loop: on the event loop's own thread while they are measured short (10 ms),
    without a thread hand-off per call (the native front keeps reading requests meanwhile);
    steps: the translators' and language models' calls on the loop, the batchers' on
    threads; auto = steps where each API process has its own models with one instance on a
    CPU and the native front is built, threads elsewhere (measured: docs/performance.md
    section 33)."""
    readiness: Literal["default", "all", "any"] = "default"
    """When /v2/health/ready says ready. default: every model's default version is loaded
    (the version unpinned requests go to: its policy.json default while ready, else its
    highest ready version), so every model answers; a failed version beside it is reported
    (/v2/repository/index and /v1/models with its reason, seqserve_model_ready and
    seqserve_model_load_failures_total, the log) but does not keep the instance out of the
    load balancer; all: every version loaded (strict, Triton's default: one failed bundle
    keeps the instance unready); any: at least one version of any model."""
    warmup: bool = True
    """Run each model over its length buckets before reporting ready."""
    log_level: str = "info"
    """Log level of the server."""
    log_format: Literal["text", "json"] = "text"
    """Log lines as plain text or as one JSON object per line (access log included)."""
    access_log: bool = True
    """One line per request: method, route, model, status, queue/compute/total ms and the
    request id (the client's request id header, or a new id; sent back in the response)."""
    api_key: SecretStr | None = None
    """API key required as `Authorization: Bearer KEY` on inference and model routes (several:
    one per line); `@PATH` reads them from a file, one per line; unset = no keys. Never logged.
    A key given here is visible to `ps` and in this process's environment: prefer
    api_key_file."""
    trusted_keys: Path | None = None
    """A folder of ed25519 public keys (`*.pub`, PEM): serve only bundles signed by one of
    them (`seqserve sign`); an unsigned or mis-signed version fails with the reason. Unset:
    bundles are checked by their hashes only (which say what a bundle holds, not who made
    it)."""
    api_key_file: Path | None = None
    """A file of API keys, one per line (`#` comments; blank lines skipped): the same as
    api_key but read from disk, so the key is in no command line nor environment."""
    state_secret_file: Path | None = None
    """A file of state-token secrets, one per line (the first signs, all verify: rotation):
    with it, language-model and series answers can return their recurrent state as a signed
    token (`return_state`) that any replica with the same bundle and file continues (`state`);
    unset = state tokens are refused (400). Read from disk in each process, never passed in an
    environment or command line."""
    prefix_cache_bytes: int = Field(default=32 * 1024 * 1024, ge=0)
    """Bytes of language-model states after prompt prefixes each API process keeps per model
    version (a prompt that extends a cached prefix runs only its remainder); 0 = off."""
    auth_health: bool = False
    """With api_key: also require a key on the health routes (probes then need it too)."""
    auth_metrics: bool = False
    """With api_key: also require a key on /metrics (the scraper then needs it too)."""
    cors_origins: Annotated[list[str], NoDecode] = Field(default_factory=list)
    """Origins that browser pages may call this server from (CORS): comma-separated
    (`https://app.example.com,http://localhost:3000`) or `*` for any; empty = off (no CORS
    headers; browsers refuse cross-origin calls). Preflights are answered without an API key;
    Authorization and Content-Type may be sent."""
    cors_headers: Annotated[list[str], NoDecode] = Field(default_factory=list)
    """With cors_origins: more request headers pages may send (comma-separated; `x-app-*`
    allows every header that starts so), besides those the routes read, W3C trace context and
    the OpenAI JavaScript SDK's `x-stainless-*`."""
    cors_expose_headers: Annotated[list[str], NoDecode] = Field(default_factory=list)
    """With cors_origins: more answer headers a page's script may read (comma-separated),
    besides the request id, Server-Timing, Retry-After, WWW-Authenticate and traceparent."""
    otel_endpoint: str | None = None
    """Export each request's OpenTelemetry span (with its queue and compute) over OTLP/HTTP
    to this traces endpoint (e.g. `http://collector:4318/v1/traces`; the `otel` extra);
    unset: no spans (the `traceparent` answers and the access log's trace ids stay)."""
    otel_service_name: str = "seqserve"
    """The `service.name` of the exported spans."""
    switch_interval_ms: float = Field(default=0.5, gt=0)
    """Python's GIL switch interval of every `seqserve serve` process, API and engine (Python's
    default 5 ms makes the batch thread wait behind the busy event loop after every runtime
    call; 0.5 ms measured ~15% faster)."""

    @field_validator("providers", "load_model", "cors_origins", "cors_headers",
                     "cors_expose_headers", mode="before")
    @classmethod
    def _split_providers(cls, v: object) -> object:
        if isinstance(v, str):
            return [p.strip() for p in v.split(",") if p.strip()]
        if isinstance(v, list | tuple):  # a repeated flag: each may hold several
            return [p.strip() for item in v for p in str(item).split(",") if p.strip()]
        return v

    @field_validator("cors_origins")
    @classmethod
    def _origins(cls, v: list[str]) -> list[str]:
        origins = [o.rstrip("/") if o != "*" else o for o in v]
        for origin in origins:
            if origin != "*" and not re.fullmatch(r"[A-Za-z][A-Za-z0-9+.-]*://[^/\s?#]+", origin):
                raise ValueError(f"{origin!r} is not an origin: give scheme://host[:port] "
                                 "(no path), or '*' for any")
        return origins

    @field_validator("cors_headers", "cors_expose_headers")
    @classmethod
    def _header_names(cls, v: list[str]) -> list[str]:
        for name in v:
            if not re.fullmatch(r"[A-Za-z0-9!#$%&'+.^_`|~-]+\*?", name):
                raise ValueError(f"{name!r} is not a header name (letters, digits and "
                                 "!#$%&'+.^_`|~-; a trailing * for every header it starts)")
        return [name.lower() for name in v]

    @field_validator("max_live_hypotheses")
    @classmethod
    def _auto_or_beam(cls, v: int | str) -> int | str:
        if isinstance(v, int) and v < MAX_BEAM_SIZE:
            raise ValueError(f"must be 'auto' or an integer >= {MAX_BEAM_SIZE} (the largest "
                             "beam)")
        return v

    @property
    def live_hypotheses(self) -> int:
        """`max_live_hypotheses` as a count (auto: by the device)."""
        v = self.max_live_hypotheses
        if v != "auto":
            return int(v)
        return LIVE_HYPOTHESES_CUDA if self.device == "cuda" else LIVE_HYPOTHESES_CPU

    @field_validator("api_workers", "instances", "decode_groups")
    @classmethod
    def _auto_or_count(cls, v: int | str, info: ValidationInfo) -> int | str:
        low = 0 if info.field_name == "api_workers" else 1
        if isinstance(v, int) and v < low:
            raise ValueError(f"must be 'auto' or an integer >= {low}")
        if info.field_name == "decode_groups" and isinstance(v, int) and v > 8:
            raise ValueError("must be 'auto' or an integer from 1 to 8")
        return v

    @property
    def keys_on(self) -> bool:
        """Whether API keys are required (api_key or api_key_file is set)."""
        return self.api_key is not None or self.api_key_file is not None

    @model_validator(mode="after")
    def _check(self) -> Settings:
        if self.state_secret_file is not None:
            load_secrets(self.state_secret_file)  # a ValueError naming the file and the fault
        if self.api_key is not None and self.api_key_file is not None:
            raise ValueError("give api_key or api_key_file, not both")
        if self.max_batch_tokens < self.max_tokens:
            raise ValueError(
                f"max_batch_tokens ({self.max_batch_tokens}) must be >= max_tokens "
                f"({self.max_tokens}): a single longest text must fit one batch"
            )
        if self.grpc and self.grpc_port == self.port != 0:
            raise ValueError(f"grpc_port and port are both {self.port}: give gRPC a port of "
                             "its own (or --no-grpc)")
        if self.max_url_bytes > self.max_header_bytes:
            raise ValueError(
                f"max_url_bytes ({self.max_url_bytes}) must be <= max_header_bytes "
                f"({self.max_header_bytes}): the request line is part of the request head"
            )
        if self.queue_size < self.max_texts:
            raise ValueError(
                f"queue_size ({self.queue_size}) must be >= max_texts ({self.max_texts}): "
                "a request of max_texts texts must fit the queue"
            )
        return self

    def sessions_in_engine(self) -> bool:
        """Whether a bundle that keeps sessions runs in the engine process, not in an API
        process: in the engine layout, and in the hybrid one with several API processes
        (with one, that process holds them; in the one-process server, that process; in the
        replicated layout every process has its own copy, sessions refused with several)."""
        if self.api_workers == 0:
            return False
        several = isinstance(self.api_workers, int) and self.api_workers > 1
        return self.layout == "engine" or (self.layout == "hybrid" and several)

    def engine_options(self, engine_process: bool = False) -> EngineOptions:
        """What the engine (a process of its own, or this one) loads and schedules with: these
        settings' values, nothing else (`EngineOptions` has no defaults of its own). The
        layout's counts must be resolved first (`server.composition.resolved`: "auto" is a
        ValueError here, not a default that holds for one layout only). The engine process
        (`engine_process`) runs its runtime calls on threads: its loop serves every API
        process, and its session models hold a chunk's compute while others arrive."""
        instances, groups, calls = self.instances, self.decode_groups, self.runtime_calls
        if instances == "auto" or groups == "auto" or calls == "auto":
            raise ValueError("instances, decode_groups or runtime_calls is 'auto': resolve "
                             "them for the layout first "
                             "(seqserve.service.server.composition.resolved)")
        return EngineOptions(
            repo=str(self.repo), bundles="sessions" if self.layout == "hybrid" else "all",
            runtime=self.runtime_spec(), instances=instances,
            max_batch_size=self.max_batch_size, max_batch_tokens=self.max_batch_tokens,
            max_wait_s=self.max_wait_ms / 1000.0,
            batch_overhead_tokens=self.batch_overhead_tokens, queue_size=self.queue_size,
            retry_after_s=float(self.retry_after_s), max_tokens=self.max_tokens,
            max_live_hypotheses=self.live_hypotheses,
            decode_admit_steps=self.decode_admit_steps, decode_groups=groups,
            runtime_calls="threads" if engine_process else calls,
            max_queue_wait_s=self.max_queue_wait_s, warmup=self.warmup,
            drain_timeout_s=self.drain_timeout_s, max_sessions=self.max_sessions,
            max_sessions_per_key=self.max_sessions_per_key,
            session_idle_timeout_s=self.session_idle_timeout_s,
            process=self.process_settings(),
            model_control=self.model_control, load_models=tuple(self.load_model),
            trusted_keys=None if self.trusted_keys is None else str(self.trusted_keys),
            prefix_cache_bytes=self.prefix_cache_bytes)

    def runtime_spec(self) -> RuntimeSpec:
        """The runtime every bundle is loaded with."""
        return RuntimeSpec(kind=self.runtime, device=self.device, providers=tuple(self.providers),
                           intra_op_threads=self.intra_op_threads,
                           inter_op_threads=self.inter_op_threads)

    def process_settings(self) -> ProcessSettings:
        """What every server process applies at start (the engine process gets the same)."""
        return ProcessSettings(log_level=self.log_level, log_format=self.log_format,
                               switch_interval_ms=self.switch_interval_ms)

    def effective(self) -> dict[str, Any]:
        """Every setting as plain JSON values, the API key only as whether one is set."""
        data = self.model_dump(mode="json", exclude={"api_key"})
        data["api_key"] = "set" if self.api_key is not None else None
        return data
