"""Surface forms: the ways English writers write the same number phrase, and drawing them.

A `Style` is one way of writing: the number words (english.Words: commas, "and", hyphens,
"a hundred"), then case, punctuation around the phrase and spacing. `FORMS` names the
variations one at a time; each built-in example belongs to one form (its `"form"` field):

- valid/test rows show exactly their form's variation on top of the plain form (lower case,
  no commas, British "and", hyphens), and only values where it shows (a "spaced" row has a
  compound to space), so a per-form score measures that variation alone;
- training rows have the form's variation forced on top of a random mix of all the others.

`SMALL` rows (test only) are every standalone number 0..99 in two surface forms: these values
are building blocks that always go to training (models/data/sampling.py), so the small-number
score measures the served model on seen values, not generalisation.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, replace

from seqserve.models.data import english
from seqserve.models.data.english import Token, Words
from seqserve.models.data.values import KIND_WEIGHTS, KINDS, draw_value

FORMS: dict[str, str] = {
    "plain": "lower case, no commas, British \"and\", hyphens (num2words minus commas)",
    "commas": "num2words as it comes: thousands commas (\"one thousand, five hundred and six\")",
    "no_and": "American, without \"and\" (\"one hundred twenty-one\")",
    "spaced": "compounds spaced, not hyphenated (\"twenty one\", \"twenty first\")",
    "article": "\"a hundred\", \"a thousand\" (cardinals and amounts that start with one)",
    "capitalised": "first word capitalised (\"Twenty-one\")",
    "upper": "all caps (\"TWENTY-ONE\")",
    "title": "every word capitalised (\"Twenty-One Thousand\")",
    "full_stop": "a final full stop",
    "punctuated": "surrounding punctuation: quotes, brackets, ! ? ... ; : ,",
    "spaces": "extra spaces and tabs: leading, trailing, doubled",
    "mixed": "a random mix of all of the above",
}
"""Form name -> what it varies (docs/data.md lists them)."""
SMALL = "small"
"""Form of the test rows with every standalone number 0..99 (seen values)."""
SMALL_FORMS = ("plain", "spaced", "capitalised", "upper", "title", "full_stop", "punctuated",
               "spaces")
"""Forms a small-number test row is drawn in."""
WORD_FORMS = ("commas", "no_and", "spaced", "article")
"""Forms that change the words: their valid/test rows must differ from the plain wording."""
PAIRS = (('"', '"'), ("'", "'"), ("(", ")"), ("[", "]"), ("\u201c", "\u201d"),
         ("\u00ab", "\u00bb"), ('"', '."'), ("(", ")."), ("", "!"), ("", "?"), ("", "..."),
         ("", "\u2026"), ("", ";"), ("", ":"), ("", ","), ("", "!!"), ("", ".\u201d"))
"""(prefix, suffix) of surrounding punctuation; attached to the first and last word."""
CASES = ("lower", "capital", "upper", "title")
MAX_TRIES = 1000
"""Draws of a value until the form shows in it (then the last draw is kept)."""


@dataclass(frozen=True)
class Style:
    """One way of writing a phrase."""

    words: Words = Words()
    """Number words: commas, "and", hyphens, "a hundred"."""
    case: str = "lower"
    """lower | capital (first letter) | upper | title (every word)."""
    prefix: str = ""
    """Punctuation attached before the first word."""
    suffix: str = ""
    """Punctuation attached after the last word."""
    spacing: int = 0
    """0: single spaces; otherwise the seed of extra spaces and tabs (leading, trailing,
    doubled)."""


@dataclass(frozen=True)
class Phrase:
    """One drawn value written in one style."""

    kind: str
    """cardinal | ordinal | year | currency | date."""
    key: int | str
    """Split key of the value (models/data/sampling.py)."""
    value: object
    """The value (models/data/values.py types)."""
    form: str
    """The form it was drawn for."""
    text: str
    """The English text as written."""
    tags: list[str]
    """One tag per whitespace word of `text`."""


def form_style(form: str, rng: random.Random) -> Style:
    """The style of a valid/test row of `form`: its variation alone."""
    if form == "mixed":
        return random_style(rng)
    fixed = {"plain": Style(), "commas": Style(Words(commas=True)),
             "no_and": Style(Words(conj=False)), "spaced": Style(Words(hyphens=False)),
             "article": Style(Words(article=True)), "capitalised": Style(case="capital"),
             "upper": Style(case="upper"), "title": Style(case="title"),
             "full_stop": Style(suffix=".")}
    if form in fixed:
        return fixed[form]
    if form == "punctuated":
        prefix, suffix = rng.choice(PAIRS)
        return Style(prefix=prefix, suffix=suffix)
    if form == "spaces":
        return Style(spacing=rng.randint(1, 2**31))
    raise ValueError(f"unknown form {form!r}: use one of {', '.join(FORMS)}")


def random_style(rng: random.Random) -> Style:
    """Every variation at once, each with its own probability."""
    words = Words(commas=rng.random() < 0.5, conj=rng.random() < 0.6,
                  hyphens=rng.random() < 0.75, article=rng.random() < 0.35)
    case = rng.choices(CASES, (0.5, 0.3, 0.1, 0.1))[0]
    r = rng.random()
    prefix, suffix = ("", ".") if r < 0.25 else rng.choice(PAIRS) if r < 0.4 else ("", "")
    spacing = rng.randint(1, 2**31) if rng.random() < 0.15 else 0
    return Style(words, case, prefix, suffix, spacing)


def train_style(form: str, rng: random.Random) -> Style:
    """A training row's style: `form`'s variation forced on top of a random mix."""
    base, forced = random_style(rng), form_style(form, rng)
    if form in WORD_FORMS:
        return replace(base, words=_forced_words(base.words, forced.words))
    if form in ("capitalised", "upper", "title"):
        return replace(base, case=forced.case)
    if form in ("full_stop", "punctuated"):
        return replace(base, prefix=forced.prefix, suffix=forced.suffix)
    if form == "spaces":
        return replace(base, spacing=forced.spacing)
    return base


def _forced_words(base: Words, forced: Words) -> Words:
    plain = Words()
    changes = {f: getattr(forced, f) for f in ("commas", "conj", "hyphens", "article")
               if getattr(forced, f) != getattr(plain, f)}
    return replace(base, **changes)


def _without(form: str, style: Style) -> Words:
    """`style`'s words with `form`'s own variation (a WORD_FORMS one) undone."""
    field = {"commas": "commas", "no_and": "conj", "spaced": "hyphens", "article": "article"}
    name = field[form]
    return replace(style.words, **{name: getattr(Words(), name)})


def render(tokens: list[Token], style: Style) -> tuple[str, list[str]]:
    """(text, tags): the words cased, punctuated and spaced; one tag per whitespace word."""
    words = _cased([w for w, _ in tokens], style.case)
    words[0] = style.prefix + words[0]
    words[-1] = words[-1] + style.suffix
    return _joined(words, style.spacing), [tag for _, tag in tokens]


def _cased(words: list[str], case: str) -> list[str]:
    if case == "upper":
        return [w.upper() for w in words]
    if case == "title":
        return [w.title() for w in words]
    if case == "capital":
        return [words[0][:1].upper() + words[0][1:], *words[1:]]
    return list(words)


def _joined(words: list[str], spacing: int) -> str:
    if not spacing:
        return " ".join(words)
    rng = random.Random(spacing)
    gaps = [rng.choice((" ", " ", "  ", "   ", "\t", " \t ")) for _ in words[1:]]
    lead, trail = rng.choice(("", " ", "  ")), rng.choice(("", " ", "  ", "\t"))
    if not lead and not trail and set(gaps) <= {" "}:
        lead = " "
    return lead + "".join(w + g for w, g in zip(words, [*gaps, ""], strict=True)) + trail


def draw(rng: random.Random, form: str, in_train: Callable[[int | str], bool]) -> Phrase:
    """A value and a style for one row of `form`; `in_train(key)` says whether the value
    goes to training (random mix) or to valid/test (the form alone, where it shows)."""
    kinds, weights = (("cardinal", "currency"), (0.6, 0.4)) if form == "article" else (
        KINDS, KIND_WEIGHTS)
    for _ in range(MAX_TRIES):
        kind = rng.choices(kinds, weights)[0]
        key, value = draw_value(rng, kind)
        style = train_style(form, rng) if in_train(key) else form_style(form, rng)
        tokens = english.phrase(kind, value, style.words)
        if form not in WORD_FORMS or tokens != english.phrase(kind, value, _without(form, style)):
            break
    text, tags = render(tokens, style)
    return Phrase(kind, key, value, form, text, tags)


def small_phrases(rng: random.Random, per_value: int = 2) -> list[Phrase]:
    """Every number 0..99 on its own, `per_value` times in distinct forms of SMALL_FORMS
    ("spaced" only where there is a compound)."""
    out = []
    for n in range(100):
        spaced = "-" in english.phrase("cardinal", n, Words())[0][0]
        forms = [f for f in SMALL_FORMS if spaced or f != "spaced"]
        for form in rng.sample(forms, per_value):
            style = form_style(form, rng)
            text, tags = render(english.phrase("cardinal", n, style.words), style)
            out.append(Phrase("cardinal", n, n, SMALL, text, tags))
    return out


def small_block(seed: int, limit: int) -> list[Phrase]:
    """The small-number test rows of a dataset (every 0..99 twice); a seeded sample of
    `limit` rows when the rest of its test split is smaller than that."""
    rng = random.Random(f"small-{seed}")
    rows = small_phrases(rng)
    return rows if len(rows) <= limit else rng.sample(rows, limit)
