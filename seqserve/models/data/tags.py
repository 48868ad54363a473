"""`numbers-tags`: English number, ordinal, year, amount and date phrases, each whitespace word
tagged with its role (sequence labeling).

Tags (`TAGS`): unit (zero..nine), teen (ten..nineteen), ten (twenty..ninety, also hyphenated
"thirty-four"), hundred, scale (thousand, million), conj ("and"), ordinal (the ordinal word
that ends an ordinal number or a date's day: "twentieth", "twenty-first", and "first" in the
spaced "twenty first"), month, year (every word of a year, so "nineteen" is a teen in a number
but a year in "nineteen eighty-seven"), currency (euro(s), dollar(s)), cents (cent(s)),
article ("the"; "a" in "a hundred"), prep ("of").

Examples are `{"text", "tags", "kind", "form"}` with len(tags) == len(text.split()): the
phrases of `numbers-en-fr`'s English side in the same surface forms (models/data/surface.py);
punctuation stays attached to its word ("Ninety-three." is one word, tagged ten).
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any, cast

from seqserve.models.data import english, surface
from seqserve.models.data.dataset import SPLITS, Dataset, Example
from seqserve.models.data.english import Words, number_tags
from seqserve.models.data.sampling import Draw, Drawer, fill_splits, split_for, split_quotas
from seqserve.models.errors import DataError
from seqserve.models.text.normalization import PUNCT_AS_SPACE

__all__ = ["TAGS", "generate", "number_tags", "tagged"]

TAGS = ("article", "cents", "conj", "currency", "hundred", "month", "ordinal", "prep", "scale",
        "teen", "ten", "unit", "year")
DEFAULT_SIZE = 6000
EVAL_RATIO = 1 / 5
"""valid and test each hold this fraction of the train size (spread over the forms)."""


def tagged(kind: str, value: Any, style: Words | None = None) -> tuple[list[str], list[str]]:
    """(words, tags) of one drawn value (models/data/values.py types), plain by default."""
    tokens = english.phrase(kind, value, style or Words())
    return [w for w, _ in tokens], [t for _, t in tokens]


def _row(phrase: surface.Phrase) -> Example:
    return cast(Example, {"text": phrase.text, "tags": phrase.tags, "kind": phrase.kind,
                          "form": phrase.form})


def _drawer(seed: int) -> Drawer:
    def in_train(key: int | str) -> bool:
        return split_for(key, seed) == "train"

    def draw(rng: random.Random, form: str) -> Draw:
        phrase = surface.draw(rng, form, in_train)
        return Draw(phrase.key, lambda: _row(phrase))

    return draw


def generate(size: int = DEFAULT_SIZE, seed: int = 0, values: bool = False) -> Dataset:
    """About `size` tagged training phrases over the forms of surface.FORMS (valid and test a
    fifth each, disjoint values; the test split also holds the small-number rows)."""
    forms = list(surface.FORMS)
    quotas = split_quotas(size, EVAL_RATIO, len(forms))
    splits = fill_splits(_drawer(seed), forms, quotas, seed, ("text", "tags"), values)
    small = [_row(p) | ({"value": str(p.key)} if values else {})
             for p in surface.small_block(seed, quotas["test"] * len(forms))]
    splits["test"] = splits["test"] + small
    return Dataset("numbers-tags", "tagging", splits, list(TAGS), seed, size,
                   normalization=PUNCT_AS_SPACE)


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
                   meta.get("seed"), meta.get("size"), meta.get("normalization"))
