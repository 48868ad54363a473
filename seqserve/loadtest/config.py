"""What one load-test run does: target, task, arrival process and limits."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal
from urllib.parse import urlsplit

from seqserve.models.errors import UserError

Task = Literal["classify", "translate", "generate", "predict"]
TASKS: tuple[str, ...] = ("classify", "translate", "generate", "predict")
HTTP_CLIENTS: tuple[str, ...] = ("raw", "httpx")


@dataclass(frozen=True)
class LoadConfig:
    """One load-test run against `POST {url}/v1/models/{model}/{task}`."""

    url: str
    """Base URL of the server, e.g. http://127.0.0.1:8000."""
    model: str
    """Model name in the server's repository."""
    # Endpoint: "classify", "translate", "generate" (a language model) or "predict" (a feature-
    # sequence model: random series of `series_steps` steps of `features` values).
    task: Task = "classify"
    # Open loop: mean arrival rate in requests/s (Poisson). Exclusive with `concurrency`.
    rate: float | None = None
    # Closed loop: number of clients that each send, wait for the answer, send again.
    concurrency: int | None = None
    # Stop scheduling new requests after this many seconds (None: only `requests` counts).
    duration_s: float | None = 10.0
    # Stop after this many requests were scheduled (None: only `duration_s` counts).
    requests: int | None = None
    # Open loop: at most this many outstanding requests; arrivals beyond are dropped.
    max_in_flight: int = 512
    timeout_s: float = 60.0  # Per-request timeout, from the actual send.
    beam_size: int = 5  # Beam size sent with translate requests.
    texts_per_request: int = 1  # Texts in the `texts` list of each request.
    seed: int = 0  # Seed for arrival times and text choice (same seed, same schedule and texts).
    # Closed loop: longest Retry-After pause honoured after a 429/503.
    max_retry_after_s: float = 5.0
    # "raw" (lean asyncio HTTP/1.1 client, default) or "httpx" (for comparison).
    http_client: str = "raw"
    # Generate: ask for server-sent events and time every token (time to first token, inter-token
    # latency); False: one JSON answer per request (its tokens still counted).
    stream: bool = False
    max_new_tokens: int = 32  # Generate: `max_new_tokens` of each request.
    temperature: float = 1.0  # Generate: sampling temperature (0 = greedy).
    features: int = 1  # Predict: values per step (the model's `features`).
    series_steps: int = 16  # Predict: steps of each series (with sessions: of each whole series).
    # Predict, closed loop: each client streams its series in this many chunks through a session
    # (`start` on the first, `end` on the last), then starts a new one.
    session_chunks: int | None = None

    def __post_init__(self) -> None:
        parts = urlsplit(self.url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise UserError(f"server URL must look like http://host:port, got {self.url!r}")
        if self.task not in TASKS:
            raise UserError(f"task must be one of {TASKS}, got {self.task!r}")
        if (self.rate is None) == (self.concurrency is None):
            raise UserError("give exactly one of rate (open loop) or concurrency (closed loop)")
        if self.rate is not None and self.rate <= 0:
            raise UserError(f"rate must be > 0 requests/s, got {self.rate}")
        if self.concurrency is not None and self.concurrency < 1:
            raise UserError(f"concurrency must be >= 1, got {self.concurrency}")
        if self.duration_s is None and self.requests is None:
            raise UserError("give a duration or a request count (or both) to bound the run")
        if self.duration_s is not None and self.duration_s <= 0:
            raise UserError(f"duration must be > 0 s, got {self.duration_s}")
        if self.requests is not None and self.requests < 1:
            raise UserError(f"requests must be >= 1, got {self.requests}")
        if self.max_in_flight < 1:
            raise UserError(f"max_in_flight must be >= 1, got {self.max_in_flight}")
        if self.texts_per_request < 1:
            raise UserError(f"texts_per_request must be >= 1, got {self.texts_per_request}")
        if self.http_client not in HTTP_CLIENTS:
            raise UserError(f"http_client must be one of {HTTP_CLIENTS}, got {self.http_client!r}")
        if self.beam_size < 1:
            raise UserError(f"beam_size must be >= 1, got {self.beam_size}")
        if self.stream and self.task != "generate":
            raise UserError("stream applies to the generate task only")
        if self.max_new_tokens < 1:
            raise UserError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.task == "predict" and (self.features < 1 or self.series_steps < 1):
            raise UserError("predict needs features >= 1 and series_steps >= 1")
        if self.session_chunks is not None:
            if self.task != "predict" or self.concurrency is None:
                raise UserError("session chunks apply to the predict task in a closed loop "
                                "(--concurrency: each client streams its own session)")
            if not 1 <= self.session_chunks <= self.series_steps:
                raise UserError(f"session_chunks must be 1 to series_steps "
                                f"({self.series_steps}), got {self.session_chunks}")
        if not 0 <= self.temperature <= 100:
            raise UserError(f"temperature must be in [0, 100], got {self.temperature}")

    @property
    def mode(self) -> Literal["open", "closed"]:
        """ "open" (rate-driven arrivals) or "closed" (fixed concurrency)."""
        return "open" if self.rate is not None else "closed"

    @property
    def path(self) -> str:
        """Path of the endpoint under test."""
        return f"/v1/models/{self.model}/{self.task}"

    @property
    def endpoint(self) -> str:
        """Full URL of the endpoint under test."""
        return f"{self.url.rstrip('/')}{self.path}"

    def with_rate(self, rate: float) -> LoadConfig:
        """The same run at another open-loop rate (used by sweeps)."""
        return replace(self, rate=rate, concurrency=None)
