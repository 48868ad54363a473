"""A generation as values: what a request asks (`GenerateOptions`), what each update tells
(`TokenEvent`), and the caller's view of one generation (`TokenStream`), fed by the in-process
loop (`scheduling.lm`) or by the engine client alike."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

FINISH_EOS, FINISH_LENGTH, FINISH_STOP = "eos", "length", "stop"


@dataclass(frozen=True)
class GenerateOptions:
    """How one request samples (the HTTP schema checked every value)."""

    max_new_tokens: int = 64
    temperature: float = 1.0
    """0 = greedy (argmax)."""
    top_k: int = 0
    """Sample among the k most likely tokens (0 = off)."""
    top_p: float = 1.0
    """Nucleus: the smallest set of tokens whose probability reaches p (1 = off)."""
    seed: int | None = None
    """Seeds sequence i of the request with (seed, i): reproducible; None = random."""
    n: int = 1
    """Sequences per prompt."""
    top_logprobs: int = 0
    """Alternatives (token, log-prob) returned with every token (0 = none)."""
    presence_penalty: float = 0.0
    """Subtracted from the logit of every token the sequence already generated (OpenAI's)."""
    frequency_penalty: float = 0.0
    """Subtracted from the logit of each token the sequence already generated, times the
    number of times it did (OpenAI's)."""
    logit_bias: tuple[tuple[int, float], ...] = ()
    """(token id, bias) pairs added to the logits before every draw (OpenAI's)."""
    ignore_eos: bool = False
    """eos is never drawn: the sequence runs to max_new_tokens (or a stop string)."""
    return_state: bool = False
    """Each finish event carries the sequence's state (`TokenEvent.state`)."""
    resume: tuple[bytes, int, int, int] | None = None
    """Continue a sequence (one prompt, n = 1): its flat state (float32 bytes), the pending
    token (drawn, not fed yet), its random stream's key and draws so far. The prompt row is
    then the new tokens after the pending one (no bos; empty: generation goes on)."""
    cache_scope: str = ""
    """The prefix cache's partition (the API key's): hits only among the same scope."""

    def __post_init__(self) -> None:
        # what travelled as plain data (the engine's frames: lists) back to pairs
        if self.logit_bias and not isinstance(self.logit_bias[0], tuple):
            object.__setattr__(self, "logit_bias",
                               tuple((int(t), float(b)) for t, b in self.logit_bias))
        if self.resume is not None and not isinstance(self.resume, tuple):
            object.__setattr__(self, "resume", tuple(self.resume))

    @property
    def tuned(self) -> bool:
        """Whether the draw changes the model's distribution beyond temperature and cuts
        (penalties, biases, eos masked)."""
        return bool(self.presence_penalty or self.frequency_penalty or self.logit_bias
                    or self.ignore_eos)


@dataclass(slots=True)
class TokenEvent:
    """One sequence's news from one update: a token (or none), and whether it finished.
    (Not frozen: a frozen dataclass's __init__ costs twice as much, and one is made for every
    token; nothing changes an event once made.)"""

    index: int
    """Sequence index in the request: prompt_index * n + sample index."""
    token: int | None
    """The drawn token (eos included), None when the sequence only finished."""
    logprob: float = 0.0
    """The token's log-probability under the model (before temperature and truncation)."""
    top: tuple[tuple[int, float], ...] = ()
    finish: str | None = None
    """"eos" | "length" | "stop" when the sequence ended with this event."""
    cached: int = 0
    """A sequence's first event: prompt tokens a cached prefix saved (`prefix_cache`)."""
    queued: float = 0.0
    """A sequence's first event: seconds its request waited for admission (in this process
    or in the engine's: its frames carry it, `engine.protocol.Tokens.extras`)."""
    state: tuple[bytes, int, int] | None = None
    """A finish event of a request with `return_state`: the sequence's flat state before its
    last token (float32 bytes; the token is this event's), its stream's key and draws."""


Sink = Callable[[list[TokenEvent] | BaseException], None]
"""Receives each update's events of one request, or the error that ended it."""


class TokenStream:
    """One generation request as its caller sees it: `async for events in stream` (each
    update's TokenEvents; the updates queued while the caller was busy, together),
    `stop(index)` for a sequence that hit a stop string, `cancel()`
    when the caller leaves, `interrupt(error)` to end the caller's iteration with `error`
    (its deadline, a hang-up) without closing the stream (the caller then cancels it). Fed
    by the in-process loop or by the engine client: one deque and at most one waiter future
    per wait (no asyncio.Queue: this is per token)."""

    def __init__(self, sequences: int, on_cancel: Callable[[], None],
                 on_stop: Callable[[int], None]) -> None:
        self.sequences = sequences
        self._items: deque[list[TokenEvent] | BaseException | _Interrupt] = deque()
        self._waiter: asyncio.Future[None] | None = None
        self._on_cancel, self._on_stop = on_cancel, on_stop
        self._open = sequences
        self.closed = False

    def _push(self, item: list[TokenEvent] | BaseException | _Interrupt) -> None:
        self._items.append(item)
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def put(self, item: list[TokenEvent] | BaseException) -> None:
        if not self.closed:
            self._push(item)

    def interrupt(self, error: BaseException) -> None:
        self._push(_Interrupt(error))

    def stop(self, index: int) -> None:
        self._open -= 1
        self._on_stop(index)
        self._push([])  # wakes the reader, which may now be done

    def cancel(self) -> None:
        if not self.closed:
            self.closed = True
            self._on_cancel()

    async def __aiter__(self) -> AsyncIterator[list[TokenEvent]]:
        items = self._items
        while self._open > 0:
            if not items:
                self._waiter = asyncio.get_running_loop().create_future()
                try:
                    await self._waiter
                finally:
                    self._waiter = None
                continue
            item = items.popleft()
            if isinstance(item, _Interrupt):
                raise item.error
            if isinstance(item, BaseException):
                self.closed = True
                raise item
            while items and isinstance(items[0], list):  # queued updates go together
                item = item + items.popleft()  # type: ignore[operator]
            self._open -= sum(1 for e in item if e.finish is not None)
            if item:
                yield item
        self.closed = True


@dataclass(frozen=True)
class _Interrupt:
    error: BaseException
