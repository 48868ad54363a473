"""API keys (off by default): `Authorization: Bearer KEY` on inference and model routes.

`settings.api_key` holds the keys, one per line (a single key is the usual case), or is
`@PATH`: a file of keys, one per line; blank lines and lines starting with `#` are skipped;
`settings.api_key_file` names such a file. They are read once, when the app is built. The
supervisor hands its children a file, never the key itself (no child's environment or command
line holds it). Health (`/v2/health/*`,
`/health`, `/health/*`) and `/metrics` stay open unless `auth_health` / `auth_metrics`; the API
description (`/openapi.json`, `/docs`, `/redoc`) stays open so that `/docs` can load it.

A request without a valid key gets 401 with `WWW-Authenticate: Bearer` and the JSON error
body, before any route runs (so it cannot tell which models exist). Keys are compared as
SHA-256 digests with `hmac.compare_digest` against every configured key, so the time taken
does not depend on how much of a key matched nor on which key it was. Keys are never logged:
the setting is a `SecretStr` and no message here contains one.
"""

from __future__ import annotations

import hashlib
import hmac
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import SecretStr
from starlette.types import Scope

from seqserve.models.errors import UserError
from seqserve.service.core.answers import Answer
from seqserve.service.core.state_token import loose_mode
from seqserve.service.core.state_token import secret_warnings as state_secret_warnings
from seqserve.service.web.responses import error_for

if TYPE_CHECKING:
    from seqserve.service.web.settings import Settings

HEALTH_PATHS = ("/v2/health/", "/health/")
METRICS_PATHS = ("/metrics",)
DOCS_PATHS = ("/openapi.json", "/docs", "/redoc")
CHALLENGE = 'Bearer realm="seqserve"'
MIN_KEY_CHARS = 16
"""A shorter API key is served with a warning at start (`secret_warnings`)."""


class ApiKeyError(UserError):
    """The api_key setting names no usable key (empty, or an unreadable or empty file)."""


AUTHORIZED = "seqserve.authorized"
"""Scope key set on the open API-description paths: whether the request carried a valid key
(with keys on, the document of the served models is only for those that do)."""


def key_file_path(secret: SecretStr | None, file: Path | None) -> Path | None:
    """The file the keys are read from: api_key_file, or api_key's `@PATH` (else None)."""
    if file is not None:
        return file
    value = secret.get_secret_value().strip() if secret is not None else ""
    return Path(value[1:]) if value.startswith("@") else None


def read_keys(secret: SecretStr | None, file: Path | None = None) -> tuple[str, list[str]]:
    """(where they come from, the keys): one key per line of `secret`'s value or of the key
    file (`file`, or `secret`'s `@PATH`; blank lines and `#` comments skipped)."""
    value = secret.get_secret_value().strip() if secret is not None else ""
    where = "api_key"
    path = key_file_path(secret, file)
    if path is not None:
        where = f"api_key file {path}"
        try:
            value = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ApiKeyError(f"{where}: cannot read it ({type(exc).__name__})") from exc
    keys = [line.strip() for line in value.splitlines()]
    keys = [k for k in keys if k and not k.startswith("#")]
    if not keys:
        raise ApiKeyError(f"{where} holds no key: give a key or @FILE, or unset api_key")
    return where, keys


def load_keys(secret: SecretStr | None, file: Path | None = None) -> list[bytes]:
    """SHA-256 digests of the keys (`read_keys`)."""
    return [hashlib.sha256(k.encode()).digest() for k in read_keys(secret, file)[1]]


def secret_warnings(settings: Settings) -> list[str]:
    """Why the server's secrets are weak, for the start-up log (warnings, never refusals):
    an API key under `MIN_KEY_CHARS` characters, a key file or state-secret file its group
    or others may read, a state secret under 32 bytes or of one repeated character
    (`state_token.secret_warnings`). No message holds a key or secret; what cannot be read
    gives none here (its loading refuses it with the reason)."""
    out = []
    if settings.keys_on:
        try:
            where, keys = read_keys(settings.api_key, settings.api_key_file)
        except ApiKeyError:
            keys = []
        for i, key in enumerate(keys):
            if len(key) < MIN_KEY_CHARS:
                out.append(f"{where}: key {i + 1} is {len(key)} characters, under "
                           f"{MIN_KEY_CHARS}: easy to guess (use e.g. "
                           "`openssl rand -hex 32`)")
        path = key_file_path(settings.api_key, settings.api_key_file)
        loose = None if path is None else loose_mode(path)
        if loose is not None:
            out.append(f"api_key file {path}: {loose}")
    return out + state_secret_warnings(settings.state_secret_file)


def is_open(path: str, auth_health: bool, auth_metrics: bool) -> bool:
    """Whether `path` is served without a key."""
    if path.startswith(DOCS_PATHS):
        return True
    if path.startswith(HEALTH_PATHS) or path == "/health":
        return not auth_health
    if path.startswith(METRICS_PATHS):
        return not auth_metrics
    return False


def presented_key(scope: Scope) -> bytes | None:
    """The key of the request's `Authorization: Bearer KEY` header, or None."""
    for name, value in scope.get("headers", []):
        if name == b"authorization":
            scheme, _, key = value.strip().partition(b" ")
            if scheme.lower() == b"bearer" and key.strip():
                return key.strip()
            return None
    return None


def key_matches(key: bytes, digests: list[bytes]) -> bool:
    """Constant-time: every configured key is compared, whatever matched."""
    digest = hashlib.sha256(key).digest()
    found = False
    for known in digests:
        found |= hmac.compare_digest(digest, known)
    return found


class Keys:
    """The key check of protected paths (see the module doc), run by the request lifecycle
    (`web.middleware.HttpLifecycle`) before any route."""

    def __init__(self, digests: list[bytes], auth_health: bool = False,
                 auth_metrics: bool = False) -> None:
        self.digests = digests
        self.auth_health = auth_health
        self.auth_metrics = auth_metrics

    @classmethod
    def of(cls, settings: Settings) -> Keys | None:
        """The check `settings` ask for (reads a key file now), None when keys are off."""
        if not settings.keys_on:
            return None
        return cls(load_keys(settings.api_key, settings.api_key_file),
                   auth_health=settings.auth_health, auth_metrics=settings.auth_metrics)

    def refusal(self, scope: Scope) -> Answer | None:
        """The 401 of a request to a protected path without a valid key, else None (on the
        open API-description paths, `scope[AUTHORIZED]` says whether it held one)."""
        path = scope["path"]
        if is_open(path, self.auth_health, self.auth_metrics):
            if path.startswith(DOCS_PATHS):
                key = presented_key(scope)
                scope[AUTHORIZED] = key is not None and key_matches(key, self.digests)
            return None
        key = presented_key(scope)
        if key is not None and key_matches(key, self.digests):
            return None
        if key is None:
            message = "missing API key: send 'Authorization: Bearer <key>'"
            challenge = CHALLENGE
        else:
            message = "invalid API key"
            challenge = CHALLENGE + ', error="invalid_token"'
        return error_for(scope, 401, message,
                         headers=[(b"www-authenticate", challenge.encode())])
