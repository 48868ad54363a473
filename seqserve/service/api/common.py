"""What every route shares: the app state, the per-request `RequestContext`, the error schema,
the texts field and the one formatter of validation errors."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Annotated, Any

from fastapi import Request
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    Strict,
    StrictStr,
    WithJsonSchema,
)
from starlette.types import Receive, Scope

from seqserve.service.core.errors import BadRequest, QueueFull
from seqserve.service.web.http_protocol import DISCONNECT
from seqserve.service.web.state import AppState
from seqserve.service.workers.base import RequestContext, text_pattern

HARD_MAX_TEXTS = 4096
"""Schema ceiling of texts per request (settings.max_texts is the live limit)."""


class ErrorResponse(BaseModel):
    """Every error answer (`seqserve.service.core.answers.error_answer`)."""

    error: str = Field(description="What was wrong, in one line.")
    request_id: str | None = Field(None, description="This request's X-Request-Id (every "
                                   "answer to a request that got past its headers).")


ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorResponse} for code in (400, 404, 413, 422, 429, 500, 503, 504)
}
"""The error answers every POST route documents."""


def _whole(value: object) -> object:
    """A number without a fractional part is an integer (JSON Schema's rule): 5.0 -> 5."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


WholeInt = Annotated[int, BeforeValidator(_whole), Strict()]
"""An integer field: JSON integers and whole numbers (5, 5.0, 5e0); never a string, a bool or
5.5. The OpenAPI `integer` type means exactly this, so the document and the server agree."""

_BOUNDS = {"ge": "minimum", "le": "maximum", "gt": "exclusiveMinimum", "lt": "exclusiveMaximum"}


def standard_bounds(schema: dict[str, Any]) -> None:
    """pydantic writes the bounds of a union field (`int | None`, `float | int`) as `ge`/`le`/
    `gt`/`lt`, which JSON Schema ignores; rename them to `minimum`/`maximum`/`exclusive...`
    (a model's `json_schema_extra`)."""
    for prop in schema.get("properties", {}).values():
        for node in [prop, *prop.get("anyOf", [])]:
            for short, name in _BOUNDS.items():
                if short in node:
                    node[name] = node.pop(short)


TEXT_RULES = ("Each text: 1 to max_chars characters, at least one of them kept by the model's "
              "tokenizer (a text of only whitespace or control characters, or only punctuation "
              "for a tokenizer that drops it, has no tokens), no NUL, valid Unicode (no "
              "lone surrogates). A text over the model's token limit is a 400, or is cut to "
              "it when the server truncates (the answer then says `truncated`).")
Text = Annotated[StrictStr, WithJsonSchema({"type": "string", "minLength": 1,
                                            "pattern": text_pattern()})]
"""One input text. Its rules are checked once, for every protocol, by
`seqserve.service.workers.base.encode_texts`; the schema declares them (maxLength: see
openapi.py)."""


class TextsRequest(BaseModel):
    """Base of the v1 request bodies: a non-empty list of texts, no unknown fields."""

    model_config = ConfigDict(extra="forbid")

    texts: list[Text] = Field(min_length=1, max_length=HARD_MAX_TEXTS,
                              description=f"Texts, 1 to max_texts of them. {TEXT_RULES}")


def describe_errors(errors: Sequence[Any] | object, flags: bool = False) -> str:
    """One line per pydantic error, `loc: message` (`body.texts.0: Input should be a valid
    string`); with `flags`, the location is written as a CLI flag (`--n-best: ...`)."""
    parts = []
    for e in errors if isinstance(errors, list | tuple) else []:
        if e.get("type") == "json_invalid":
            parts.append(f"malformed JSON: {e.get('ctx', {}).get('error', e.get('msg'))}")
            continue
        loc = [str(x) for x in e.get("loc", ())]
        message = str(e.get("msg")).removeprefix("Value error, ")
        if flags:
            where = "--" + "-".join(loc).replace("_", "-") if loc else ""
            message = message.replace("_", "-")
        else:
            where = ".".join(loc)
        parts.append(f"{where}: {message}" if where else message)
    return "; ".join(parts) or "invalid request"


def app_state(request: Request) -> AppState:
    state: AppState = request.app.state.seqserve
    return state


async def _watch_disconnect(receive: Receive, call: RequestContext) -> None:
    """Set `call.disconnected` when the server reports the client gone (the body was read);
    ends only then (it is the context's `gone`): a receive that fails says nothing about the
    client, so the watcher then waits until it is cancelled."""
    try:
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                call.disconnected.set()
                return
    except Exception:
        await asyncio.get_running_loop().create_future()


def _quiet(task: asyncio.Future[Any]) -> None:
    """Retrieve a finished watcher's exception (a receive that failed: nothing to report)."""
    if not task.cancelled():
        task.exception()


TIMEOUT_HEADER = b"x-request-timeout"


def header(scope: Scope, name: bytes) -> str | None:
    """The value of the request header `name` (lower case), or None."""
    for key, value in scope["headers"]:
        if key == name:
            return bytes(value).decode("latin-1")
    return None


def request_timeout(state: AppState, scope: Scope, asked_s: float | None = None) -> float:
    """Seconds this request may take: `request_timeout_s`, or less when the client asks
    (the X-Request-Timeout header in seconds, or `asked_s` from the OIP `timeout`)."""
    limit = state.settings.request_timeout_s
    given = header(scope, TIMEOUT_HEADER)
    if given is not None:
        try:
            seconds = float(given)
        except ValueError:
            seconds = -1.0
        if not 0 < seconds < float("inf"):
            raise BadRequest("X-Request-Timeout must be a positive number of seconds")
        limit = min(limit, seconds)
    return limit if asked_s is None else min(limit, asked_s)


def shed_early(state: AppState, model: Any, timeout_s: float) -> None:
    """429 before any work when the model's queue is already longer than this request may
    wait (the engine's last report, or the in-process batcher's own estimate): the cheap
    refusal; the model's own admission decides for the rest, with the request's size."""
    wait = model.expected_wait()
    budget = min(timeout_s, state.settings.max_queue_wait_s)
    if wait is not None and wait > budget:
        raise QueueFull(f"overloaded: expected queue wait {wait:.3f} s > {budget:.3f} s "
                        "allowed", retry_after=max(state.settings.retry_after_s, wait))


def request_call(state: AppState, scope: Scope, receive: Receive,
                 timeout_s: float | None = None) -> RequestCall:
    """A RequestContext with the request deadline, recorded in the ASGI scope (Server-Timing and the
    request metrics read it) and counted in flight; watches for the client leaving: the
    context's `gone` is the scope's disconnect future under our uvicorn protocol
    (`seqserve.service.web.http_protocol.DISCONNECT`), else a watcher task that waits for
    `http.disconnect`; `RequestContext.wait` waits on it directly. Use: `async with
    request_call(...) as call`."""
    return RequestCall(state, scope, receive, timeout_s)


class RequestCall:
    """`request_call`'s context manager (a class: a generator-based one cost twice as much)."""

    __slots__ = ("state", "scope", "receive", "timeout_s", "call", "gauge", "gone", "watcher")

    def __init__(self, state: AppState, scope: Scope, receive: Receive,
                 timeout_s: float | None) -> None:
        self.state, self.scope, self.receive, self.timeout_s = state, scope, receive, timeout_s
        self.gauge: Any = None
        self.gone: asyncio.Future[Any] | None = None
        self.watcher: asyncio.Future[Any] | None = None

    async def __aenter__(self) -> RequestContext:
        state, scope = self.state, self.scope
        seconds = request_timeout(state, scope) if self.timeout_s is None else self.timeout_s
        call = self.call = RequestContext(deadline=time.monotonic() + seconds)
        scope.setdefault("state", {})["call"] = call
        name = scope.get("path_params", {}).get("name", "")
        gauge = self.gauge = state.metrics.child(state.metrics.in_flight, name) \
            if name in state.repository.entries else None
        if gauge is not None:
            gauge.inc()
        gone = self.gone = scope.get("extensions", {}).get(DISCONNECT)  # our protocol's
        if gone is not None:
            call.gone = gone
            gone.add_done_callback(call.client_left)
        else:  # another server: a task waits for http.disconnect
            watcher = self.watcher = call.gone = asyncio.ensure_future(
                _watch_disconnect(self.receive, call))
            watcher.add_done_callback(_quiet)
        return call

    async def __aexit__(self, *exc: object) -> None:
        call = self.call
        if self.gone is not None:
            self.gone.remove_done_callback(call.client_left)  # no reference cycle left behind
        elif self.watcher is not None:
            self.watcher.cancel()  # not awaited: it ends on the loop's next turn, holding nothing
            call.gone = None  # its CancelledError's frames hold `call`: no cycle through it
        if self.gauge is not None:
            self.gauge.dec()
