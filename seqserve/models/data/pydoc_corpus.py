"""Text corpora for language models: the built-in `pydoc-topics`, or the user's text files.

`pydoc-topics` is the Python Language Reference prose that ships inside CPython itself
(`pydoc_data.topics.topics`: the text `help("assert")` shows, 79 topics, about 465 KB of
English in CPython 3.11): real text, no download, the same on every machine with the same
Python. Documents are split into train / valid / test by a seeded permutation of the sorted
topic names (80/10/10), so no topic's text is in two splits (docs/data.md).

User data: one file -> one document per non-empty line; several files or a folder (every
`*.txt` in it) -> one document per file. Documents are split the same way.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

from seqserve.models.errors import DataError

BUILTIN_CORPORA = ("pydoc-topics",)
SPLIT_FRACTIONS = (0.8, 0.1, 0.1)


@dataclass(frozen=True)
class TextCorpus:
    """Documents per split."""

    name: str
    splits: dict[str, list[str]]
    """train | valid | test -> documents (plain text)."""

    def counts(self) -> dict[str, dict[str, int]]:
        return {k: {"documents": len(v), "characters": sum(len(d) for d in v)}
                for k, v in self.splits.items()}


def pydoc_topics() -> list[tuple[str, str]]:
    """(topic, text) of CPython's own Language Reference topics, sorted by topic."""
    from pydoc_data.topics import topics

    return sorted((str(k), str(v)) for k, v in topics.items() if str(v).strip())


def split_documents(docs: list[str], seed: int, name: str) -> TextCorpus:
    """80/10/10 by document after a seeded shuffle; at least one document per split."""
    if len(docs) < 3:
        raise DataError(f"{name}: {len(docs)} document(s); a language model needs at least 3 "
                        "(train, valid and test get one each at least)")
    order = list(range(len(docs)))
    random.Random(seed).shuffle(order)
    n_valid = max(1, round(len(docs) * SPLIT_FRACTIONS[1]))
    n_test = max(1, round(len(docs) * SPLIT_FRACTIONS[2]))
    n_train = len(docs) - n_valid - n_test
    picked = [docs[i] for i in order]
    return TextCorpus(name, {"train": picked[:n_train],
                             "valid": picked[n_train : n_train + n_valid],
                             "test": picked[n_train + n_valid :]})


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise DataError(f"{path}: cannot read as UTF-8 text: {exc}") from exc


def load_text_corpus(spec: str | list[str], seed: int = 0) -> TextCorpus:
    """A built-in corpus by name, or the user's files (see module doc)."""
    specs = [spec] if isinstance(spec, str) else list(spec)
    if len(specs) == 1 and specs[0] in BUILTIN_CORPORA:
        return split_documents([t for _, t in pydoc_topics()], seed, specs[0])
    paths: list[Path] = []
    for s in specs:
        p = Path(s)
        if p.is_dir():
            paths += sorted(p.glob("*.txt"))
        elif p.is_file():
            paths.append(p)
        else:
            raise DataError(f"{s}: neither a built-in corpus ({', '.join(BUILTIN_CORPORA)}) "
                            "nor an existing file or folder")
    if not paths:
        raise DataError(f"{specs}: no .txt files found")
    if len(paths) == 1:
        docs = [line.strip() for line in _read(paths[0]).splitlines() if line.strip()]
    else:
        docs = [t for t in (_read(p).strip() for p in paths) if t]
    return split_documents(docs, seed, ",".join(specs))
