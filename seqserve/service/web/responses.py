"""The one error answer and the one JSON encoder (`seqserve.service.core.answers`), on ASGI.

- `error_for(scope, status, message, ...)`: the error answer of a request, with its request id
  (set by the access-log middleware) and the shape of its protocol (`shape_of`); `not_found`
  the 404 of a path no route serves;
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
OPENAI_PATHS = frozenset({"/v1/completions", "/v1/chat/completions"})
"""The OpenAI-compatible routes: their errors (refusals and API keys included) are OpenAI's."""
NATIVE_V1 = ("/v1/models", "/v1/admin")
"""Our own routes under /v1 (their errors keep our shape); any other /v1 path is OpenAI's
namespace (`/v1/chat/completions`, `/v1/embeddings`): its 404 is in OpenAI's shape."""
NOT_SERVED: dict[str, str] = {
    "/v1/embeddings": "embeddings are not served: seqserve's language models serve text and "
                      "chat completions (POST /v1/completions, POST /v1/chat/completions)",
}
"""Why an OpenAI path clients try is not served."""


def request_id_of(scope: Scope) -> str | None:
    """The id the access-log middleware gave this request (None outside it)."""
    state = scope.get("state")
    rid = state.get("request_id") if isinstance(state, dict) else None
    return rid if isinstance(rid, str) else None


def shape_of(scope: Scope) -> ErrorShape:
    """The error shape of the protocol a request's path belongs to."""
    path = scope.get("path", "")
    if path == OIP_PREFIX or path.startswith(OIP_PREFIX + "/"):
        return ErrorShape.OIP
    if path in OPENAI_PATHS or path.startswith("/v1/") and not any(
            path == p or path.startswith(p + "/") for p in NATIVE_V1):
        return ErrorShape.OPENAI
    return ErrorShape.PLAIN


def not_found(scope: Scope, message: str) -> Answer:
    """The 404 of a path no route serves; under OpenAI's namespace (`shape_of`) in its
    shape, saying what is served instead."""
    path = scope.get("path", "")
    if shape_of(scope) is not ErrorShape.OPENAI or path in OPENAI_PATHS:
        return error_for(scope, 404, message)
    why = NOT_SERVED.get(path.rstrip("/")) or (
        f"{path} is not served: the OpenAI-compatible routes here are POST /v1/completions, "
        "POST /v1/chat/completions, GET /v1/models and GET /v1/models/{model}")
    return error_answer(404, why, request_id=request_id_of(scope), shape=ErrorShape.OPENAI,
                        code="unknown_url")


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
