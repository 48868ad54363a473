"""`numbers-tags`: English number, ordinal, year, amount and date phrases, each whitespace word
tagged with its role (sequence labeling).

Tags (`TAGS`): unit (zero..nine), teen (ten..nineteen), ten (twenty..ninety, also hyphenated
"thirty-four"), hundred, scale (thousand, million), conj ("and"), ordinal (the ordinal word
that ends an ordinal number or a date's day: "twentieth", "twenty-first"), month, year (every
word of a year, so "nineteen" is a teen in a number but a year in "nineteen eighty-seven"),
currency (euro(s), dollar(s)), cents (cent(s)), article ("the"), prep ("of").

Examples are `{"text", "tags", "kind"}` with len(tags) == len(text.split()). The phrases are
those of `numbers-en-fr`'s English side (models/data/numbers.py), checked word for word.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any, cast

from models.data import numbers, wording
from models.data.dataset import SPLITS, Dataset, Example
from models.data.sampling import Draw, fill_splits
from models.errors import DataError

TAGS = ("article", "cents", "conj", "currency", "hundred", "month", "ordinal", "prep", "scale",
        "teen", "ten", "unit", "year")
DEFAULT_SIZE = 6000
EVAL_RATIO = 1 / 10
_UNITS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
_TEENS = ("ten", "eleven", "twelve", "thirteen", "fourteen", "fifteen", "sixteen", "seventeen",
          "eighteen", "nineteen")
_TENS = ("twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety")
_LEXICON: dict[str, str] = {
    **dict.fromkeys(_UNITS, "unit"), **dict.fromkeys(_TEENS, "teen"),
    **dict.fromkeys(_TENS, "ten"), "hundred": "hundred", "thousand": "scale",
    "million": "scale", "and": "conj",
}


def number_tags(words: list[str]) -> list[str]:
    """Tags of cardinal number words by lexicon ("thirty-four" -> ten)."""
    tags = []
    for w in words:
        tag = _LEXICON.get(w.split("-")[0])
        if tag is None:
            raise ValueError(f"no number tag for word {w!r}")
        tags.append(tag)
    return tags


def _cardinal(n: int) -> tuple[list[str], list[str]]:
    words = wording.cardinal(n, "en").split()
    return words, number_tags(words)


def _ordinal(n: int) -> tuple[list[str], list[str]]:
    words = (wording.ordinal(n, "en") or "").split()
    return words, [*number_tags(words[:-1]), "ordinal"]


def tagged(kind: str, value: Any) -> tuple[list[str], list[str]]:
    """(words, tags) of one drawn value (see numbers._value for the value types)."""
    if kind == "cardinal":
        return _cardinal(value)
    if kind == "ordinal":
        return _ordinal(value)
    if kind == "year":
        words = wording.year(value, "en").split()
        return words, ["year"] * len(words)
    if kind == "currency":
        units, cents, code = value
        one, many, cent, cents_word, _ = numbers._MONEY[code, "en"]
        words, tags = [], []
        if units or not cents:
            w, t = _cardinal(units)
            words += [*w, one if units == 1 else many]
            tags += [*t, "currency"]
        if cents:
            w, t = _cardinal(cents)
            if words:
                words, tags = [*words, "and"], [*tags, "conj"]
            words += [*w, cent if cents == 1 else cents_word]
            tags += [*t, "cents"]
        return words, tags
    day_words, day_tags = _ordinal(value.day)
    year_words = wording.year(value.year, "en").split()
    words = ["the", *day_words, "of", wording.month_name(value.month, "en"), *year_words]
    return words, ["article", *day_tags, "prep", "month", *["year"] * len(year_words)]


def _draw(rng: random.Random, group: str) -> Draw:
    kind = rng.choices(numbers.KINDS, numbers.KIND_WEIGHTS)[0]
    key, value = numbers._value(rng, kind)

    def make() -> Example:
        words, tags = tagged(kind, value)
        text = " ".join(words)
        assert text == numbers.word(kind, value, "en"), (text, kind, value)
        return cast(Example, {"text": text, "tags": tags, "kind": kind})

    return Draw(key, make)


def generate(size: int = DEFAULT_SIZE, seed: int = 0, values: bool = False) -> Dataset:
    """`size` tagged training phrases (valid and test a tenth each, disjoint values)."""
    per_eval = max(1, round(size * EVAL_RATIO))
    quotas = {"train": max(1, size), "valid": per_eval, "test": per_eval}
    splits = fill_splits(_draw, [""], quotas, seed, ("text", "tags"), values)
    return Dataset("numbers-tags", "tagging", splits, list(TAGS), seed, size)


def check_row(row: Any, where: str) -> Example:
    """A tagging example {"text": str, "tags": [str per whitespace word]} or DataError."""
    if not isinstance(row, dict) or not isinstance(row.get("text"), str):
        raise DataError(f"{where}: a tagging row needs a string \"text\"")
    tags = row.get("tags")
    if not isinstance(tags, list) or not all(isinstance(t, str) and t for t in tags):
        raise DataError(f"{where}: \"tags\" must be a list of non-empty strings")
    if len(tags) != len(row["text"].split()):
        raise DataError(f"{where}: {len(tags)} tags for {len(row['text'].split())} "
                        "whitespace words; give one tag per word")
    return cast(Example, row)


def read_folder(folder: Path, meta: dict[str, Any]) -> Dataset:
    """A tagging dataset written by `save_dataset` (train/valid/test.jsonl + meta.json)."""
    splits: dict[str, list[Example]] = {}
    for split in SPLITS:
        path = folder / f"{split}.jsonl"
        if not path.is_file():
            raise DataError(f"{folder}: meta.json present but {split}.jsonl missing")
        rows = []
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
            if line.strip():
                try:
                    rows.append(check_row(json.loads(line), f"{path}:{n}"))
                except json.JSONDecodeError as exc:
                    raise DataError(f"{path}:{n}: not JSON: {exc}") from exc
        splits[split] = rows
    seen = sorted({t for rows in splits.values() for r in rows for t in r["tags"]})
    labels = sorted(set(meta.get("labels") or []) | set(seen))
    return Dataset(str(meta.get("name", folder.name)), "tagging", splits, labels,
                   meta.get("seed"), meta.get("size"))
