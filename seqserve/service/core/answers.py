"""Every JSON body the server writes: the one encoder, and the one error answer.

**One encoder, msgspec's.** Every response body, success or error, from FastAPI routes, the hot
path, the middleware, API keys and the protocol's 408, is `encode_json`. msgspec was chosen
over a strict `json.dumps(allow_nan=False)`: it is what the hot path already used (fast: the
inference answers are its main cost after the route itself), and it writes the non-finite floats
JSON has no literal for (NaN, +-Infinity, which a model can produce) as `null`, so no answer is
ever invalid JSON and none fails to encode (a strict `json.dumps` would need a walk over every
answer first to map them, or it raises and turns a model's NaN into a 500). numpy scalars and
arrays become plain numbers and lists; any other type raises (a server bug, answered 500).

**One error answer.** `error_answer` builds the status, headers and body of every 4xx/5xx:

    {"error": "<message>", "request_id": "<the X-Request-Id of this request>"}

with `content-type: application/json`, `content-length` and its own extra headers
(`Retry-After` on 429 and every 503, `WWW-Authenticate` on 401, `Allow` on 405,
`Connection: close` on 408, 414 and 431). `request_id` is there whenever a request id was
assigned (by `seqserve.service.web.access_log`: every request that got as far as its headers),
so every 5xx carries it; only the protocol's answers to request heads have none (408: never
complete; 414, 431: over a limit). The shape is chosen by `ErrorShape`, one value per
protocol that fixes one; this module imports no web framework (it is engine-side `core`).
"""

from __future__ import annotations

import enum
import math
from collections.abc import Iterable, Mapping
from typing import Any

import msgspec
import numpy as np

from seqserve.service.core.errors import ServiceError

JSON_TYPE = b"application/json"
Headers = list[tuple[bytes, bytes]]
Answer = tuple[int, Headers, bytes]
"""Status, headers (lower-case names) and body of a whole response."""


def _plain(value: Any) -> Any:
    """msgspec's hook for the types it does not encode itself."""
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"cannot encode {type(value).__name__} as JSON")


_encoder = msgspec.json.Encoder(enc_hook=_plain)


def encode_json(value: Any) -> bytes:
    """`value` as JSON text: the one encoder of every response body (see the module doc).
    NaN and +-Infinity become `null`."""
    return _encoder.encode(value)


class ErrorShape(enum.Enum):
    """The body layout of an error answer, one per protocol that fixes one."""

    PLAIN = "plain"
    """`{"error": message}`: the v1 API, health, models and every route of our own."""
    OIP = "oip"
    """`{"error": message}`: fixed by the Open Inference Protocol (KServe v2) for /v2."""
    OPENAI = "openai"
    """`{"error": {"message", "type", "param", "code"}}`: OpenAI's shape, for the
    OpenAI-compatible routes (`/v1/completions`) and the paths under /v1 that are not ours
    (`/v1/chat/completions`: an OpenAI client's 404)."""


OPENAI_TYPES = {400: "invalid_request_error", 401: "authentication_error",
                403: "permission_error", 404: "invalid_request_error", 408: "timeout",
                413: "invalid_request_error", 422: "invalid_request_error",
                429: "rate_limit_error", 503: "overloaded_error"}
"""The OpenAI error `type` of each status (other 4xx: invalid_request_error, 5xx: api_error)."""


def retry_after_value(seconds: float) -> bytes:
    """A `Retry-After` value: whole seconds, rounded up (never sooner than estimated)."""
    return str(max(0, math.ceil(seconds))).encode()


def error_answer(status: int, message: str, *, request_id: str | None = None,
                 shape: ErrorShape = ErrorShape.PLAIN, retry_after: float | None = None,
                 headers: Iterable[tuple[bytes, bytes]] = (),
                 fields: Mapping[str, Any] | None = None, param: str | None = None,
                 code: str | None = None) -> Answer:
    """The whole answer of an error (every 4xx/5xx the server writes): see the module doc.
    `headers` are extra headers (lower-case names); `fields` extra members of the body (a
    readiness answer's `ready`, `name`, `version`); `param` the request field at fault and
    `code` OpenAI's error code (the OpenAI shape names them; a 404's code is
    "model_not_found" unless given)."""
    error: Any = message
    if shape is ErrorShape.OPENAI:
        error = {"message": message,
                 "type": OPENAI_TYPES.get(status, "api_error" if status >= 500
                                          else "invalid_request_error"),
                 "param": param,
                 "code": code or ("model_not_found" if status == 404 else None)}
    doc: dict[str, Any] = {"error": error, **(fields or {})}
    if request_id is not None:
        doc["request_id"] = request_id
    body = encode_json(doc)
    head: Headers = [(b"content-type", JSON_TYPE), (b"content-length", str(len(body)).encode())]
    if retry_after is not None:
        head.append((b"retry-after", retry_after_value(retry_after)))
    head += [(k.lower(), v) for k, v in headers]
    return status, head, body


def service_error_answer(exc: ServiceError, *, request_id: str | None = None,
                         shape: ErrorShape = ErrorShape.PLAIN) -> Answer:
    """The answer to a domain error: its status, message, Retry-After and field at fault."""
    return error_answer(exc.status, exc.message, request_id=request_id, shape=shape,
                        retry_after=exc.retry_after, param=exc.param)


def bug_message(exc: BaseException) -> str:
    """The message of a 500 for an unexpected exception (its traceback is logged once, with
    the request id, by the access-log middleware; the body names the type only)."""
    return f"internal error ({type(exc).__name__}); this is a server bug"
