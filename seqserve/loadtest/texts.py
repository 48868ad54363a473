"""Request texts that replay a real length distribution: a file or a built-in dataset split."""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from pathlib import Path

from seqserve.models.errors import DataError

TEXT_KEYS = ("text", "source", "src", "sentence")
"""JSON fields read, in order, from each JSONL line."""


def _text_of_json(line: str, path: Path, lineno: int) -> str:
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as exc:
        raise DataError(f"{path}:{lineno}: not valid JSON ({exc.msg})") from exc
    if isinstance(obj, str):
        return obj
    if isinstance(obj, dict):
        for key in TEXT_KEYS:
            if isinstance(obj.get(key), str):
                return str(obj[key])
    raise DataError(f"{path}:{lineno}: JSON line without a string field {'/'.join(TEXT_KEYS)}")


def load_text_file(path: str | Path) -> list[str]:
    """One text per line, or JSONL with a `text` (or `source`) field per line.

    A file is JSONL when its name ends with .jsonl/.json or its first line starts with `{`.
    Empty lines are skipped.
    """
    path = Path(path)
    try:
        raw = path.read_text(encoding="utf-8")
    except FileNotFoundError as exc:
        raise DataError(f"texts file not found: {path}") from exc
    except UnicodeDecodeError as exc:
        raise DataError(f"{path}: not UTF-8 text ({exc.reason})") from exc
    lines = [(n, line) for n, line in enumerate(raw.splitlines(), 1) if line.strip()]
    if not lines:
        raise DataError(f"{path}: no texts (the file is empty)")
    as_json = path.suffix in {".jsonl", ".json"} or lines[0][1].lstrip().startswith("{")
    if as_json:
        return [_text_of_json(line, path, n) for n, line in lines]
    return [line.strip() for _, line in lines]


def load_dataset_texts(name: str, split: str = "test") -> list[str]:
    """Input texts of one split of a built-in dataset
    (`seqserve.models.data.registry.load_dataset`)."""
    from seqserve.models.data.registry import load_dataset

    dataset = load_dataset(name)
    rows = dataset.splits.get(split)
    if not rows:
        raise DataError(f"dataset {name!r} has no examples in split {split!r}")
    key = dataset.fields[0]
    return [row[key] for row in rows]


def load_corpus_prompts(name: str, split: str = "test", max_chars: int = 64) -> list[str]:
    """Prompts from a built-in text corpus (`pydoc-topics`): the start of every non-empty
    line of the split's documents, cut at the last space within `max_chars`."""
    from seqserve.models.data.pydoc_corpus import load_text_corpus

    docs = load_text_corpus(name).splits.get(split)
    if not docs:
        raise DataError(f"corpus {name!r} has no documents in split {split!r}")
    prompts = []
    for doc in docs:
        for line in doc.splitlines():
            text = " ".join(line.split())
            if len(text) > max_chars:
                cut = text.rfind(" ", 0, max_chars + 1)
                text = text[: cut if cut > 0 else max_chars]
            if text:
                prompts.append(text)
    if not prompts:
        raise DataError(f"corpus {name!r} split {split!r}: no non-empty lines")
    return prompts


class TextSampler:
    """Draws request texts uniformly with replacement, so lengths follow the source's mix."""

    def __init__(self, texts: Sequence[str], seed: int = 0) -> None:
        if not texts:
            raise DataError("no texts to send")
        self._texts = list(texts)
        self._rng = random.Random(seed)

    def __len__(self) -> int:
        return len(self._texts)

    def draw(self, k: int = 1) -> list[str]:
        """k texts for one request."""
        return [self._rng.choice(self._texts) for _ in range(k)]
