"""Whitespace words <-> subword pieces, for taggers (torch-free: used by training and serving).

A tagger labels whitespace words but runs on sentencepiece pieces. Each word is represented by
its first piece (the first piece whose character span overlaps the word and ends inside it);
the word's tag is trained and read there. Spans are [start, end) character offsets into the
original text, so `text[start:end] == word`.

A piece's span may start early (it covers the whitespace, and under a punctuation-removing
normalization the punctuation, that it stands for) but it ends right after its own text. So a
word whose characters the tokenizer removes entirely (a lone "," under
`nmt_nfkc_cf_punct`) has no piece of its own: it is not given the next word's piece.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

_WORD = re.compile(r"\S+")


class _Span(Protocol):
    @property
    def start(self) -> int: ...
    @property
    def end(self) -> int: ...


@dataclass(frozen=True)
class Word:
    """One whitespace word: its text, its span in the original text and its first piece."""

    text: str
    start: int
    end: int
    piece: int
    """Index of the word's first piece in the encoded sequence (-1: no piece, e.g. cut off)."""


def words(text: str) -> list[tuple[str, int, int]]:
    """(word, start, end) for every whitespace-separated word of `text`."""
    return [(m.group(), m.start(), m.end()) for m in _WORD.finditer(text)]


def align(text: str, pieces: Sequence[_Span]) -> list[Word]:
    """Each whitespace word of `text` with the index of its first piece (-1: none).

    `pieces` are `Tokenizer.encode_with_offsets(text)` (or its first max_length items)."""
    out: list[Word] = []
    p = 0
    for word, start, end in words(text):
        while p < len(pieces) and pieces[p].end <= start:
            p += 1
        inside = p < len(pieces) and pieces[p].start < end and pieces[p].end <= end
        hit = p if inside else -1
        out.append(Word(word, start, end, hit))
    return out


def piece_labels(text: str, pieces: Sequence[_Span], tags: Sequence[int],
                 ignore: int = -100) -> list[int]:
    """Per-piece training targets: the word's tag on its first piece, `ignore` elsewhere."""
    labels = [ignore] * len(pieces)
    for word, tag in zip(align(text, pieces), tags, strict=True):
        if word.piece >= 0:
            labels[word.piece] = tag
    return labels
