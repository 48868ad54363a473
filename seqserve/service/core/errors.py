"""Domain errors of the server, each with its HTTP status.
(A body over `max_body_bytes` is refused by the middleware before any route runs.)

Route handlers and workers raise these and hold no try/except: the app's exception handler and
the hot path turn every `ServiceError` into the one error answer
(`seqserve.service.core.answers.service_error_answer`): its status, `{"error": message, ...}`
and `Retry-After` where set.
"""

from __future__ import annotations


class ServiceError(Exception):
    """Base of every error the server answers on purpose."""

    status: int = 400
    """HTTP status code of the answer."""
    retry_after: float | None = None
    """Seconds for a `Retry-After` header (overload and shutdown only)."""

    def __init__(self, message: str, *, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.message = message
        if retry_after is not None:
            self.retry_after = retry_after


class BadRequest(ServiceError):
    """Input the server will not process: wrong shape, empty, over a limit."""

    status = 400


class ModelNotFound(ServiceError):
    """No model (or no such version of it) in the repository."""

    status = 404


class ModelNotReady(ServiceError):
    """The model exists but failed to load or is still loading."""

    status = 503


class QueueFull(ServiceError):
    """The model's bounded queue cannot take the request now."""

    status = 429


class ShuttingDown(ServiceError):
    """The server is draining; new work is refused."""

    status = 503


class EngineUnavailable(ServiceError):
    """The engine process is gone (or never answered): nothing can be computed here now."""

    status = 503
    retry_after = 1.0


class DeadlineExceeded(ServiceError):
    """The request's deadline passed before its result was ready."""

    status = 504


class ClientGone(ServiceError):
    """The client disconnected; the work was dropped (nobody reads this answer)."""

    status = 499


class InferenceFailed(ServiceError):
    """The runtime raised while computing this request's batch (a server fault, not input)."""

    status = 500



class SessionNotFound(ServiceError):
    """A session chunk without `start` for a session the model does not hold: never started,
    ended, expired after its idle timeout, or lost with a restart of the engine."""

    status = 404


class SessionBusy(ServiceError):
    """A second chunk of a session while its previous chunk is in flight."""

    status = 409


class TooManySessions(ServiceError):
    """A new session beyond the model's `max_sessions` (live sessions are never evicted)."""

    status = 429
