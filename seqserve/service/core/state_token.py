"""Recurrent state as a value: a state token carries a sequence's whole past (a language
model's flat state and the token not yet fed through, a feature series' state and its step
count) so that any replica holding the same bundle and secret continues it.

A token is `base64url(payload || HMAC-SHA256(secret, payload))`, the payload a small binary
record (`STRUCT` below): the token's kind, the bundle's identity (model name, version and the
sha256 of its manifest, which hashes every file), the position (tokens or steps consumed),
the state's float32 bytes and, for a language model, what sampling needs to continue exactly
(the pending token, the sequence's random-stream key and draw count, the request's seed).

Secrets come from `--state-secret-file` (one per line; the first signs, every one verifies:
add a new first line to rotate, drop the old one once its tokens have expired). Like the API
key they never travel in a child's environment or command line (the supervisor hands children
the file's path). A token that does not verify, is malformed or is over `MAX_TOKEN_CHARS` is a
400; one of another bundle a 409 (`StateMismatch`); a server without a secret answers 400 to
`state` and `return_state` alike.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import os
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from seqserve.service.core.errors import BadRequest, StateMismatch

MAGIC = b"SQST"
FORMAT = 1
KIND_LM, KIND_SERIES = 1, 2
KIND_NAMES = {KIND_LM: "language-model", KIND_SERIES: "series"}
MAC_BYTES = 32
MAX_STATE_FLOATS = 1 << 20
"""4 MiB of state: far above any recurrent model served here (text-lm: 512 floats)."""
MAX_TOKEN_CHARS = 4 * ((MAX_STATE_FLOATS * 4 + 1024) // 3 + 1)
_HEAD = struct.Struct("<4sBBH")  # magic, format, kind, name length
_BODY = struct.Struct("<I32sQI")  # version, bundle sha256, position, state floats
_LM = struct.Struct("<qQQBQ")  # pending token, key, drawn, has seed, seed
ENV_SECRET_FILE = "SEQSERVE_STATE_SECRET_FILE"


@dataclass(frozen=True)
class Identity:
    """The bundle a state belongs to."""

    name: str
    version: int
    sha256: bytes
    """32 bytes: sha256 of the bundle's manifest (`bundle_identity`)."""


@dataclass(frozen=True)
class LMResume:
    """What continuing a language model's sequence needs beyond its state."""

    pending: int
    """The last token drawn, not fed through the model yet (-1: none)."""
    key: int
    """The sequence's random stream (`scheduling.sampling.uniforms`), uint64."""
    drawn: int
    """Tokens the stream drew so far."""
    seed: int | None
    """The seed of the request that began the stream (None: unseeded)."""


@dataclass(frozen=True)
class StateValue:
    """A decoded, verified token."""

    kind: int
    identity: Identity
    position: int
    """Tokens (a language model's, bos included) or steps (a series) consumed."""
    state: bytes
    """float32, little-endian, the model's flat state of one row."""
    lm: LMResume | None = None

    @property
    def floats(self) -> int:
        return len(self.state) // 4


def load_secrets(path: str | os.PathLike[str] | None) -> list[bytes]:
    """The secrets of a `--state-secret-file` (one per non-empty line, first signs). A file
    that is missing, empty or holds a secret under 16 bytes is a ValueError naming it."""
    if not path:
        return []
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"--state-secret-file {path}: cannot read it ({exc})") from exc
    secrets = [line.strip().encode() for line in lines if line.strip()]
    if not secrets:
        raise ValueError(f"--state-secret-file {path}: holds no secret (one per line)")
    short = [i for i, s in enumerate(secrets) if len(s) < 16]
    if short:
        raise ValueError(f"--state-secret-file {path}: line {short[0] + 1} holds fewer than 16 "
                         "characters (use e.g. `openssl rand -hex 32`)")
    return secrets


STRONG_SECRET_BYTES = 32
"""A secret shorter than this (but at least the 16 bytes `load_secrets` demands) is served
with a warning at start (`secret_warnings`): `openssl rand -hex 32` makes 64."""


def secret_warnings(path: str | os.PathLike[str] | None) -> list[str]:
    """Why the secrets of a `--state-secret-file` are weak, for the start-up log (never a
    refusal; the refusals are `load_secrets`'): a secret under `STRONG_SECRET_BYTES` bytes or
    of one repeated character, and a file that its group or others may read (mode & 0o077).
    No message holds a secret; an unreadable file gives none (`load_secrets` says why)."""
    if not path:
        return []
    try:
        secrets = load_secrets(path)
    except ValueError:
        return []
    out = []
    for i, secret in enumerate(secrets):
        if len(set(secret)) == 1:
            out.append(f"--state-secret-file {path}: the secret on line {i + 1} is one "
                       "character repeated (use e.g. `openssl rand -hex 32`)")
        elif len(secret) < STRONG_SECRET_BYTES:
            out.append(f"--state-secret-file {path}: the secret on line {i + 1} is "
                       f"{len(secret)} bytes, under {STRONG_SECRET_BYTES} (use e.g. "
                       "`openssl rand -hex 32`)")
    loose = loose_mode(path)
    if loose is not None:
        out.append(f"--state-secret-file {path}: {loose}")
    return out


def loose_mode(path: str | os.PathLike[str]) -> str | None:
    """Why a file of secrets is readable beyond its owner (mode & 0o077), else None."""
    try:
        mode = os.stat(path).st_mode & 0o777
    except OSError:
        return None
    if not mode & 0o077:
        return None
    return (f"mode {mode:04o} lets its group or others read or change it: "
            f"chmod 600 {os.fspath(path)}")


class StateCodec:
    """Signs and checks state tokens with a server's secrets (module doc)."""

    def __init__(self, secrets: list[bytes]) -> None:
        self.secrets = list(secrets)

    @classmethod
    def from_file(cls, path: str | os.PathLike[str] | None) -> StateCodec:
        return cls(load_secrets(path))

    @property
    def enabled(self) -> bool:
        return bool(self.secrets)

    def require(self, field: str) -> None:
        """A 400 when this server has no secret (`field`: what the request used)."""
        if not self.secrets:
            raise BadRequest(f"{field}: this server has no state secret, so it neither issues "
                             "nor accepts state tokens (start it with --state-secret-file)",
                             param=field)

    def encode(self, value: StateValue) -> str:
        self.require("return_state")
        ident = value.identity
        name = ident.name.encode()
        parts = [_HEAD.pack(MAGIC, FORMAT, value.kind, len(name)), name,
                 _BODY.pack(ident.version, ident.sha256, value.position, value.floats),
                 value.state]
        if value.lm is not None:
            r = value.lm
            parts.append(_LM.pack(r.pending, r.key, r.drawn, r.seed is not None,
                                  (r.seed or 0) % 2**64))
        payload = b"".join(parts)
        mac = hmac.new(self.secrets[0], payload, hashlib.sha256).digest()
        return base64.urlsafe_b64encode(payload + mac).rstrip(b"=").decode("ascii")

    def decode(self, token: object, field: str = "state") -> StateValue:
        """The verified value of `token`, or a 400 naming `field` and what is wrong."""
        self.require(field)
        if not isinstance(token, str) or not token:
            raise BadRequest(f"{field} must be a state token (a string the server returned)",
                             param=field)
        if len(token) > MAX_TOKEN_CHARS:
            raise BadRequest(f"{field}: {len(token)} characters is over the state token "
                             f"limit {MAX_TOKEN_CHARS}", param=field)
        try:
            raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
        except (binascii.Error, ValueError):
            raise BadRequest(f"{field} is not a state token (not base64url)",
                             param=field) from None
        payload, mac = raw[:-MAC_BYTES], raw[-MAC_BYTES:]
        if len(raw) <= MAC_BYTES or not any(
                hmac.compare_digest(mac, hmac.new(s, payload, hashlib.sha256).digest())
                for s in self.secrets):
            raise BadRequest(f"{field}: the state token does not verify (changed, truncated or "
                             "issued by a server with other secrets)", param=field)
        try:
            return _parse(payload)
        except (struct.error, UnicodeDecodeError, ValueError) as exc:
            raise BadRequest(f"{field}: the state token is malformed ({exc})",
                             param=field) from None


def _parse(payload: bytes) -> StateValue:
    magic, fmt, kind, name_len = _HEAD.unpack_from(payload, 0)
    if magic != MAGIC or fmt != FORMAT or kind not in KIND_NAMES:
        raise ValueError(f"unknown format {magic!r} {fmt} kind {kind}")
    at = _HEAD.size
    name = payload[at : at + name_len].decode()
    at += name_len
    version, sha, position, floats = _BODY.unpack_from(payload, at)
    at += _BODY.size
    if floats > MAX_STATE_FLOATS:
        raise ValueError(f"{floats} state floats")
    state = payload[at : at + 4 * floats]
    if len(state) != 4 * floats:
        raise ValueError("state cut short")
    at += 4 * floats
    lm = None
    if kind == KIND_LM:
        pending, key, drawn, has_seed, seed = _LM.unpack_from(payload, at)
        at += _LM.size
        lm = LMResume(pending, key, drawn, seed if has_seed else None)
    if at != len(payload):
        raise ValueError(f"{len(payload) - at} bytes past the record")
    return StateValue(kind, Identity(name, version, sha), position, state, lm)


def check_identity(value: StateValue, want: Identity, kind: int, state_floats: int,
                   field: str = "state") -> None:
    """A token of `kind` for the bundle `want` with `state_floats` floats, else 400 (kind,
    size) or 409 (another model, version or bundle content)."""
    if value.kind != kind:
        raise BadRequest(f"{field}: a {KIND_NAMES[value.kind]} state token given to a "
                         f"{KIND_NAMES[kind]} model", param=field)
    got = value.identity
    if (got.name, got.version) != (want.name, want.version):
        raise StateMismatch(f"{field}: the state token belongs to {got.name} version "
                            f"{got.version}, not {want.name} version {want.version} (pin that "
                            "version, or start over without the token)", param=field)
    if got.sha256 != want.sha256:
        raise StateMismatch(f"{field}: the state token belongs to another bundle published as "
                            f"{got.name} version {got.version} (its files changed)",
                            param=field)
    if value.floats != state_floats:
        raise BadRequest(f"{field}: the state token holds {value.floats} floats, this model's "
                         f"state has {state_floats}", param=field)


def bundle_identity(name: str, version: int, manifest: Mapping[str, Any]) -> Identity:
    """The identity of a loaded bundle: the sha256 of its manifest's canonical JSON (sorted
    keys, compact; the manifest hashes every file of the bundle), so two replicas that
    loaded the same files agree and a republished version with other files does not."""
    body = {k: v for k, v in manifest.items() if k != "manifest_sha256"}
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return Identity(name, version, hashlib.sha256(canonical.encode("ascii")).digest())
