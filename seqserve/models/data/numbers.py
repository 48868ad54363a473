"""`numbers-en-fr`, `numbers-en-de`: English wording -> French/German wording of one value.

Kinds (models/data/values.py): cardinal (0..999,999, digit count uniform), ordinal
(1..999,999), year (1000..2099), currency (euros or dollars, 0..99,999 units, cents
sometimes) and full date (1900..2099). Sources are English as people write it, in the surface
forms of models/data/surface.py (commas or not, "and" or not, hyphens or spaces, "a hundred",
case, punctuation, spacing); targets are lowercase with commas dropped and num2words' hyphens,
a deterministic function of the value. The dataset asks for the `nmt_nfkc_cf_punct` tokenizer
normalization (punctuation and case carry no meaning here).
"""

from __future__ import annotations

import datetime as dt
import random

from seqserve.models.data import surface, wording
from seqserve.models.data.dataset import Dataset, Example
from seqserve.models.data.sampling import Draw, Drawer, fill_splits, split_for, split_quotas
from seqserve.models.data.values import KIND_WEIGHTS, KINDS
from seqserve.models.text.normalization import PUNCT_AS_SPACE

__all__ = ["KINDS", "KIND_WEIGHTS", "generate", "word"]
TARGETS = ("fr", "de")
EVAL_RATIO = 1 / 10
"""valid and test each hold this fraction of the train size (spread over the forms)."""
DEFAULT_SIZE = 20_000
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


def _drawer(target: str, seed: int) -> Drawer:
    def in_train(key: int | str) -> bool:
        return split_for(key, seed) == "train"

    def draw(rng: random.Random, form: str) -> Draw:
        phrase = surface.draw(rng, form, in_train)
        return Draw(phrase.key, lambda: example(phrase, target))

    return draw


def example(phrase: surface.Phrase, target: str) -> Example:
    """The translation example of a drawn English phrase."""
    return {"source": phrase.text, "target": word(phrase.kind, phrase.value, target),
            "kind": phrase.kind, "form": phrase.form}


def generate(target: str, size: int = DEFAULT_SIZE, seed: int = 0, values: bool = False) -> Dataset:
    """English -> `target` ("fr" or "de") number wording, about `size` training pairs.

    Examples are {"source", "target", "kind", "form"}; with `values` also "value" (the
    underlying number, units of an amount, or ISO date). Every form of surface.FORMS has the
    same share of each split; the test split also holds the small-number rows (form "small")."""
    if target not in TARGETS:
        raise ValueError(f"target must be one of {TARGETS}, got {target!r}")
    forms = list(surface.FORMS)
    quotas = split_quotas(size, EVAL_RATIO, len(forms))
    splits = fill_splits(_drawer(target, seed), forms, quotas, seed, ("source", "target"), values)
    small = [example(p, target) | ({"value": str(p.key)} if values else {})
             for p in surface.small_block(seed, quotas["test"] * len(forms))]
    splits["test"] = splits["test"] + small
    return Dataset(f"numbers-en-{target}", "translation", splits, [], seed, size,
                   normalization=PUNCT_AS_SPACE)
