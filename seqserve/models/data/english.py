"""English number, ordinal, year, amount and date phrases as tagged words, in a chosen style.

`phrase(kind, value, style)` -> [(word, tag)]: the English wording of a drawn value
(models/data/values.py) with each whitespace word's role (models/data/tags.py). The words
come from num2words (`num2words(n, lang="en")`: thousands commas, British "and", hyphenated
compounds) and `Style` changes what English writers change: commas dropped or kept, "and"
dropped (American), compounds spaced, "a hundred" / "a thousand". Case, punctuation and
spacing are applied to the joined text by models/data/surface.py.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from functools import cache
from typing import Any

from num2words import num2words

from seqserve.models.data import wording

Token = tuple[str, str]
"""(word, tag)."""
UNITS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
TEENS = ("ten", "eleven", "twelve", "thirteen", "fourteen", "fifteen", "sixteen", "seventeen",
         "eighteen", "nineteen")
TENS = ("twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety")
LEXICON: dict[str, str] = {
    **dict.fromkeys(UNITS, "unit"), **dict.fromkeys(TEENS, "teen"),
    **dict.fromkeys(TENS, "ten"), "hundred": "hundred", "thousand": "scale",
    "million": "scale", "and": "conj",
}
"""Tag of a cardinal number word (the first part of a hyphenated one: "thirty-four" -> ten)."""
MONEY = {"EUR": ("euro", "euros"), "USD": ("dollar", "dollars")}
"""Currency code -> (singular, plural) English unit name."""
_SCALES = ("hundred", "thousand")


@dataclass(frozen=True)
class Words:
    """How the number words of a phrase are written (case and punctuation: surface.Style)."""

    commas: bool = False
    """Keep num2words' thousands comma ("one thousand, five hundred")."""
    conj: bool = True
    """Keep the British "and" inside numbers ("one hundred and one"); False: American."""
    hyphens: bool = True
    """Hyphenated compounds ("twenty-one"); False: spaced ("twenty one")."""
    article: bool = False
    """"a hundred", "a thousand" for a cardinal or amount that starts "one hundred/thousand"."""


def number_tags(words: list[str]) -> list[str]:
    """Tags of cardinal number words by lexicon ("thirty-four" -> ten, "thousand," -> scale)."""
    tags = []
    for w in words:
        tag = LEXICON.get(w.rstrip(",").split("-")[0])
        if tag is None:
            raise ValueError(f"no number tag for word {w!r}")
        tags.append(tag)
    return tags


@cache
def _num2words(n: int, to: str) -> tuple[str, ...]:
    return tuple(num2words(n, lang="en", to=to).lower().split())


def number(n: int, to: str, style: Words) -> list[Token]:
    """`n` as a cardinal, ordinal or year (`to`) in `style`, tagged."""
    words = list(_num2words(n, to))
    if to == "year":
        tags = ["year"] * len(words)
    elif to == "ordinal":
        tags = [*number_tags(words[:-1]), "ordinal"]
    else:
        tags = number_tags(words)
    tokens = list(zip(words, tags, strict=True))
    if not style.conj:
        tokens = [t for t in tokens if t[0] != "and"]
    if not style.commas:
        tokens = [(w.rstrip(","), tag) for w, tag in tokens]
    if style.article and to == "cardinal" and _one_scale(tokens):
        tokens[0] = ("a", "article")
    return tokens if style.hyphens else [p for t in tokens for p in _spaced(t)]


def _one_scale(tokens: list[Token]) -> bool:
    return len(tokens) > 1 and tokens[0][0] == "one" and tokens[1][0].rstrip(",") in _SCALES


def _spaced(token: Token) -> list[Token]:
    """"twenty-one" (ten) -> "twenty" (ten), "one" (unit); an ordinal keeps its last part's
    tag ("twenty first": ten, ordinal), a year word stays "year" in every part."""
    word, tag = token
    parts = word.split("-")
    if len(parts) == 1:
        return [token]
    if tag == "year":
        return [(p, tag) for p in parts]
    if tag == "ordinal":
        return [*zip(parts[:-1], number_tags(parts[:-1]), strict=True), (parts[-1], tag)]
    return list(zip(parts, number_tags(parts), strict=True))


def amount(units: int, cents: int, code: str, style: Words) -> list[Token]:
    """"twenty-one euros and fifty cents"; zero units or zero cents are left out."""
    one, many = MONEY[code]
    tokens: list[Token] = []
    if units or not cents:
        tokens += [*number(units, "cardinal", style), (one if units == 1 else many, "currency")]
    if cents:
        if tokens:
            tokens.append(("and", "conj"))
        cents_style = Words(style.commas, style.conj, style.hyphens)  # never "a ... cents"
        tokens += [*number(cents, "cardinal", cents_style),
                   ("cent" if cents == 1 else "cents", "cents")]
    return tokens


def date(day: dt.date, style: Words) -> list[Token]:
    """"the twenty-first of march two thousand and five" (with commas: "march,")."""
    month = wording.month_name(day.month, "en") + ("," if style.commas else "")
    return [("the", "article"), *number(day.day, "ordinal", style), ("of", "prep"),
            (month, "month"), *number(day.year, "year", style)]


def phrase(kind: str, value: Any, style: Words) -> list[Token]:
    """The tagged English words of one drawn value (models/data/values.py types)."""
    if kind in ("cardinal", "ordinal", "year"):
        return number(value, kind, style)
    if kind == "currency":
        units, cents, code = value
        return amount(units, cents, code, style)
    if kind == "date":
        return date(value, style)
    raise ValueError(f"unknown kind {kind!r}")
