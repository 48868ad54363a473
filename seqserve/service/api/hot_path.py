"""The hot path: the inference POST routes answered without FastAPI's per-request machinery.

Measured on the 2-core box (py-spy of an API process under 64 connections): FastAPI's
middleware stack, routing, dependency solving and Response objects took about 40% of the
process's time, the route itself (tokenization, the engine round trip, result building)
35%. `HotPath` answers the same routes (v1 classify, translate, tag, predict and OIP v2 infer,
default and pinned versions) directly on the ASGI messages:

- the body is validated by the very same pydantic models (`model_validate_json`), so the
  validation rules and the error messages are those of the FastAPI routes (which stay
  registered: the OpenAPI document is unchanged, and any other request goes through them);
- the answer is computed by the routes' own functions (`classify_answer`, ...,
  `infer_answer`): worker, request context, early shedding and shape are theirs;
- the answer is encoded with the server's one JSON encoder
  (`seqserve.service.core.answers.encode_json`); every error is the one error answer
  (`seqserve.service.web.responses.error_for`), as in the app's exception handlers.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from typing import Any

from pydantic import BaseModel, ValidationError
from starlette.types import ASGIApp, Receive, Scope, Send

from seqserve.service.api.classify import ClassifyRequest, classify_answer
from seqserve.service.api.common import describe_errors, header
from seqserve.service.api.oip.routes import infer_answer
from seqserve.service.api.predict import PredictRequest, predict_answer
from seqserve.service.api.tag import TagRequest, tag_answer
from seqserve.service.api.translate import TranslateRequest, translate_answer
from seqserve.service.core.answers import JSON_TYPE, Answer, bug_message, encode_json
from seqserve.service.core.errors import ServiceError
from seqserve.service.web.middleware import BODY
from seqserve.service.web.responses import error_for, send_answer, service_error_for
from seqserve.service.web.state import AppState

ROUTE = re.compile(r"^/(v1|v2)/models/([^/]+)(?:/versions/([^/]+))?/"
                   r"(classify|translate|tag|predict|infer)$")
ENDPOINTS = {"classify": "classify", "translate": "translate", "tag": "tag",
             "predict": "predict", "infer": "v2_infer"}
V1: dict[str, tuple[type[BaseModel], Callable[..., Awaitable[dict[str, Any]]]]] = {
    "classify": (ClassifyRequest, classify_answer),
    "translate": (TranslateRequest, translate_answer),
    "tag": (TagRequest, tag_answer),
    "predict": (PredictRequest, predict_answer),
}
"""Each v1 verb's body model and answer (the routes' own functions)."""
JSON = [(b"content-type", JSON_TYPE)]


class HotPath:
    """Answers the inference routes of one app; `match` says whether a request is one."""

    def __init__(self, state: AppState) -> None:
        self.state = state

    def match(self, scope: Scope) -> tuple[str, str, str | None] | None:
        """(verb, model name, version) of an inference POST with a JSON body (OIP infer: any
        body), else None (FastAPI answers it)."""
        if scope["method"] != "POST":
            return None
        found = ROUTE.match(scope["path"])
        if found is None:
            return None
        protocol, name, version, verb = found.groups()
        if (protocol == "v2") != (verb == "infer"):
            return None
        if verb != "infer" and _content_type(scope) != b"application/json":
            return None
        return verb, name, version

    async def __call__(self, scope: Scope, body: bytes, receive: Receive,
                       send: Send, route: tuple[str, str, str | None]) -> None:
        verb, name, version = route
        scope["path_params"] = {"name": name} | ({"version": version} if version else {})
        scope["endpoint_name"] = ENDPOINTS[verb]
        scope["route_path"] = (f"/{'v2' if verb == 'infer' else 'v1'}/models/{{name}}"
                               f"{'/versions/{version}' if version else ''}/{verb}")
        bug: Exception | None = None
        try:
            status, headers, payload = await self._answer(scope, body, receive, route)
            answer = status, [*headers, (b"content-length", str(len(payload)).encode())], payload
        except ServiceError as exc:
            answer = service_error_for(scope, exc)
        except ValidationError as exc:
            errors = [{**e, "loc": ("body", *e["loc"])} for e in exc.errors()]
            answer = error_for(scope, 422, describe_errors(errors))
        except Exception as exc:  # a server bug: a JSON 500 now, its traceback logged above
            bug = exc
            answer = error_for(scope, 500, bug_message(exc))
        await send_answer(send, answer)
        if bug is not None:
            raise bug

    async def _answer(self, scope: Scope, body: bytes, receive: Receive,
                      route: tuple[str, str, str | None]) -> Answer:
        verb, name, version = route
        if verb == "infer":
            head, payload, media = await infer_answer(self.state, scope, receive, name,
                                                      version, body)
            return 200, [(b"content-type", media.encode()), *head], payload
        model, answer = V1[verb]
        request = model.model_validate_json(body)
        result = await answer(self.state, scope, receive, name, version, request)
        return 200, JSON, encode_json(result)


class HotPathRouter:
    """ASGI: the inference routes to `HotPath`, everything else to `fallback` (FastAPI)."""

    def __init__(self, fast: HotPath, fallback: ASGIApp) -> None:
        self.fast = fast
        self.fallback = fallback

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        route = self.fast.match(scope) if scope["type"] == "http" else None
        if route is None:
            await self.fallback(scope, receive, send)
            return
        body = scope.get(BODY)  # read once, by ServingMiddleware
        if body is None:  # an app without it (tests): read it here
            chunks = []
            while True:
                message = await receive()
                chunks.append(message.get("body", b""))
                if message["type"] != "http.request" or not message.get("more_body", False):
                    break
            body = b"".join(chunks)
        await self.fast(scope, body, receive, send, route)


def _content_type(scope: Scope) -> bytes:
    value = header(scope, b"content-type") or ""
    return value.encode("latin-1").split(b";")[0].strip().lower()
