"""The values behind `numbers-en-*` and `numbers-tags` phrases, and how they are drawn.

Kinds: cardinal (0..999,999, digit count uniform), ordinal (1..999,999), year (1000..2099),
currency (euros or dollars, 0..99,999 units, cents sometimes) and full date (1900..2099).
"""

from __future__ import annotations

import datetime as dt
import random

from seqserve.models.data.sampling import log_uniform_int

KINDS = ("cardinal", "ordinal", "year", "currency", "date")
KIND_WEIGHTS = (0.35, 0.15, 0.15, 0.2, 0.15)
FIRST_DAY = dt.date(1900, 1, 1).toordinal()
LAST_DAY = dt.date(2099, 12, 31).toordinal()
CURRENCIES = ("EUR", "USD")
ROUND_SHARE = 0.15
"""Share of cardinal, ordinal and amount draws rounded to tens, hundreds, thousands...:
round numbers are common, and French marks them ("trois cents" but "trois cent un")."""
SMALL_SHARE = 0.2
"""Share of cardinal draws that are 0..19 on their own (on top of the digit-uniform draw):
units and teens start most years ("nineteen eighty-seven"), so the model must see them
alone often enough not to read "thirteen" as a year."""


def draw_value(rng: random.Random, kind: str) -> tuple[int | str, object]:
    """(split key, value) of one draw of `kind`: an int for cardinal, ordinal and year;
    (units, cents, code) for currency, keyed by its units; a date keyed by its ISO form."""
    if kind == "cardinal" and rng.random() < SMALL_SHARE:
        n = rng.randint(0, 19)
        return n, n
    if kind in ("cardinal", "ordinal"):
        n = _rounded(rng, log_uniform_int(rng, 0 if kind == "cardinal" else 1, 999_999))
        return n, n
    if kind == "year":
        y = rng.randint(1000, 2099)
        return y, y
    if kind == "currency":
        units = _rounded(rng, log_uniform_int(rng, 0, 99_999))
        cents = rng.choice((0, rng.randint(1, 99))) if units else rng.randint(1, 99)
        return units, (units, cents, rng.choice(CURRENCIES))
    if kind == "date":
        day = dt.date.fromordinal(rng.randint(FIRST_DAY, LAST_DAY))
        return day.isoformat(), day
    raise ValueError(f"unknown kind {kind!r}: use one of {', '.join(KINDS)}")


def _rounded(rng: random.Random, n: int) -> int:
    """`n`, or with probability ROUND_SHARE `n` with its last 1..digits-1 digits zeroed."""
    digits = len(str(n))
    if digits < 2 or rng.random() >= ROUND_SHARE:
        return n
    k = rng.randint(1, digits - 1)
    return n - n % 10**k
