"""HTTP details of the seqserve API as the load tool sees them: bodies and headers."""

from __future__ import annotations

import math
from email.utils import parsedate_to_datetime
from typing import Any

SHED_STATUSES = frozenset({429, 503})
"""Statuses that mean "overloaded, come back later" (load shedding), not a failure."""


def build_payload(task: str, texts: list[str], beam_size: int) -> dict[str, Any]:
    """The JSON body of one request."""
    if task == "translate":
        return {"texts": texts, "beam_size": beam_size}
    return {"texts": texts}


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
    """Tokens the server generated for one translate response (0 when it does not say).

    Reads `results` (or `translations`) items: `tokens`/`token_ids` lists or counts, or the
    best of an n-best list.
    """
    if not isinstance(body, dict):
        return 0
    items = body.get("results")
    if items is None:
        items = body.get("translations")
    if not isinstance(items, list):
        return _tokens_of(body)
    return sum(_tokens_of(item) for item in items)
