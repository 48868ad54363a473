"""Number, currency and date wording in many languages (num2words + babel), cached.

Every function is a deterministic function of its arguments, lowercased, with commas dropped
and whitespace collapsed. num2words raises different exceptions for what a language does not
support (NotImplementedError, TypeError, IndexError, ...); those become `None` or a fallback.
"""

from __future__ import annotations

import datetime as dt
from decimal import Decimal
from functools import cache

from babel import Locale
from babel.dates import get_month_names
from babel.numbers import get_currency_name
from num2words import num2words

# What num2words raises for an unsupported language/feature/currency combination.
_UNSUPPORTED = (NotImplementedError, TypeError, IndexError, KeyError, ValueError, AttributeError)
# num2words language code -> babel locale where they differ.
_BABEL_LOCALE = {"no": "nb"}


def normalise(text: str) -> str:
    """Lowercase, drop commas, collapse whitespace."""
    return " ".join(text.replace(",", " ").lower().split())


@cache
def cardinal(n: int, lang: str) -> str:
    """Cardinal wording of `n`, e.g. (21, "fr") -> "vingt et un"."""
    return normalise(num2words(n, lang=lang))


@cache
def ordinal(n: int, lang: str) -> str | None:
    """Ordinal wording of `n`, or None where num2words has none for `lang`."""
    try:
        return normalise(num2words(n, lang=lang, to="ordinal"))
    except _UNSUPPORTED:
        return None


@cache
def year(n: int, lang: str) -> str:
    """Year wording (e.g. "nineteen eighty-seven"); the cardinal where there is none."""
    try:
        return normalise(num2words(n, lang=lang, to="year"))
    except _UNSUPPORTED:
        return cardinal(n, lang)


@cache
def _locale(lang: str) -> Locale:
    return Locale.parse(_BABEL_LOCALE.get(lang, lang))


@cache
def month_name(month: int, lang: str) -> str:
    """Month name in the form used inside a date (genitive where the language has one)."""
    return normalise(get_month_names("wide", context="format", locale=_locale(lang))[month])


@cache
def currency_name(code: str, count: int, lang: str) -> str:
    """Locale display name of a currency for `count` units (babel), e.g. "svenska kronor"."""
    return normalise(get_currency_name(code, count=count, locale=_locale(lang)))


@cache
def currency(units: int, cents: int, code: str, lang: str) -> str:
    """An amount in words: num2words' currency wording where it exists, else babel's name.

    Without cents only the whole units are worded (num2words would add "zero cents"). The
    fallback (cardinal + babel currency name) drops cents, which babel cannot name.
    """
    if cents and units:
        try:
            amount = Decimal(units) + Decimal(cents) / 100
            return normalise(num2words(amount, lang=lang, to="currency", currency=code))
        except _UNSUPPORTED:
            pass
    return f"{cardinal(units, lang)} {currency_name(code, units, lang)}"


def date_words(day: dt.date, lang: str) -> str:
    """A date in words for language identification (day, locale month name, year)."""
    d, m, y = day.day, month_name(day.month, lang), year(day.year, lang)
    if lang == "en":
        return f"the {ordinal(d, 'en')} of {m} {y}"
    if lang == "fr":
        return f"le {'premier' if d == 1 else cardinal(d, 'fr')} {m} {y}"
    if lang == "de":
        return f"{ordinal(d, 'de')}r {m} {y}"
    if lang in ("es", "pt"):
        return f"{cardinal(d, lang)} de {m} de {y}"
    if lang == "ca":  # babel's catalan month already carries "de"/"d'"
        return f"{cardinal(d, lang)} {m} de {y}"
    if lang == "it":
        return f"{'primo' if d == 1 else cardinal(d, 'it')} {m} {y}"
    return f"{ordinal(d, lang) or cardinal(d, lang)} {m} {y}"
