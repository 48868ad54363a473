"""`numbers-en-fr`, `numbers-en-de`: English wording -> French/German wording of one value.

Kinds: cardinal (0..999,999, digit count uniform), ordinal (1..999,999), year (1000..2099),
currency (euros or dollars, 0..99,999 units, cents sometimes) and full date (1900..2099).
Sources and targets are lowercase with commas dropped; hyphens are num2words' own, so each
side is a deterministic function of the value.
"""

from __future__ import annotations

import datetime as dt
import random

from models.data import wording
from models.data.dataset import Dataset, Example
from models.data.sampling import Draw, Drawer, fill_splits, log_uniform_int

TARGETS = ("fr", "de")
KINDS = ("cardinal", "ordinal", "year", "currency", "date")
KIND_WEIGHTS = (0.35, 0.15, 0.15, 0.2, 0.15)
EVAL_RATIO = 1 / 10
"""valid and test each hold this fraction of the train size."""
DEFAULT_SIZE = 20_000
FIRST_DAY = dt.date(1900, 1, 1).toordinal()
LAST_DAY = dt.date(2099, 12, 31).toordinal()
# (currency, language) -> (unit singular, unit plural, cent singular, cent plural, joiner)
_MONEY: dict[tuple[str, str], tuple[str, str, str, str, str]] = {
    ("EUR", "en"): ("euro", "euros", "cent", "cents", "and"),
    ("USD", "en"): ("dollar", "dollars", "cent", "cents", "and"),
    ("EUR", "fr"): ("euro", "euros", "centime", "centimes", "et"),
    ("USD", "fr"): ("dollar", "dollars", "cent", "cents", "et"),
    ("EUR", "de"): ("euro", "euro", "cent", "cent", "und"),
    ("USD", "de"): ("dollar", "dollar", "cent", "cent", "und"),
}


def _count(n: int, lang: str) -> str:
    """Cardinal used before a noun: German "eins" -> "ein" ("ein euro", "hundertein euro")."""
    words = wording.cardinal(n, lang)
    return words[:-1] if lang == "de" and words.endswith("eins") else words


def money(units: int, cents: int, code: str, lang: str) -> str:
    """An amount in words, e.g. (21, 50, "EUR", "fr") -> "vingt et un euros et cinquante
    centimes". Zero units or zero cents are left out (but never both)."""
    one, many, cent, cents_word, joiner = _MONEY[code, lang]
    parts = []
    if units or not cents:
        parts.append(f"{_count(units, lang)} {one if units == 1 else many}")
    if cents:
        parts.append(f"{_count(cents, lang)} {cent if cents == 1 else cents_word}")
    return f" {joiner} ".join(parts)


def date(day: dt.date, lang: str) -> str:
    """A full date: "the twenty-first of march two thousand and five", "le vingt et un mars
    deux mille cinq", "einundzwanzigster märz zweitausendfünf"."""
    month, year = wording.month_name(day.month, lang), wording.year(day.year, lang)
    if lang == "fr":
        return f"le {'premier' if day.day == 1 else wording.cardinal(day.day, 'fr')} {month} {year}"
    if lang == "de":
        return f"{wording.ordinal(day.day, 'de')}r {month} {year}"
    return f"the {wording.ordinal(day.day, 'en')} of {month} {year}"


def _ordinal(n: int, lang: str) -> str:
    text = wording.ordinal(n, lang)
    assert text is not None, f"num2words has ordinals for {lang}"
    return text


def _value(rng: random.Random, kind: str) -> tuple[int | str, object]:
    """(split key, value) of one draw."""
    if kind in ("cardinal", "ordinal"):
        n = log_uniform_int(rng, 0 if kind == "cardinal" else 1, 999_999)
        return n, n
    if kind == "year":
        y = rng.randint(1000, 2099)
        return y, y
    if kind == "currency":
        units = log_uniform_int(rng, 0, 99_999)
        cents = rng.choice((0, rng.randint(1, 99))) if units else rng.randint(1, 99)
        return units, (units, cents, rng.choice(("EUR", "USD")))
    day = dt.date.fromordinal(rng.randint(FIRST_DAY, LAST_DAY))
    return day.isoformat(), day


def word(kind: str, value: object, lang: str) -> str:
    """The wording of a drawn value in `lang` ("en", "fr" or "de")."""
    if kind == "cardinal":
        assert isinstance(value, int)
        return wording.cardinal(value, lang)
    if kind == "ordinal":
        assert isinstance(value, int)
        return _ordinal(value, lang)
    if kind == "year":
        assert isinstance(value, int)
        return wording.year(value, lang)
    if kind == "currency":
        assert isinstance(value, tuple)
        units, cents, code = value
        return money(units, cents, code, lang)
    assert isinstance(value, dt.date)
    return date(value, lang)


def _drawer(target: str) -> Drawer:
    def draw(rng: random.Random, group: str) -> Draw:
        kind = rng.choices(KINDS, KIND_WEIGHTS)[0]
        key, value = _value(rng, kind)

        def make() -> Example:
            source, text = word(kind, value, "en"), word(kind, value, target)
            return {"source": source, "target": text, "kind": kind}

        return Draw(key, make)

    return draw


def generate(target: str, size: int = DEFAULT_SIZE, seed: int = 0, values: bool = False) -> Dataset:
    """English -> `target` ("fr" or "de") number wording, `size` training pairs.

    Examples are {"source", "target", "kind"}; with `values` also "value" (the underlying
    number, units of an amount, or ISO date)."""
    if target not in TARGETS:
        raise ValueError(f"target must be one of {TARGETS}, got {target!r}")
    per_eval = max(1, round(size * EVAL_RATIO))
    quotas = {"train": max(1, size), "valid": per_eval, "test": per_eval}
    splits = fill_splits(_drawer(target), [""], quotas, seed, ("source", "target"), values)
    return Dataset(f"numbers-en-{target}", "translation", splits, [], seed, size)
