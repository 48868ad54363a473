"""The HTTP front of the inference routes: the route table (`api/routes.py` `TABLE`)
dispatched directly on the ASGI messages, without FastAPI's per-request machinery.

Measured on the 2-core box (py-spy of an API process under 64 connections): FastAPI's
middleware stack, routing, dependency solving and Response objects took about 40% of the
process's time, the route itself (tokenization, the engine round trip, result building)
35%. So every inference route (v1 classify, translate, tag, predict, KServe V1 `:predict`,
generate, score, OpenAI completions, OIP v2 infer, generate and generate_stream, default and
pinned versions) is answered here, and only here; FastAPI serves the others:

- the body (read once, by the request lifecycle `web.middleware.HttpLifecycle`) is
  validated by the route's pydantic model as the route `reads` it: `model_validate_json`
  for an application/json body, any other content type (and every body of the routes that
  say "fastapi") as FastAPI reads a body (`read_like_fastapi`), so each route's rules and
  messages are the ones it always had;
- the answer is the route's own (`lifecycle.serve`): worker, deadline, early shedding,
  in-flight accounting and disconnects are the one lifecycle's;
- `head`: an overloaded model's refusal from the request's head alone (`shed_unread`), the
  route's part of the lifecycle's one decision from the head (which a front may write
  without running the app: `web/http_protocol.py`, the native front);
- a success is encoded with the server's one JSON encoder
  (`seqserve.service.core.answers.encode_json`), a streamed answer sends itself; every
  error is the one error answer (`seqserve.service.web.responses.error_for`), as in the
  app's exception handlers; another method is a 405, a trailing slash a 307 to the path
  without it, as FastAPI answered them.
"""

from __future__ import annotations

import email.message
import json
import re
from collections.abc import Callable, Iterable
from typing import Any

from pydantic import BaseModel, ValidationError
from starlette.datastructures import URL
from starlette.responses import RedirectResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from seqserve.service.api.common import describe_errors, header
from seqserve.service.api.lifecycle import (
    SHED_AFTER,
    SHED_MESSAGE,
    Route,
    asgi_call,
    begin,
    scheduled_model,
    serve,
    shed_unread,
)
from seqserve.service.core.answers import JSON_TYPE, Answer, bug_message, encode_json
from seqserve.service.core.errors import BadRequest, ClientGone, ServiceError
from seqserve.service.web.front_rule import HeadRoutes
from seqserve.service.web.middleware import BODY
from seqserve.service.web.responses import error_for, send_answer, service_error_for
from seqserve.service.web.state import AppState

BY_MODEL = re.compile(r"^(/v1|/v2)/models/([^/]+?)(?:/versions/([^/]+?))?(/|:)([^/:]+)$")
"""A by-model route's path: prefix, model, version (optional), the join ("/", or ":" for
KServe V1's `{name}:predict`; a name may hold ":" itself, the verb may not), verb."""
JSON = (b"content-type", JSON_TYPE)
NOT_JSON = "request body is not valid JSON text (malformed or not UTF-8)"
ALLOW = [(b"allow", b"POST")]
SENT_AS_IS = re.compile(r"[A-Za-z0-9._~:@!$&'()*+,;=/-]+")
"""A path a client sends as it is (no percent-encoding needed)."""
NOT_READY = float("nan")
NOT_MEASURED = -1.0
"""`head_waits`' values of a version not ready, and of one whose wait is not measured yet."""
Found = tuple[Route, str | None, str | None, str]
"""A matched route, its model name and version (None: not in the path), its path template."""
HEAD_ROUTE = "seqserve.head_route"
"""The scope key of the route (`Found`) of a request whose shed decision `head` made and
passed; `direct` and `begin`, which a front runs right after it with the whole body read, take
it from there instead of matching, naming the route and deciding again. (Not the head's `Call`:
its header reader holds the scope, and the scope holding it would be a reference cycle.)"""


class Unprocessable(Exception):
    """A body that does not validate: its pydantic errors, located under `body`."""

    def __init__(self, errors: list[Any]) -> None:
        super().__init__("unprocessable body")
        self.errors = errors


class HotPath:
    """ASGI: answers the inference routes of one app (`table`), and passes every other
    request to `fallback` (FastAPI); `match` says whether a path is one of them."""

    def __init__(self, state: AppState, table: Iterable[Route], fallback: ASGIApp) -> None:
        self.state = state
        self.fallback = fallback
        self.by_verb: dict[tuple[str, str, str], tuple[Route, str, str]] = {}
        self.fixed: dict[str, Found] = {}
        for route in table:
            if route.by_model:
                self.by_verb[route.prefix, route.joined, route.verb] = \
                    route, route.path(), route.path(True)
            else:
                self.fixed[route.path()] = route, None, None, route.path()

    def match(self, path: str) -> Found | None:
        """The inference route of `path`, else None (FastAPI answers it)."""
        found = self.fixed.get(path)
        if found is not None:
            return found
        parts = BY_MODEL.match(path)
        if parts is None:
            return None
        prefix, name, version, joined, verb = parts.groups()
        entry = self.by_verb.get((prefix, joined, verb))
        if entry is None:
            return None
        route, default, pinned = entry
        return route, name, version, default if version is None else pinned

    def head(self, scope: Scope) -> Answer | None:
        """The route's own answer to a request from its head alone, asked by the request
        lifecycle before the body is read (`web.middleware.HttpLifecycle`): the refusal of a
        POST to an overloaded model (`shed_unread`: the model's expected wait against the
        deadline the headers allow), else None."""
        found = self.match(scope["path"])
        if found is None:
            return None
        _, name, version, _ = found
        if name is None or scope["method"] != "POST":
            return None
        _name_route(scope, found)
        try:
            shed_unread(self.state, asgi_call(scope, _unused, name, version))
        except ServiceError as exc:
            return service_error_for(scope, exc)
        scope[HEAD_ROUTE] = found
        return None

    def head_routes(self) -> HeadRoutes:
        """What a front needs to refuse from the head as `head` does (`web.front_rule.FrontRule`):
        the (model, version) pairs the paths name (None: the default version), every
        inference path of them as sent, without percent-encoding: {path: (its pair's index,
        its endpoint's name)}, and `shed_early`'s message."""
        pairs: list[tuple[str, str | None]] = []
        paths: dict[str, tuple[int, str]] = {}
        for name, versions in self.state.repository.entries.items():
            for version in [None, *map(str, versions)]:
                index = len(pairs)
                pairs.append((name, version))
                for (prefix, joined, verb), (route, _, _) in self.by_verb.items():
                    path = (f"{prefix}/models/{name}"
                            f"{'' if version is None else '/versions/' + version}{joined}{verb}")
                    found = self.match(path)
                    if found is not None and found[:3] == (route, name, version) \
                            and SENT_AS_IS.fullmatch(path):
                        paths[path] = index, route.name
        return HeadRoutes(pairs, paths, SHED_MESSAGE, SHED_AFTER)

    def head_waits(self, pairs: list[tuple[str, str | None]]) -> list[float]:
        """Each pair's expected queue wait as `head` reads it now (`lifecycle.scheduled_model`,
        each model's estimate once: a default and its pinned version are one): -1.0 when not
        measured yet, NaN when that version is not ready."""
        waits = []
        known: dict[int, float] = {}
        for name, version in pairs:
            try:
                model = scheduled_model(self.state, name, version)
            except ServiceError:
                waits.append(NOT_READY)
                continue
            wait = known.get(id(model))
            if wait is None:
                estimate = model.expected_wait()
                wait = known[id(model)] = NOT_MEASURED if estimate is None else estimate
            waits.append(wait)
        return waits

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.fallback(scope, receive, send)
            return
        path = scope["path"]
        found = self.match(path)
        if found is None:
            if path.endswith("/") and path != "/" and self.match(path.rstrip("/")):
                # FastAPI's redirect_slashes, for the routes it no longer holds
                url = URL(scope={**scope, "path": path.rstrip("/")})
                await RedirectResponse(url=str(url))(scope, receive, send)
                return
            await self.fallback(scope, receive, send)
            return
        await self.answer(scope, scope[BODY], receive, send, found)

    async def answer(self, scope: Scope, body: bytes, receive: Receive, send: Send,
                     found: Found) -> None:
        """The route's answer to one request whose head passed (`head`) and whose body
        (`body`) the lifecycle read."""
        route, name, version, _ = found
        _name_route(scope, found)
        if scope["method"] != "POST":
            await send_answer(send, error_for(scope, 405, "Method Not Allowed", headers=ALLOW))
            return
        started = False

        async def sending(message: Any) -> None:
            nonlocal started
            started = True
            await send(message)

        bug: Exception | None = None
        try:
            call = asgi_call(scope, receive, name or "", version)
            parsed = _parse(route, body, scope)
            if route.model_of is not None:  # the model the body names: metrics, access log
                scope["path_params"] = {"name": route.model_of(parsed)}
            reply = await serve(self.state, route, call, parsed)
            if type(reply) is tuple:
                answer: Answer = reply
            elif type(reply) is not dict:  # a streamed answer sends itself
                await reply(scope, receive, sending)
                return
            else:
                answer = _ok(reply)
        except Exception as exc:
            refused = _refusal(scope, exc)
            if refused is None:  # a server bug: a JSON 500 now, its traceback logged above
                if started:
                    raise
                bug = exc
                refused = error_for(scope, 500, bug_message(exc))
            answer = refused
        await send_answer(send, answer)
        if bug is not None:
            raise bug

    def direct(self, scope: Scope) -> Found | None:
        """The route of a request that `begin` can answer (a POST to a route with
        `Route.begin`: its work answered from callbacks, without a task), else None."""
        found = scope.get(HEAD_ROUTE) or self.match(scope["path"])
        if found is None or found[0].begin is None or scope["method"] != "POST":
            return None
        return found

    def begin(self, scope: Scope, body: bytes, found: Found,
              answered: Callable[[Answer | Exception], None]) -> None:
        """`answer` for a route that `direct` found, without a task: `answered` gets the
        route's answer (or a server bug's exception), now or from the callback that sees the
        work done (`lifecycle.begin`)."""
        route, name, version, _ = found
        headed = scope.pop(HEAD_ROUTE, None) is not None  # (`head` named it just now)
        if not headed:
            _name_route(scope, found)

        def replied(reply: Any, error: BaseException | None) -> None:
            answer: Answer | Exception
            try:
                if error is None:
                    answer = _ok(reply)
                elif isinstance(error, Exception):
                    answer = _refusal(scope, error) or error
                else:  # (a cancellation: the work was dropped)
                    answer = service_error_for(scope, ClientGone("request cancelled"))
            except Exception as exc:  # (a reply the encoder refused: a bug, its 500)
                answer = exc
            answered(answer)

        try:
            call = asgi_call(scope, _unused, name or "", version)
            call.shed = headed  # (its shed passed in `head` just now)
            begin(self.state, route, call, _parse(route, body, scope), replied)
        except Exception as exc:
            answered(_refusal(scope, exc) or exc)


def _ok(reply: dict[str, Any]) -> Answer:
    """A route's success: its JSON body, by the one encoder."""
    payload = encode_json(reply)
    return 200, [JSON, (b"content-length", str(len(payload)).encode())], payload


def _refusal(scope: Scope, exc: Exception) -> Answer | None:
    """The one error answer to what a route raised (a service error, a body that does not
    validate), or None: a server bug."""
    if isinstance(exc, ServiceError):
        return service_error_for(scope, exc)
    if isinstance(exc, ValidationError):
        errors = [{**e, "loc": ("body", *e["loc"])} for e in exc.errors()]
        return error_for(scope, 422, describe_errors(errors))
    if isinstance(exc, Unprocessable):
        return error_for(scope, 422, describe_errors(exc.errors))
    return None


def _name_route(scope: Scope, found: Found) -> None:
    """Record the matched route in the scope (its model and version as path parameters):
    the request metrics and the access log read them."""
    route, name, version, template = found
    if name is not None:
        scope["path_params"] = {"name": name} | ({"version": version} if version else {})
    scope["endpoint_name"] = route.name
    scope["route_path"] = template


async def _unused() -> Any:
    """The `receive` of a call made from a request's head: never called (nothing is read)."""
    raise RuntimeError("a request's head has no body to receive")


def _parse(route: Route, body: bytes, scope: Scope) -> Any:
    """The route's request model from the body (the bytes for a route without one), as the
    route `reads` it; a failure is the route's own error where it has one (`refused`)."""
    model = route.body
    if model is None:
        return body
    kind = b"" if route.reads == "any" else _content_type(scope)
    try:
        if route.reads == "any" or route.reads == "json" and kind == b"application/json":
            return model.model_validate_json(body)
        return read_like_fastapi(model, body, kind)
    except ValidationError as exc:
        if route.refused is None:
            raise
        raise route.refused(exc) from exc


def read_like_fastapi(model: type[BaseModel], body: bytes, kind: bytes) -> BaseModel:
    """A body read as FastAPI reads one: `json.loads` for a JSON content type (application/json
    or application/*+json) or none, the bytes themselves for any other, then Python-mode validation;
    an empty body is a missing one; a body that is not JSON text (not UTF-8, too deep) 400."""
    if not body:
        raise Unprocessable([{"type": "missing", "loc": ("body",), "msg": "Field required"}])
    value: Any = body
    message = email.message.Message()
    message["content-type"] = kind.decode("latin-1")
    subtype = message.get_content_subtype()
    if not kind or message.get_content_maintype() == "application" and (
            subtype == "json" or subtype.endswith("+json")):
        try:
            value = json.loads(body)
        except json.JSONDecodeError as exc:
            raise Unprocessable([{"type": "json_invalid", "loc": ("body", exc.pos),
                                  "msg": "JSON decode error", "ctx": {"error": exc.msg}}]
                                ) from exc
        except Exception as exc:
            raise BadRequest(NOT_JSON) from exc
    try:
        return model.model_validate(value, from_attributes=True)
    except ValidationError as exc:
        raise Unprocessable([{**e, "loc": ("body", *e["loc"])} for e in exc.errors()]
                            ) from exc


def _content_type(scope: Scope) -> bytes:
    value = header(scope, b"content-type") or ""
    return value.encode("latin-1").split(b";")[0].strip().lower()
