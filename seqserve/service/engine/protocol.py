"""The frames between API processes (DEALER) and the engine (ROUTER): msgspec msgpack.

API -> engine: `Hello` (which models, in what state, and the engine's effective options);
`Ping`, the heartbeat, answered by `Pong`;
from the model control (the supervisor) `LoadModel` and `UnloadModel`, answered by `Loaded`
and `Unloaded`;
one typed message per call of the engine interface (`SubmitRows`, `SubmitScore`,
`SubmitTranslate`, `SubmitSeries`, `SubmitChunk`, `Generate`; engine/interface.py), `StopSeq`
and `Cancel` (the client left or its deadline passed). Engine -> API: `State`, `Rows`
(per-row result arrays and timings), `Decodes` (per source hypotheses), `Tokens` (one step's
news of a generation), `Failure` (a `seqserve.service.core.errors` class name, its message
and Retry-After); each reply also carries the model's expected queue wait, which API
processes use to shed load before they tokenize.

Token ids travel as one int32 buffer plus lengths; result arrays as (dtype, shape, bytes).
Deadlines are `time.monotonic()` values: one clock for every process on the machine.
"""

from __future__ import annotations

import array
import os
import secrets
from typing import Any

import msgspec
import numpy as np

from seqserve.service.scheduling.models import SessionRow


class Hello(msgspec.Struct, tag="hello", array_like=True):
    pass


class Call(msgspec.Struct, array_like=True):
    """What every call of the engine interface carries (engine/interface.py)."""

    id: int
    model: str
    version: int
    deadline: float


class SubmitRows(Call, tag="submit-rows"):
    """Token rows of one request for a classifier or tagger (`Engine.rows`)."""

    lengths: bytes
    """int32 (n,): tokens of each row."""
    ids: bytes
    """int32 (sum of lengths,): the rows' token ids, concatenated."""


class SubmitScore(SubmitRows, tag="submit-score"):
    """Texts (bos first) a language model scores (`Engine.score`)."""

    top: int = 0
    """The best tokens asked for at every position (0: none)."""
    start_state: bytes = b""
    """One text continuing a state (flat float32 bytes; empty: from bos)..."""
    start_token: int = -1
    """...whose pending token is fed first."""
    return_state: bool = False
    """Each text's state before its last token, and that token, end its result."""


class SubmitTranslate(SubmitRows, tag="submit-translate"):
    """Sources to translate (`Engine.translate`)."""

    options: dict[str, Any] = {}
    """`SearchOptions` fields."""


class SubmitSeries(Call, tag="submit-series"):
    """Float series of one request for a feature-sequence model (`Engine.series`)."""

    lengths: bytes
    """int32 (n,): steps of each series."""
    features: bytes
    """float32 (sum of lengths, width): the series' steps concatenated."""
    width: int
    """Floats per step."""
    states: bytes = b""
    """float32 (n, S): each series' initial state (a state token's, carried by the client:
    `pack_states`); empty: every series from zeros."""


class SubmitChunk(SubmitSeries, tag="submit-chunk"):
    """One series that is a chunk of a session whose state the engine keeps
    (`Engine.chunk`, `scheduling.sessions`). Its row's results are (outputs, the session's
    steps so far as int64 (1,))."""

    session: str = ""
    start: bool = False
    """The chunk starts (or restarts) the session from zeros."""
    end: bool = False
    """The chunk ends the session (its state is freed once the chunk is computed)."""
    owner: str = ""
    """Who sends it (an API key's digest or a client address): the per-owner quota."""


class Ping(msgspec.Struct, tag="ping", array_like=True):
    """The heartbeat (`EngineClient`, every `hang_timeout_s` x `HEARTBEAT_FRACTION`): the
    engine answers `Pong` on its next loop turn; an engine whose loop stopped answers nothing."""

    seq: int


class Pong(msgspec.Struct, tag="pong", array_like=True):
    seq: int


class Cancel(msgspec.Struct, tag="cancel", array_like=True):
    id: int


class Generate(SubmitRows, tag="generate"):
    """Language models: prompts (bos first) to generate from; `options` are the
    `GenerateOptions` fields. Answered by `Tokens` frames as tokens exist (or a `Failure`)."""

    options: dict[str, Any] = {}


class StopSeq(msgspec.Struct, tag="stopseq", array_like=True):
    """One sequence of a generation is done (a stop string): free its row."""

    id: int
    index: int


class ModelState(msgspec.Struct, array_like=True):
    """One bundle version as the engine loaded it: everything an API process needs to serve
    it (it reads the tokenizer file, nothing else of the bundle, and hashes nothing)."""

    name: str
    version: int
    path: str
    state: str
    """"ready" | "failed"."""
    reason: str | None
    task: str | None
    describe: dict[str, Any]
    manifest: dict[str, Any] | None = None
    """The verified manifest (`Manifest.to_dict()`); None when the version failed."""
    max_tokens: int | None = None
    """The token limit the engine schedules this model with (settings capped by bundle)."""
    scheduling: dict[str, Any] | None = None
    """The model's effective `ModelConfig` (batcher, decode loop), as plain data."""


class LoadModel(msgspec.Struct, tag="load-model", array_like=True):
    """The model control (the supervisor): load one version (again, if its files changed)."""

    id: int
    name: str
    version: int
    path: str


class UnloadModel(msgspec.Struct, tag="unload-model", array_like=True):
    """The model control: unload one version once it finished what it admitted."""

    id: int
    name: str
    version: int


class Loaded(msgspec.Struct, tag="loaded", array_like=True):
    """The answer to `LoadModel`: the version's state (ready or failed, with the reason)."""

    id: int
    state: ModelState


class Unloaded(msgspec.Struct, tag="unloaded", array_like=True):
    """The answer to `UnloadModel`: whether everything it admitted was answered."""

    id: int
    drained: bool


class State(msgspec.Struct, tag="state", array_like=True):
    models: list[ModelState]
    options: dict[str, Any] = {}
    """The engine's effective `EngineOptions` (as plain data)."""
    process: dict[str, Any] = {}
    """What the engine process runs with (`core.process.observed()`)."""


class Array(msgspec.Struct, array_like=True):
    dtype: str
    shape: list[int]
    data: bytes


class Rows(msgspec.Struct, tag="rows", array_like=True):
    id: int
    results: list[list[Array]]
    """Per row, its result arrays (classifier: logits, attention; tagger: labels, probs)."""
    timings: list[tuple[float, float, int, int]]
    """Per row: queue seconds, compute seconds, batch size."""
    wait: float | None = None
    """The model's expected queue wait as the reply left (for early shedding upstream)."""


class Hyp(msgspec.Struct, array_like=True):
    token_ids: list[int]
    logprob: float
    score: float
    ended: bool
    attention: Array | None


class Decode(msgspec.Struct, array_like=True):
    hypotheses: list[Hyp]
    queue_s: float
    decode_s: float
    steps: int


class Decodes(msgspec.Struct, tag="decodes", array_like=True):
    id: int
    results: list[Decode]
    wait: float | None = None


class Tokens(msgspec.Struct, tag="tokens", array_like=True):
    """One engine step's news of one generation: per sequence (index, token or -1, its
    log-prob, top alternatives [(token, log-prob)], finish reason or None)."""

    id: int
    events: list[tuple[int, int, float, list[tuple[int, float]], str | None]]
    wait: float | None = None
    extras: list[tuple[int, int, float, bytes | None, int, int]] = []
    """Events that carry more (a sequence's first, a finished one with its state): (position
    in `events`, cached prompt tokens, seconds its request waited for admission, the finished
    sequence's state bytes or None, its stream key, its draws)."""


class Failure(msgspec.Struct, tag="failure", array_like=True):
    id: int
    kind: str
    """Class name of the `seqserve.service.core.errors.ServiceError` to raise (else
    InferenceFailed)."""
    message: str
    retry_after: float | None = None
    wait: float | None = None


ToEngine = (Hello | SubmitRows | SubmitScore | SubmitTranslate | SubmitSeries | SubmitChunk
            | Generate | Cancel | StopSeq | LoadModel | UnloadModel | Ping)
ToApi = State | Rows | Decodes | Failure | Tokens | Loaded | Unloaded | Pong

encoder = msgspec.msgpack.Encoder()
engine_decoder = msgspec.msgpack.Decoder(list[ToEngine])
api_decoder = msgspec.msgpack.Decoder(list[ToApi])
"""Every ZeroMQ message (after the ROUTER's identity frame) is one frame holding a list of
messages: what one process's loop turn sent the other, in order (`encoder.encode(list)`).
Measured under load: a ZeroMQ send per message cost the engine loop a fifth of its busy time
(and a frame per message would still be a pyzmq send call per frame)."""


INT32 = next(code for code in "ilh" if array.array(code).itemsize == 4)
"""The `array` type code of a native int32 (the buffers' dtype: numpy's native int32)."""


def pack_rows(rows: list[list[int]]) -> tuple[bytes, bytes]:
    """Token rows -> (lengths int32 buffer, concatenated ids int32 buffer). (`array`, not
    numpy: a third of the time for the few short rows of a request.)"""
    ids = array.array(INT32)
    for r in rows:
        ids.extend(r)
    return array.array(INT32, [len(r) for r in rows]).tobytes(), ids.tobytes()


def unpack_rows(lengths: bytes, ids: bytes) -> list[list[int]]:
    """The inverse of `pack_rows`."""
    sizes = np.frombuffer(lengths, dtype=np.int32)  # (n,)
    flat = np.frombuffer(ids, dtype=np.int32).tolist()  # (sum,)
    out, start = [], 0
    for n in sizes.tolist():
        out.append(flat[start : start + n])
        start += n
    return out


def pack_series(rows: list[np.ndarray]) -> tuple[bytes, bytes, int]:
    """Float series (T_i, D) -> (lengths int32 buffer, concatenated float32 steps, D)."""
    lengths = np.fromiter((len(r) for r in rows), dtype=np.int32, count=len(rows))  # (n,)
    width = int(rows[0].shape[1]) if rows else 0
    flat = np.concatenate(rows).astype(np.float32, copy=False) if rows else \
        np.zeros((0, 0), np.float32)
    return lengths.tobytes(), np.ascontiguousarray(flat).tobytes(), width


def unpack_series(lengths: bytes, features: bytes, width: int) -> list[np.ndarray]:
    """The inverse of `pack_series`."""
    sizes = np.frombuffer(lengths, dtype=np.int32)  # (n,)
    if width < 1 or sizes.size == 0 or (sizes < 1).any():
        raise ValueError(f"series of width {width} and lengths {sizes.tolist()[:8]}")
    flat = np.frombuffer(features, dtype=np.float32).reshape(-1, width)  # (sum, D)
    if flat.shape[0] != int(sizes.sum()):
        raise ValueError(f"{flat.shape[0]} steps for lengths summing to {int(sizes.sum())}")
    out, start = [], 0
    for n in sizes.tolist():
        out.append(flat[start : start + n])
        start += n
    return out


def pack_states(rows: list[Any]) -> tuple[list[np.ndarray], bytes]:
    """Series that may be `SessionRow`s (a series run from a given state) -> their steps and
    their initial states as float32 (n, S) bytes (zeros for a plain series; empty when no
    row has a state)."""
    given = [r for r in rows if isinstance(r, SessionRow)]
    if not given:
        return rows, b""
    zeros = np.zeros_like(given[0].state, dtype=np.float32)
    states = np.stack([r.state if isinstance(r, SessionRow) else zeros for r in rows])
    return ([r.steps if isinstance(r, SessionRow) else r for r in rows],
            np.ascontiguousarray(states, np.float32).tobytes())


def unpack_states(series: list[np.ndarray], states: bytes) -> list[Any]:
    """The inverse of `pack_states`: each series as a `SessionRow` from its state."""
    if not states:
        return series
    rows = np.frombuffer(states, dtype=np.float32).reshape(len(series), -1)  # (n, S)
    return [SessionRow(s, rows[i]) for i, s in enumerate(series)]


def to_array(a: np.ndarray) -> Array:
    a = np.ascontiguousarray(a)
    return Array(a.dtype.str, list(a.shape), a.tobytes())


def from_array(a: Array) -> np.ndarray:
    return np.frombuffer(a.data, dtype=np.dtype(a.dtype)).reshape(a.shape)


IDENTITY_PREFIX = b"api-"
"""An API process's DEALER identity is b"api-<pid>-<random hex>" (see `identity_pid`): the
engine can tell from it whether the process that holds work still runs."""


def new_identity() -> bytes:
    """This process's DEALER identity (unique per socket)."""
    return IDENTITY_PREFIX + f"{os.getpid()}-{secrets.token_hex(4)}".encode()


def identity_pid(identity: bytes) -> int | None:
    """The pid an API process's DEALER identity names (None: not one of ours)."""
    if not identity.startswith(IDENTITY_PREFIX):
        return None
    pid, _, _ = identity[len(IDENTITY_PREFIX):].partition(b"-")
    return int(pid) if pid.isdigit() else None
