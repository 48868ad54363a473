"""CORS for browser clients (`cors_origins`; off when empty), applied by
`seqserve.service.web.middleware.HttpLifecycle` before anything else looks at a request.

- A preflight (`OPTIONS` with `Origin` and `Access-Control-Request-Method`) is answered here,
  before the API-key check and the content-type check (a browser never sends a key, nor a
  body, with it): 204 with `Access-Control-Allow-Origin`, `-Methods` (GET, HEAD, POST),
  `-Headers` (the request headers the routes read: Authorization, Content-Type, ..., W3C
  trace context and the OpenAI JavaScript SDK's `x-stainless-*`; `cors_headers` adds more) and
  `-Max-Age`; a 403 (the one JSON error answer) names what is not allowed: the origin, the
  method or a header.
- Every other answer to an allowed origin (errors, 401, 415 and 429 included: a page must be
  able to read why) carries `Access-Control-Allow-Origin` and `Access-Control-Expose-Headers`
  (the request id, Server-Timing, Retry-After, WWW-Authenticate, OIP's binary header
  length and `traceparent`; `cors_expose_headers` adds more), so the page's script can read
  them. An origin not allowed gets its answer without
  them (the browser then hides it from the page).
- `*` allows any origin and answers `Access-Control-Allow-Origin: *` (no cookies are read, so
  no credentials mode is needed: Authorization is sent as an explicit header); a list answers
  with the request's own origin and `Vary: Origin`.
"""

from __future__ import annotations

from collections.abc import Iterable

from starlette.types import Scope

from seqserve.service.core.answers import Answer
from seqserve.service.web.responses import error_for

METHODS = ("GET", "HEAD", "POST")
HEADERS = ("authorization", "content-type", "content-encoding", "accept", "accept-language",
           "content-language", "x-request-id", "x-request-timeout", "x-session-id",
           "inference-header-content-length", "traceparent", "tracestate", "x-stainless-*")
"""The request headers a page may send: the CORS-safelisted ones, those the routes read, W3C
trace context and the OpenAI JavaScript SDK's own (`x-stainless-os`, ...); a name ending in
`*` allows every header it starts. `cors_headers` adds to them."""
EXPOSE = ("x-request-id", "server-timing", "retry-after", "www-authenticate",
          "inference-header-content-length", "traceparent")
"""The answer headers a page's script may read; `cors_expose_headers` adds to them."""
MAX_AGE = b"600"
"""Seconds a browser may reuse a preflight's answer."""


def _header(scope: Scope, name: bytes) -> bytes | None:
    for key, value in scope["headers"]:
        if key == name:
            return bytes(value)
    return None


class Cors:
    """The allowed origins (see the module doc)."""

    def __init__(self, origins: Iterable[str], headers: Iterable[str] = (),
                 expose: Iterable[str] = ()) -> None:
        listed = list(origins)
        self.any = "*" in listed
        self.origins = frozenset(o.lower().encode("latin-1") for o in listed if o != "*")
        self.headers = tuple(dict.fromkeys([*HEADERS, *(h.lower() for h in headers)]))
        self.expose = ", ".join(dict.fromkeys([*EXPOSE, *(h.lower() for h in expose)])).encode()

    def allows_header(self, name: str) -> bool:
        """Whether a page may send the request header `name` (lower case)."""
        return any(name == h or h.endswith("*") and name.startswith(h[:-1])
                   for h in self.headers)

    def origin(self, scope: Scope) -> bytes | None:
        """The request's `Origin` header (None: not a cross-origin browser request)."""
        return _header(scope, b"origin")

    def allows(self, origin: bytes) -> bool:
        return self.any or origin.lower() in self.origins

    def _allow_origin(self, origin: bytes) -> list[tuple[bytes, bytes]]:
        if self.any:
            return [(b"access-control-allow-origin", b"*")]
        return [(b"access-control-allow-origin", origin), (b"vary", b"Origin")]

    @staticmethod
    def is_preflight(scope: Scope) -> bool:
        return scope["method"] == "OPTIONS" and \
            _header(scope, b"access-control-request-method") is not None

    def preflight(self, scope: Scope, origin: bytes) -> Answer:
        """The answer to a preflight from `origin` (see the module doc)."""
        method = (_header(scope, b"access-control-request-method") or b"").decode("latin-1")
        asked = (_header(scope, b"access-control-request-headers") or b"").decode("latin-1")
        wanted = [h.strip().lower() for h in asked.split(",") if h.strip()]
        refused = [h for h in wanted if not self.allows_header(h)]
        why = None
        if not self.allows(origin):
            why = (f"CORS: origin {origin.decode('latin-1')!r} is not allowed (the server's "
                   "--cors-origins)")
        elif method.upper() not in METHODS:
            why = f"CORS: method {method!r} is not allowed (allowed: {', '.join(METHODS)})"
        elif refused:
            why = (f"CORS: request header(s) {', '.join(refused)} not allowed (allowed: "
                   f"{', '.join(self.headers)})")
        vary = [] if self.any else [(b"vary", b"Origin")]
        if why is not None:
            return error_for(scope, 403, why, headers=vary)
        headers = [*self._allow_origin(origin),
                   (b"access-control-allow-methods", ", ".join(METHODS).encode()),
                   (b"access-control-allow-headers", self._allowed(wanted)),
                   (b"access-control-max-age", MAX_AGE), (b"content-length", b"0")]
        return 204, headers, b""

    def _allowed(self, wanted: list[str]) -> bytes:
        """The preflight's Access-Control-Allow-Headers: the listed names (a pattern stands
        for the headers the preflight asked for that it allows: browsers read no patterns)."""
        names = [h for h in self.headers if not h.endswith("*")]
        names += [h for h in wanted if h not in names]  # (all allowed: refused otherwise)
        return ", ".join(names).encode()

    def extra(self, origin: bytes) -> list[tuple[bytes, bytes]]:
        """The headers added to every answer to a request from `origin` (allowed origins
        only; `Vary: Origin` for every origin when the answer depends on it)."""
        if self.allows(origin):
            return [*self._allow_origin(origin), (b"access-control-expose-headers", self.expose)]
        return [] if self.any else [(b"vary", b"Origin")]
