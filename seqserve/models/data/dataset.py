"""The in-memory dataset type shared by built-in generators, readers and training.

Torch-free. An example is a plain dict of strings, exactly one JSON line of the on-disk format
(docs/contracts.md): `{"text", "label"}` for classification, `{"source", "target"}` (plus
optional `"kind"` and `"form"`) for translation, `{"text", "tags"}` (a list, one tag per
whitespace word) for tagging.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Literal

Task = Literal["classification", "translation", "tagging"]
Example = dict[str, str]
SPLITS = ("train", "valid", "test")
TASK_FIELDS: dict[str, tuple[str, str]] = {
    "classification": ("text", "label"),
    "translation": ("source", "target"),
    "tagging": ("text", "tags"),
}


@dataclass(frozen=True)
class Dataset:
    """A named dataset with train/valid/test splits of JSON-like examples."""

    name: str
    """Built-in name or the folder the data came from."""
    task: Task
    """"classification" (text -> label) or "translation" (source -> target)."""
    splits: dict[str, list[Example]]
    """Split name ("train", "valid", "test") -> examples."""
    labels: list[str] = field(default_factory=list)
    """Sorted label set for classification; empty for translation."""
    seed: int | None = None
    """Seed a built-in dataset was generated with (None for user data)."""
    size: int | None = None
    """Requested train size of a built-in dataset (None for user data)."""
    normalization: str | None = None
    """Tokenizer normalization the data asks for (models/text/normalization.py), e.g.
    "nmt_nfkc_cf_punct" where punctuation carries no meaning; None: the trainer's default."""

    @property
    def fields(self) -> tuple[str, str]:
        """The (input, output) field names of an example for this task."""
        return TASK_FIELDS[self.task]

    def counts(self) -> dict[str, int]:
        """Number of examples per split."""
        return {name: len(rows) for name, rows in self.splits.items()}

    def breakdown(self, split: str) -> dict[str, int]:
        """Examples per label (classification) or per kind (translation) in one split."""
        if self.task == "tagging":
            counter = Counter(t for row in self.splits.get(split, []) for t in row["tags"])
            return dict(sorted(counter.items()))
        key = "label" if self.task == "classification" else "kind"
        counter = Counter(row.get(key, "?") for row in self.splits.get(split, []))
        return dict(sorted(counter.items()))

    def texts(self, split: str = "train") -> Iterator[str]:
        """Every string a tokenizer should see: text, or source and target (joint vocabulary)."""
        for row in self.splits.get(split, []):
            if self.task in ("classification", "tagging"):
                yield row["text"]
            else:
                yield row["source"]
                yield row["target"]

    def meta(self) -> dict[str, object]:
        """The `meta.json` payload of docs/contracts.md."""
        meta: dict[str, object] = {
            "name": self.name,
            "task": self.task,
            "seed": self.seed,
            "size": self.size,
        }
        if self.task in ("classification", "tagging"):
            meta["labels"] = list(self.labels)
        if self.normalization:
            meta["normalization"] = self.normalization
        meta["counts"] = self.counts()
        return meta


def split_of(key: str, seed: int, eval_fraction: float = 0.1) -> str:
    """Deterministic split of an underlying value, independent of dataset size.

    `key` names the value (for example "n:1987" or "d:2005-03-21"); the same key and seed
    always land in the same split, so no value is shared between splits. Each of valid and
    test receives about `eval_fraction` of the keys.
    """
    digest = hashlib.blake2b(f"{seed}\x00{key}".encode(), digest_size=8).digest()
    u = int.from_bytes(digest, "big") / 2.0**64  # uniform in [0, 1)
    if u < eval_fraction:
        return "valid"
    if u < 2 * eval_fraction:
        return "test"
    return "train"
