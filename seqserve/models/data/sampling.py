"""Fill train/valid/test quotas from a random value generator, keeping splits disjoint.

A generator draws an underlying value (a number or a date) and says how to word it. The
value's split comes from a seeded hash of the value (`split_of`), so it is the same at any
dataset size; values below `SHARED_BELOW` are building blocks and always go to training.
Duplicated examples are skipped; an input that would map to two different outputs (the same
text in two languages, the same English wording for two targets) is ambiguous and is banned
from every split.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

from seqserve.models.data.dataset import SPLITS, Example, split_of
from seqserve.models.errors import DataError

SHARED_BELOW = 100
"""Integer values below this go to the training split only."""
MAX_DRAWS_PER_EXAMPLE = 60
"""Give up (DataError) after this many draws per requested example."""


@dataclass(frozen=True)
class Draw:
    """One sampled value: its split key, and a function that words it as an example."""

    key: int | str
    """The underlying value: an int (number, year, amount units) or a string (a date)."""
    make: Callable[[], Example]
    """Builds the example; called only when the value's split still needs examples."""


Drawer = Callable[[random.Random, str], Draw]
"""(rng, group) -> Draw; a group is a language for langid, "" for a single-pair set."""


def split_for(key: int | str, seed: int) -> str:
    """The split of an underlying value (values below SHARED_BELOW: always "train")."""
    if isinstance(key, int) and key < SHARED_BELOW:
        return "train"
    return split_of(str(key), seed)


def fill_splits(
    draw: Drawer,
    groups: list[str],
    quotas: dict[str, int],
    seed: int,
    fields: tuple[str, str],
    values: bool = False,
) -> dict[str, list[Example]]:
    """Draw round-robin over `groups` until every (group, split) holds `quotas[split]` rows.

    `fields` = (input field, output field): an input seen with two different outputs is
    banned everywhere. With `values` each example keeps a "value" field naming its
    underlying value(s) ("|"-joined for a pair). Returns each split shuffled deterministically.
    """
    rng = random.Random(seed)
    src, out = fields
    buckets: dict[tuple[str, str], dict[str, Example]] = {
        (g, s): {} for g in groups for s in SPLITS
    }
    owner: dict[str, tuple[str, str]] = {}  # input text -> bucket holding it
    banned: set[str] = set()
    budget = MAX_DRAWS_PER_EXAMPLE * len(groups) * sum(quotas.values())
    open_groups = list(groups)
    while open_groups:
        for group in open_groups:
            budget -= 1
            d = draw(rng, group)
            bucket_id = (group, split_for(d.key, seed))
            bucket = buckets[bucket_id]
            if len(bucket) >= quotas[bucket_id[1]]:
                continue
            example = d.make()
            if values:
                example.setdefault("value", str(d.key))
            else:
                example.pop("value", None)
            text = example[src]
            if text in banned:
                continue
            if text in owner:
                holder = owner[text]
                if buckets[holder][text][out] != example[out]:
                    banned.add(text)  # ambiguous: drop it from where it was
                    del buckets[holder][text]
                    del owner[text]
                continue
            bucket[text] = example
            owner[text] = bucket_id
        open_groups = [g for g in groups if any(len(buckets[g, s]) < quotas[s] for s in SPLITS)]
        if budget < 0 and open_groups:
            raise DataError(
                f"could not draw enough distinct examples for {open_groups[:3]} "
                f"(quotas {quotas}); ask for a smaller --size"
            )
    splits: dict[str, list[Example]] = {}
    for s in SPLITS:
        rows = [ex for g in groups for ex in buckets[g, s].values()]
        rng.shuffle(rows)
        splits[s] = rows
    return splits


def log_uniform_int(rng: random.Random, lo: int, hi: int) -> int:
    """An int in [lo, hi] whose number of digits is uniform, so small and large both appear."""
    digits = rng.randint(len(str(lo)), len(str(hi)))
    return rng.randint(max(lo, 10 ** (digits - 1) if digits > 1 else 0), min(hi, 10**digits - 1))


def split_quotas(size: int, eval_ratio: float, groups: int) -> dict[str, int]:
    """Rows per (group, split) for about `size` training rows over `groups` groups; valid
    and test each get `eval_ratio` of that."""
    per_eval = max(1, round(size * eval_ratio / groups))
    return {"train": max(1, round(size / groups)), "valid": per_eval, "test": per_eval}
