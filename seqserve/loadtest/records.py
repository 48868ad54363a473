"""One row per scheduled request: when it was due, when it went out, how it ended."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

Outcome = Literal["pending", "ok", "shed", "http_error", "error", "dropped"]

CSV_FIELDS = (
    "step",
    "offered_rate",
    "index",
    "scheduled_s",
    "sent_s",
    "done_s",
    "latency_ms",
    "service_ms",
    "outcome",
    "status",
    "error",
    "server_queue_ms",
    "server_compute_ms",
    "tokens",
    "ttft_ms",
    "inter_token_mean_ms",
    "texts",
)


@dataclass(slots=True)
class RequestRecord:
    """Times are seconds since the run's start (monotonic clock)."""

    index: int
    """Position in the schedule."""
    scheduled_s: float
    """When the request was due (open loop: the Poisson arrival; closed loop: the send)."""
    texts: int = 1
    """Texts carried by the request."""
    sent_s: float | None = None
    """When the client started sending it (None: dropped before sending)."""
    done_s: float | None = None
    """When the answer (or the error) came back."""
    outcome: Outcome = "pending"
    """ok, shed (429/503), http_error (other non-2xx), error (no answer), dropped (never sent)."""
    status: int | None = None
    """HTTP status, if an answer came."""
    error: str | None = None
    """Exception class name for transport errors ("ConnectError", "ReadTimeout", ...)."""
    server_queue_ms: float | None = None
    """Server-Timing `queue` duration."""
    server_compute_ms: float | None = None
    """Server-Timing `compute` duration."""
    tokens: int = 0
    """Generated tokens counted in a translate or generate answer."""
    retry_after_s: float | None = None
    """Retry-After of a shed answer, seconds."""
    first_token_s: float | None = None
    """Streamed generate: when the first token event arrived."""
    token_gaps_s: list[float] = field(default_factory=list)
    """Streamed generate: seconds between consecutive tokens of each sequence."""

    @property
    def ttft_s(self) -> float | None:
        """Time to first token: first token event minus *scheduled* time (like latency)."""
        if self.first_token_s is None or self.sent_s is None:
            return None
        return self.first_token_s - self.scheduled_s

    @property
    def latency_s(self) -> float | None:
        """Completion minus *scheduled* time: includes any wait the client caused or suffered."""
        if self.done_s is None or self.sent_s is None:
            return None
        return self.done_s - self.scheduled_s

    @property
    def service_s(self) -> float | None:
        """Completion minus actual send time."""
        if self.done_s is None or self.sent_s is None:
            return None
        return self.done_s - self.sent_s

    @property
    def send_lag_s(self) -> float | None:
        """How late the client sent compared with the schedule (open loop)."""
        return None if self.sent_s is None else self.sent_s - self.scheduled_s

    def csv_row(self, step: int = 0, offered_rate: float | None = None) -> dict[str, Any]:
        """A results.csv row (milliseconds for durations, seconds for clock times)."""
        row = asdict(self)
        row.pop("retry_after_s")
        gaps = row.pop("token_gaps_s")
        lat, svc, ttft = self.latency_s, self.service_s, self.ttft_s
        row |= {
            "ttft_ms": "" if ttft is None else round(ttft * 1e3, 3),
            "inter_token_mean_ms": round(sum(gaps) / len(gaps) * 1e3, 3) if gaps else "",
            "step": step,
            "offered_rate": "" if offered_rate is None else offered_rate,
            "latency_ms": "" if lat is None else round(lat * 1e3, 3),
            "service_ms": "" if svc is None else round(svc * 1e3, 3),
        }
        for key in ("scheduled_s", "sent_s", "done_s", "first_token_s"):
            row[key] = "" if row[key] is None else round(row[key], 6)
        return {key: ("" if row[key] is None else row[key]) for key in CSV_FIELDS}
