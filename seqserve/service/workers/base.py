"""What every worker shares: the one input contract, the per-request context, one wait.

A worker serves one loaded bundle version of one task: texts in, plain data out (no FastAPI,
no pydantic). It turns texts into token rows with `encode_texts` (every task and protocol
goes through it), submits them to its scheduled model (`seqserve.service.scheduling.models`) and
waits with `RequestContext.wait`, which enforces the request's deadline and drops the work of a
client
that left.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar, Generic, Protocol, TypeVar

from seqserve.export.manifest import Manifest
from seqserve.models.text.tokenizer import Piece
from seqserve.models.text.tokenizer_files import TextTokenizer, TokenizerFailed
from seqserve.service.core.errors import (
    BadRequest,
    ClientGone,
    DeadlineExceeded,
    TextNotTokenizable,
    TextUnreadable,
)
from seqserve.service.scheduling.base import Timing
from seqserve.service.scheduling.models import DecodeModel, RowModel

log = logging.getLogger("seqserve.workers")


@dataclass(frozen=True)
class TextLimits:
    """The input limits of one model (the server's settings, capped by the bundle)."""

    max_texts: int
    """Most texts in one request."""
    max_chars: int
    """Most characters in one text."""
    max_tokens: int
    """Most tokens in one text."""
    truncate: bool
    """Over `max_tokens`: cut (and say so) instead of refusing."""
    max_unknown_fraction: float | None = None
    """A text whose share of unknown tokens is above this is refused (422; None: never)."""


@dataclass(frozen=True)
class Encoded:
    """One text after tokenization and the token limit."""

    ids: list[int]
    pieces: list[Piece] | None
    """Pieces with character offsets (only when asked for: 10x slower than ids alone)."""
    truncated: bool
    unknown: float = 0.0
    """The share of `ids` that carry text and are the tokenizer's unknown token (characters or
    words it never saw; `unknown_share`): answers carry it as `unknown_fraction`."""


BLANK = ("\\x01-\\x20\\x7f\\x8f\\x9f\\xa0\\u061c\\u1680\\u2000-\\u200c\\u200e\\u200f\\u2028\\u2029"
         "\\u202f\\u205f\\u2581\\u3000\\ufeff\\ufffd")
"""Characters every tokenizer here drops (as a regex class body): control characters,
whitespace and the few format characters SentencePiece's normalisation removes. A model's own
set (`Tokenizer.blank_characters`) may add more (punctuation, for the number models)."""


def text_pattern(blank: str = BLANK) -> str:
    """What a text must match for a tokenizer that drops the `blank` characters (a regex
    class body): no NUL and at least one character it keeps. The same text is a Python and an
    ECMA regex, so the OpenAPI document declares exactly the rule the server checks."""
    return f"^[^\\x00]*[^\\x00{blank}][^\\x00]*$"


def _kept(tok: TextTokenizer) -> re.Pattern[str]:
    """Matches a character `tok` keeps (one that can make a token)."""
    return _kept_pattern(tok.blank_characters())


@functools.lru_cache(maxsize=64)
def _kept_pattern(blank: str) -> re.Pattern[str]:
    """(Cached by the characters, not the tokenizer: a cache of tokenizers would keep every
    unloaded model version's tokenizer alive.)"""
    return re.compile(f"[^\\x00{blank}]")


def check_characters(text: str, where: str, max_chars: int, param: str | None = None) -> None:
    """A text no tokenizer should read is a 400 naming `where` (and `param`): over
    `max_chars`, NUL (which C APIs read as the end of the text) and lone surrogates
    ("\\ud800", which JSON can carry and SentencePiece fails on). Every text a tokenizer
    reads passes here: the texts of the one input contract (`check_text`) and a language
    model's /tokenize (which takes any other text, empty included, as vLLM does)."""
    if len(text) > max_chars:
        raise BadRequest(f"{where} has {len(text)} characters > max_chars {max_chars}",
                         param=param)
    if "\x00" in text:
        raise BadRequest(f"{where} contains a NUL character (U+0000)", param=param)
    if text.isascii():
        return
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise BadRequest(f"{where} is not valid Unicode ({exc.reason})", param=param) from exc


def check_text(text: str, i: int, tok: TextTokenizer, max_chars: int) -> None:
    """Text no tokenizer should see is a 400: the length and characters of
    `check_characters` and text with nothing the tokenizer keeps (empty, whitespace or
    control characters only, and punctuation only for a tokenizer that drops punctuation:
    it has no tokens)."""
    check_characters(text, f"texts[{i}]", max_chars)
    if _kept(tok).search(text) is None:
        raise BadRequest(f"texts[{i}] is empty (nothing this model's tokenizer keeps, so no "
                         "tokens)")


Encode = Callable[[str, bool], tuple[list[int], list[Piece] | None]]
"""A text's ids, and with offsets (True) its pieces: a tokenizer's reading other than its
plain `encode` (a language model's special-token strings: `lm_text.encode`)."""


def encode_texts(tok: TextTokenizer, texts: list[str], limits: TextLimits,
                 offsets: bool = False, encode: Encode | None = None) -> list[Encoded]:
    """The one input contract: texts -> token rows under `limits`, or BadRequest naming the
    text and the limit (count, type, Unicode, NUL, characters, empty, tokens); `encode`: how
    a text becomes ids (default: the tokenizer's own)."""
    if not texts:
        raise BadRequest("no texts: send at least one")
    if len(texts) > limits.max_texts:
        raise BadRequest(f"too many texts: {len(texts)} > max_texts {limits.max_texts}")
    return [_encode(tok, text, i, limits, offsets, encode) for i, text in enumerate(texts)]


def _encode(tok: TextTokenizer, text: str, i: int, limits: TextLimits, offsets: bool,
            encode: Encode | None) -> Encoded:
    if not isinstance(text, str):
        raise BadRequest(f"texts[{i}] must be a string, got {type(text).__name__}")
    check_text(text, i, tok, limits.max_chars)
    try:
        if encode is not None:
            ids, pieces = encode(text, offsets)
        else:
            pieces = tok.encode_with_offsets(text) if offsets else None
            ids = [p.id for p in pieces] if pieces is not None else tok.encode(text)
    except TokenizerFailed as exc:  # e.g. a regex of a tokenizer.json over its limit
        log.warning("the tokenizer failed on texts[%d] (%d characters): %s", i, len(text), exc)
        raise TextNotTokenizable(f"texts[{i}]: this model's tokenizer could not process the "
                                 f"text ({exc})") from exc
    if not ids:
        raise BadRequest(f"texts[{i}] is empty (no tokens)")
    truncated = len(ids) > limits.max_tokens
    if truncated and not limits.truncate:
        raise BadRequest(f"texts[{i}] has {len(ids)} tokens > max_tokens {limits.max_tokens} "
                         "(the server is set to reject, not truncate)")
    kept = pieces[: limits.max_tokens] if pieces is not None else None
    ids = ids[: limits.max_tokens]
    unknown = unknown_share(tok, ids)
    if limits.max_unknown_fraction is not None and unknown > limits.max_unknown_fraction:
        raise TextUnreadable(f"texts[{i}]: {unknown:.0%} of its tokens that carry text are "
                             "unknown to this model's tokenizer (over max_unknown_fraction "
                             f"{limits.max_unknown_fraction:g}): the model cannot read it")
    return Encoded(ids, kept, truncated, unknown)


WORD_MARK = "\u2581"
"""SentencePiece's word-boundary mark: a piece of marks and whitespace alone carries no
character of the text."""


def unknown_share(tok: TextTokenizer, ids: list[int]) -> float:
    """The share of the tokens that carry text which are the unknown token. A piece of
    word-boundary marks alone does not count: SentencePiece writes a run of characters it
    never saw as one unknown token after a bare "▁", so 2,000 emoji were 2 tokens, half
    of them "known" (0.5); they are 1.0 now. Only texts with an unknown token look at their
    pieces."""
    unk = tok.unk_id
    if unk < 0:
        return 0.0
    unknown = ids.count(unk)
    if not unknown:
        return 0.0
    carrying = unknown + sum(1 for i in ids if i != unk
                             and tok.id_to_piece(i).replace(WORD_MARK, "").strip())
    return unknown / carrying


class HasTiming(Protocol):
    @property
    def timing(self) -> Timing: ...


T = TypeVar("T", bound=HasTiming)


@dataclass
class RequestContext:
    """One request's deadline, disconnect signal and where its time went."""

    deadline: float
    """time.monotonic() at which the request gives up (504)."""
    queue_s: float = 0.0
    compute_s: float = 0.0
    computed: bool = False
    """True once a result arrived (its queue and compute time are then known)."""
    batch_rows: int = 0
    """Rows in the largest batch its rows ran in (0: none, or a translation)."""
    decode_steps: int = 0
    """Decoder steps its longest source took part in (translations; else 0)."""
    gone: asyncio.Future[Any] | None = None
    """Done when the client went away (the request's disconnect watcher, which also sets
    `disconnected`); None: `wait` watches `disconnected` itself."""
    caller: Any = None
    """The transport's view of the request (the lifecycle's `Call`): whose it is, read only
    when needed (`owner`)."""

    @property
    def owner(self) -> str:
        """Who sent it: its API key's digest, else its client address (session quotas)."""
        return str(getattr(self.caller, "owner", ""))

    _disconnected: asyncio.Event | None = field(default=None, repr=False)

    @property
    def disconnected(self) -> asyncio.Event:
        """Set when the client went away; its queued work is then dropped. (Made when first
        asked for: most requests never need it, and an Event per request was 4% of the API
        process's time under load.)"""
        if self._disconnected is None:
            self._disconnected = asyncio.Event()
        return self._disconnected

    def remaining(self) -> float:
        return self.deadline - time.monotonic()

    def client_left(self, _: object = None) -> None:
        """The client is gone (a done callback of `gone`): set `disconnected`."""
        self.disconnected.set()

    def record(self, timing: Timing) -> None:
        """Keep a result's queue and compute time (the longest of the request's rows);
        `wait` then raises the queue time to the wait the client saw, less the compute."""
        self.queue_s = max(self.queue_s, timing.queue_s)
        self.compute_s = max(self.compute_s, timing.compute_s)
        self.batch_rows = max(self.batch_rows, timing.batch_rows)
        self.decode_steps = max(self.decode_steps, timing.decoder_steps)
        self.computed = True

    def watch(self, futures: list[asyncio.Future[T]],
              settled: Callable[[list[T] | None, BaseException | None], None]) -> Watch:
        """Call `settled(results, None)` once every future is done, or `settled(None, error)`
        on the first failure, the deadline (DeadlineExceeded) or the client's leaving
        (ClientGone); the rest are then cancelled (the schedulers drop cancelled work before it
        costs compute). The first future to fail (in the order they finish) fails the request
        with its exception, as `asyncio.gather` would. A request whose front answers from
        callbacks (`api.lifecycle.begin`) is watched so, without a task; `wait` is the same
        watch, awaited.

        One watch, one timer and a callback per future (measured: `asyncio.gather` +
        `asyncio.wait` + a task on the disconnect event were a tenth of the API process's
        time per request)."""
        return Watch(self, futures, settled)

    async def wait(self, futures: list[asyncio.Future[T]]) -> list[T]:
        """Await every future (`watch`): their results, or the watch's error raised."""
        waiter: asyncio.Future[list[T]] = asyncio.get_running_loop().create_future()

        def settled(results: list[T] | None, error: BaseException | None) -> None:
            if waiter.done():
                return
            if isinstance(error, asyncio.CancelledError):
                waiter.cancel()
            elif error is not None:
                waiter.set_exception(error)
            else:
                waiter.set_result(results or [])

        watch = self.watch(futures, settled)
        try:
            return await waiter
        finally:
            watch.cancel()  # (a no-op once settled; else the awaiting task was cancelled)


class Watch(Generic[T]):
    """`RequestContext.watch`: one request's futures against its deadline and its client."""

    __slots__ = ("context", "futures", "settled", "left", "failed", "timer", "gone", "own_gone",
                 "began", "over")

    def __init__(self, context: RequestContext, futures: list[asyncio.Future[T]],
                 settled: Callable[[list[T] | None, BaseException | None], None]) -> None:
        loop = asyncio.get_running_loop()
        self.context, self.futures, self.settled = context, futures, settled
        self.began = time.monotonic()
        self.left = len(futures)
        self.failed: asyncio.Future[Any] | None = None
        self.over = False
        for f in futures:
            f.add_done_callback(self._row_done)
        gone = context.gone
        self.own_gone = gone is None
        if gone is None:
            gone = asyncio.ensure_future(context.disconnected.wait())
        self.gone: asyncio.Future[Any] = gone
        gone.add_done_callback(self._wake)
        self.timer = loop.call_later(max(context.remaining(), 0.0), self._wake)
        if not futures:
            loop.call_soon(self._wake)

    def _row_done(self, f: asyncio.Future[Any]) -> None:
        self.left -= 1
        if self.failed is None and (f.cancelled() or f.exception() is not None):
            self.failed = f
        elif not f.cancelled():
            f.exception()  # retrieved: a late failure is never reported as unseen
        if self.left <= 0 or self.failed is not None:
            self._wake()

    def _wake(self, _: object = None) -> None:
        if self.over:
            return
        results: list[T] | None = None
        error: BaseException | None = None
        failed = self.failed
        if failed is not None:
            error = None if failed.cancelled() else failed.exception()
            error = error if error is not None else asyncio.CancelledError()
        elif self.left <= 0:
            context = self.context
            results = [f.result() for f in self.futures]
            for r in results:
                context.record(r.timing)
            # the wait the client saw: all but the compute (an engine process that stalled
            # or a slow hand-back counts, where its own queue report did not)
            context.queue_s = max(context.queue_s,
                                  time.monotonic() - self.began - context.compute_s)
        elif self.gone.done():
            error = ClientGone("client disconnected")
        else:
            error = DeadlineExceeded("request deadline passed; its work was dropped")
        self.cancel()
        self.settled(results, error)

    def cancel(self) -> None:
        """Stop watching (once): the timer, the disconnect callback, and the futures not
        done (queued rows are dropped, live ones freed)."""
        if self.over:
            return
        self.over = True
        self.timer.cancel()
        self.gone.remove_done_callback(self._wake)
        if self.own_gone:
            self.gone.cancel()
        for f in self.futures:
            f.cancel()  # no-op when done


Begun = tuple[list[asyncio.Future[Any]], Callable[[list[Any]], list[dict[str, Any]]]]
"""A request's work once submitted (`begin_*` of a worker): its futures, and what makes its
results of theirs (`settle` awaits them; `api.lifecycle.begin` watches them)."""


async def settle(begun: Begun, call: RequestContext) -> list[dict[str, Any]]:
    """The results of work begun (`Begun`), awaited with the request's deadline and client."""
    futures, finish = begun
    return finish(await call.wait(futures))


M = TypeVar("M", RowModel, DecodeModel)


@dataclass
class WorkerContext(Generic[M]):
    """Everything a worker is built from."""

    name: str
    version: int
    manifest: Manifest
    tokenizer: TextTokenizer
    """The (source side's) tokenizer: SentencePiece or tokenizer.json."""
    limits: TextLimits
    model: M
    """The scheduled model: its `submit` takes token rows (and search options)."""
    target_tokenizer: TextTokenizer | None = None
    """Translators with separate vocabularies: the target side's tokenizer (None: joint)."""
    max_new_tokens: int = 0
    """Language models: the server's limit of new tokens per sequence."""

    @property
    def target(self) -> TextTokenizer:
        """The tokenizer that turns generated ids into text."""
        return self.target_tokenizer or self.tokenizer


class ModelWorker(Protocol):
    """A served model version: its task's methods plus a description."""

    task: ClassVar[str]

    @property
    def ctx(self) -> Any:
        """Its context: a `WorkerContext` (text tasks) or a `workers.series.SeriesContext`."""
        ...

    def describe(self) -> dict[str, Any]:
        """Task-specific facts for GET /v1/models/{name} (labels, limits, runtime)."""
        ...


def describe_common(ctx: WorkerContext[Any]) -> dict[str, Any]:
    """What every task's description holds: limits, runtime, providers, metrics, created."""
    m, model = ctx.manifest, ctx.model.describe()
    limits = {"max_tokens": ctx.limits.max_tokens, **model.pop("limits", {}),
              "bundle": dict(m.limits)}
    return {"limits": limits, **model, "metrics": dict(m.source_run.get("test_metrics") or {}),
            "created": m.created}
