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
    """Seconds for a `Retry-After` header (overload, shutdown, a version not ready; a 503
    that sets none gets the server's `retry_after_s` where it is answered)."""
    param: str | None = None
    """The request field at fault, where one is (OpenAI's error shape names it)."""

    def __init_subclass__(cls, status: int | None = None, retry_after: float | None = None,
                          **kwargs: object) -> None:
        """`class NotFound(ServiceError, status=404)`: each error's status (and default
        Retry-After) in its class line."""
        super().__init_subclass__(**kwargs)
        if status is not None:
            cls.status = status
        if retry_after is not None:
            cls.retry_after = retry_after

    def __init__(self, message: str, *, retry_after: float | None = None,
                 param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        if retry_after is not None:
            self.retry_after = retry_after
        self.param = param


class BadRequest(ServiceError, status=400):
    """Input the server will not process: wrong shape, empty, over a limit."""


class TextUnreadable(ServiceError, status=422):
    """A text whose tokens are mostly unknown to the model's tokenizer (over the server's
    `max_unknown_fraction`): the model would answer something confident about nothing."""


class TextNotTokenizable(ServiceError, status=422):
    """A text the model's tokenizer failed on (e.g. a backtracking regex in a tokenizer.json
    over its limit): well-formed, but this model cannot read it."""


class ModelNotFound(ServiceError, status=404):
    """No model (or no such version of it) in the repository."""


class ModelNotReady(ServiceError, status=503):
    """The model exists but failed to load or is still loading."""


class QueueFull(ServiceError, status=429):
    """The model's bounded queue cannot take the request now."""


class ShuttingDown(ServiceError, status=503):
    """The server is draining; new work is refused."""


class EngineUnavailable(ServiceError, status=503, retry_after=1.0):
    """The engine process is gone (or never answered): nothing can be computed here now."""


class DeadlineExceeded(ServiceError, status=504):
    """The request's deadline passed before its result was ready."""


class ClientGone(ServiceError, status=499):
    """The client disconnected; the work was dropped (nobody reads this answer)."""


class InferenceFailed(ServiceError, status=500):
    """The runtime raised while computing this request's batch (a server fault, not input)."""


class SessionNotFound(ServiceError, status=404):
    """A session chunk without `start` for a session the model does not hold: never started,
    ended, expired after its idle timeout, or lost with a restart of the engine."""


class SessionBusy(ServiceError, status=409):
    """A second chunk of a session while its previous chunk is in flight."""


class TooManySessions(ServiceError, status=429):
    """A new session beyond the model's `max_sessions` (live sessions are never evicted)."""


class StateMismatch(ServiceError, status=409):
    """A state token of another bundle (name, version or content) than the one asked."""
