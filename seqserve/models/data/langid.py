"""`langid`: which language is a short number, amount or date written in?

Sixteen languages, including the confusable groups es/pt/ca/it, da/no/sv, cs/sk and ru/uk.
Texts are cardinals, ordinals, years, currency amounts, dates, and pairs of two of these (for
longer texts, up to ~25 words). Classes are balanced per split; texts that two languages
write identically are left out.
"""

from __future__ import annotations

import datetime as dt
import random

from seqserve.models.data import wording
from seqserve.models.data.dataset import Dataset, Example
from seqserve.models.data.sampling import Draw, Drawer, fill_splits, log_uniform_int, split_for

LANGUAGES = (
    "ca", "cs", "da", "de", "en", "es", "fr", "it",
    "nl", "no", "pl", "pt", "ru", "sk", "sv", "uk",
)  # fmt: skip
"""num2words language codes; these are also the labels."""
CURRENCIES: dict[str, tuple[str, ...]] = {
    "ca": ("EUR", "USD"), "cs": ("CZK", "EUR"), "da": ("DKK", "EUR"), "de": ("EUR", "CHF"),
    "en": ("USD", "GBP", "EUR"), "es": ("EUR", "USD"), "fr": ("EUR", "CHF"), "it": ("EUR",),
    "nl": ("EUR", "USD"), "no": ("NOK", "EUR"), "pl": ("PLN", "EUR"), "pt": ("EUR", "BRL"),
    "ru": ("RUB", "USD"), "sk": ("EUR", "CZK"), "sv": ("SEK", "EUR"), "uk": ("UAH", "USD"),
}  # fmt: skip
"""Currencies an amount is drawn in, per language."""
KINDS = ("cardinal", "ordinal", "year", "currency", "date", "pair")
KIND_WEIGHTS = (0.28, 0.14, 0.14, 0.2, 0.14, 0.1)
EVAL_RATIO = 1 / 15
"""valid and test each hold this fraction of the train size."""
DEFAULT_SIZE = 30_000
FIRST_DAY = dt.date(1900, 1, 1).toordinal()
LAST_DAY = dt.date(2099, 12, 31).toordinal()


def _word(rng: random.Random, lang: str, kind: str) -> tuple[int | str, str]:
    """(split key, text) of one value of `kind` worded in `lang`. Not "pair"."""
    if kind == "ordinal":
        n = log_uniform_int(rng, 1, 99_999)
        text = wording.ordinal(n, lang)
        return n, text if text is not None else wording.cardinal(n, lang)
    if kind == "year":
        y = rng.randint(1000, 2099)
        return y, wording.year(y, lang)
    if kind == "currency":
        units = log_uniform_int(rng, 1, 99_999)
        cents = rng.choice((0, rng.randint(1, 99)))
        code = rng.choice(CURRENCIES[lang])
        return units, wording.currency(units, cents, code, lang)
    if kind == "date":
        day = dt.date.fromordinal(rng.randint(FIRST_DAY, LAST_DAY))
        return day.isoformat(), wording.date_words(day, lang)
    n = log_uniform_int(rng, 0, 999_999)
    return n, wording.cardinal(n, lang)


def _drawer(seed: int) -> Drawer:
    def draw(rng: random.Random, lang: str) -> Draw:
        kind = rng.choices(KINDS, KIND_WEIGHTS)[0]
        if kind != "pair":
            key, text = _word(rng, lang, kind)
            return Draw(key, lambda: {"text": text, "label": lang, "kind": kind})
        first_kind, second_kind = rng.sample(KINDS[:-1], 2)
        key, first = _word(rng, lang, first_kind)
        return Draw(key, lambda: _pair(rng, lang, seed, key, first, second_kind))

    return draw


def _pair(
    rng: random.Random, lang: str, seed: int, key: int | str, first: str, kind: str
) -> Example:
    """Two values joined, e.g. a date and an amount. The pair lives in the first value's
    split, so the second value is redrawn until it lies in that split too."""
    split = split_for(key, seed)
    for _ in range(100):
        other, second = _word(rng, lang, kind)
        if split_for(other, seed) == split:
            text = f"{first}, {second}"
            return {"text": text, "label": lang, "kind": "pair", "value": f"{key}|{other}"}
    return {"text": first, "label": lang, "kind": "pair", "value": str(key)}


def generate(size: int = DEFAULT_SIZE, seed: int = 0, values: bool = False) -> Dataset:
    """The langid dataset: `size` training texts in total, balanced over LANGUAGES.

    Examples are {"text", "label", "kind"}; with `values` also "value" (the underlying
    number or ISO date, for checks and analysis)."""
    per_train = max(1, round(size / len(LANGUAGES)))
    per_eval = max(1, round(size * EVAL_RATIO / len(LANGUAGES)))
    quotas = {"train": per_train, "valid": per_eval, "test": per_eval}
    splits = fill_splits(_drawer(seed), list(LANGUAGES), quotas, seed, ("text", "label"), values)
    return Dataset("langid", "classification", splits, sorted(LANGUAGES), seed, size)
