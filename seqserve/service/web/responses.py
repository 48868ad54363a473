"""The one error answer and the one JSON encoder (`seqserve.service.core.answers`), on ASGI.

- `error_for(scope, status, message, ...)`: the error answer of a request, with its request id
  (set by the access-log middleware) and the shape of its protocol (`shape_of`);
- `send_answer(send, answer)`: writes an answer on ASGI (middleware, API keys, hot path);
- `as_response(answer)`: the same answer as a Starlette `Response` (FastAPI's handlers);
- `JsonResponse`: the app's response class for success bodies, encoded by the same encoder.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from starlette.responses import JSONResponse, Response
from starlette.types import Scope, Send

from seqserve.service.core.answers import (
    Answer,
    ErrorShape,
    encode_json,
    error_answer,
    service_error_answer,
)
from seqserve.service.core.errors import ServiceError

OIP_PREFIX = "/v2"


def request_id_of(scope: Scope) -> str | None:
    """The id the access-log middleware gave this request (None outside it)."""
    state = scope.get("state")
    rid = state.get("request_id") if isinstance(state, dict) else None
    return rid if isinstance(rid, str) else None


def shape_of(scope: Scope) -> ErrorShape:
    """The error shape of the protocol a request's path belongs to. (OpenAI-compatible routes,
    when they come, answer `ErrorShape.OPENAI` here by their prefix.)"""
    path = scope.get("path", "")
    if path == OIP_PREFIX or path.startswith(OIP_PREFIX + "/"):
        return ErrorShape.OIP
    return ErrorShape.PLAIN


def error_for(scope: Scope, status: int, message: str, *, retry_after: float | None = None,
              headers: Iterable[tuple[bytes, bytes]] = (),
              fields: Mapping[str, Any] | None = None) -> Answer:
    """`error_answer` for this request: its request id and its protocol's shape."""
    return error_answer(status, message, request_id=request_id_of(scope), shape=shape_of(scope),
                        retry_after=retry_after, headers=headers, fields=fields)


def service_error_for(scope: Scope, exc: ServiceError) -> Answer:
    """`service_error_answer` for this request."""
    return service_error_answer(exc, request_id=request_id_of(scope), shape=shape_of(scope))


async def send_answer(send: Send, answer: Answer) -> None:
    """Write a whole answer (its headers hold content-type and content-length)."""
    status, headers, body = answer
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def as_response(answer: Answer) -> Response:
    """A whole answer as a Starlette response, its headers exactly the answer's."""
    status, headers, body = answer
    response = Response(body, status_code=status)
    response.raw_headers = list(headers)
    return response


class JsonResponse(JSONResponse):
    """A JSON response encoded by the one encoder (NaN and Infinity as `null`): the app's
    default response class, and what routes that build their answer themselves return. (A
    JSONResponse subclass, so that FastAPI documents the routes' response models.)"""

    def render(self, content: Any) -> bytes:
        return encode_json(content)
