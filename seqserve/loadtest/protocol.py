"""HTTP details of the seqserve API as the load tool sees them: bodies and headers."""

from __future__ import annotations

import json
import math
import random
from collections.abc import Callable
from email.utils import parsedate_to_datetime
from typing import Any

SHED_STATUSES = frozenset({429, 503})
"""Statuses that mean "overloaded, come back later" (load shedding), not a failure."""


def build_payload(task: str, texts: list[str], beam_size: int, *, max_new_tokens: int = 32,
                  temperature: float = 1.0, stream: bool = False) -> dict[str, Any]:
    """The JSON body of one request."""
    if task == "translate":
        return {"texts": texts, "beam_size": beam_size}
    if task == "generate":
        prompt: dict[str, Any] = {"prompt": texts[0]} if len(texts) == 1 else {"prompts": texts}
        return {**prompt, "max_new_tokens": max_new_tokens, "temperature": temperature,
                "stream": stream}
    return {"texts": texts}


def series_payload(rng: random.Random, steps: int, features: int, series: int = 1
                   ) -> dict[str, Any]:
    """A predict body of `series` random series (standard normal values)."""
    return {"series": [[[rng.gauss(0.0, 1.0) for _ in range(features)] for _ in range(steps)]
                       for _ in range(series)]}


def chunk_sizes(steps: int, chunks: int) -> list[int]:
    """`steps` split into `chunks` near-equal chunk lengths (each >= 1)."""
    base, extra = divmod(steps, chunks)
    return [base + (1 if i < extra else 0) for i in range(chunks)]


def parse_server_timing(header: str | None) -> dict[str, float]:
    """`queue;dur=1.5, compute;dur=3` -> {"queue": 1.5, "compute": 3.0} (milliseconds).

    Metrics without a numeric `dur` are skipped; a malformed header gives what could be read.
    """
    out: dict[str, float] = {}
    if not header:
        return out
    for metric in header.split(","):
        name, *params = (part.strip() for part in metric.split(";"))
        for param in params:
            key, _, value = param.partition("=")
            if key.strip().lower() != "dur" or not name:
                continue
            try:
                dur = float(value.strip().strip('"'))
            except ValueError:
                continue
            if math.isfinite(dur):
                out[name] = dur
    return out


def parse_retry_after(value: str | None, now_epoch: float | None = None) -> float | None:
    """Retry-After as seconds: delta-seconds (fractions accepted) or an HTTP date."""
    if value is None or not value.strip():
        return None
    text = value.strip()
    try:
        seconds = float(text)
    except ValueError:
        try:
            when = parsedate_to_datetime(text)
        except (TypeError, ValueError):
            return None
        if now_epoch is None:
            import time

            now_epoch = time.time()
        seconds = when.timestamp() - now_epoch
    if not math.isfinite(seconds):
        return None
    return max(0.0, seconds)


def _tokens_of(item: Any) -> int:
    """Generated tokens of one translate result item."""
    if not isinstance(item, dict):
        return 0
    for key in ("tokens", "token_ids", "ids", "output_ids"):
        value = item.get(key)
        if isinstance(value, list):
            return len(value)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    for key in ("num_tokens", "generated_tokens", "length"):
        value = item.get(key)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    hypotheses = item.get("hypotheses") or item.get("nbest")
    if isinstance(hypotheses, list) and hypotheses:
        return _tokens_of(hypotheses[0])
    return 0


def count_generated_tokens(body: Any) -> int:
    """Tokens the server generated for one translate or generate response (0 when it does
    not say).

    Reads `usage.completion_tokens` (generate), else `results` (or `translations`) items:
    `tokens`/`token_ids` lists or counts, or the best of an n-best list.
    """
    if not isinstance(body, dict):
        return 0
    usage = body.get("usage")
    if isinstance(usage, dict) and isinstance(usage.get("completion_tokens"), int):
        return int(usage["completion_tokens"])  # generate (and OpenAI-style) answers
    items = body.get("results")
    if items is None:
        items = body.get("translations")
    if not isinstance(items, list):
        return _tokens_of(body)
    return sum(_tokens_of(item) for item in items)


class SSEParser:
    """Server-sent events from a byte stream fed in pieces: `feed` returns the events that
    completed, as (event name or None, data text); comment lines are skipped."""

    def __init__(self) -> None:
        self._buf = b""

    def feed(self, data: bytes) -> list[tuple[str | None, str]]:
        self._buf += data.replace(b"\r\n", b"\n")
        out: list[tuple[str | None, str]] = []
        while b"\n\n" in self._buf:
            block, self._buf = self._buf.split(b"\n\n", 1)
            name: str | None = None
            lines: list[str] = []
            for line in block.decode("utf-8", "replace").split("\n"):
                field, _, value = line.partition(":")
                value = value[1:] if value.startswith(" ") else value
                if field == "event":
                    name = value
                elif field == "data":
                    lines.append(value)
            if lines:
                out.append((name, "\n".join(lines)))
        return out


class TokenWatch:
    """Times the tokens of one streamed generate answer as its bytes arrive.

    Every `data: {"prompt_index", "index", "text"}` event is a token of sequence (prompt_index,
    index): the first one of the request sets the time to first token, each later one of the
    same sequence adds an inter-token gap. `{"usage": ...}` gives the generated-token count,
    `[DONE]` closes the answer, and an `event: error` marks a failure after the 200."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._sse = SSEParser()
        self._last: dict[tuple[int, int], float] = {}
        self.first_token_s: float | None = None
        self.gaps_s: list[float] = []
        self.token_events = 0
        self.tokens: int | None = None
        self.done = False
        self.error: str | None = None

    def feed(self, data: bytes) -> None:
        now = self._clock()
        for name, text in self._sse.feed(data):
            if name == "error":
                self.error = text
                continue
            if text == "[DONE]":
                self.done = True
                continue
            try:
                event = json.loads(text)
            except ValueError:
                self.error = f"not JSON: {text[:80]}"
                continue
            if not isinstance(event, dict):
                continue
            if "text" in event:
                key = (int(event.get("prompt_index", 0)), int(event.get("index", 0)))
                self.token_events += 1
                if self.first_token_s is None:
                    self.first_token_s = now
                if key in self._last:
                    self.gaps_s.append(now - self._last[key])
                self._last[key] = now
            elif isinstance(event.get("usage"), dict):
                self.tokens = count_generated_tokens(event)
