"""A language model's tokenizer as the server's clients see it: prompts given as token ids,
the special tokens by their strings, and the tokenizer endpoints' operations (vLLM's
`/tokenize`, `/detokenize`, `/tokenizer_info`, which lm-eval's `tokenizer_backend="remote"`
reads).

Special tokens (pad, unk, bos, eos) are written by their strings (SentencePiece's `<s>`,
`</s>`, ...): `tokenize` reads those strings in a text as the special ids, `detokenize` and
`text_of` write them back, so `tokenize(detokenize(ids)) == ids` for the ids a text can give.
A text prompt is read the same way everywhere (completions with their echo, /score, generate,
OIP: `encode`, Hugging Face's convention, which lm-eval's text requests assume) unless the
request asks `split_special_tokens` (then such a string is ordinary text). Stop strings are
found in generated text here too (`find_stop`, and `held`: what may begin one, not sent yet).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from seqserve.models.text.tokenizer import Piece
from seqserve.models.text.tokenizer_files import TextTokenizer
from seqserve.service.core.errors import BadRequest


@dataclass(frozen=True)
class Specials:
    """The special tokens of one tokenizer: id -> string, and the pattern that finds them."""

    strings: dict[int, str]
    pattern: re.Pattern[str] | None

    @classmethod
    def of(cls, tok: TextTokenizer) -> Specials:
        strings: dict[int, str] = {}
        for i in (tok.pad_id, tok.unk_id, tok.bos_id, tok.eos_id):
            if 0 <= i < tok.vocab_size:
                piece = tok.id_to_piece(i)
                if piece:
                    strings[i] = piece
        ordered = sorted(set(strings.values()), key=len, reverse=True)
        pattern = re.compile("|".join(map(re.escape, ordered))) if ordered else None
        return cls(strings, pattern)

    def ids(self) -> dict[str, int]:
        return {s: i for i, s in self.strings.items()}


def tokenize(tok: TextTokenizer, specials: Specials, text: str,
             add_special_tokens: bool = True) -> list[int]:
    """The ids of `text`, special strings read as their ids (module doc); with
    `add_special_tokens` bos first (what the server puts before every prompt)."""
    return ([tok.bos_id] if add_special_tokens else []) + encode(tok, specials, text)[0]


def encode(tok: TextTokenizer, specials: Specials, text: str, offsets: bool = False
           ) -> tuple[list[int], list[Piece] | None]:
    """`text`'s ids, special strings read as their ids and the text between them encoded
    on its own (module doc), and with `offsets` its pieces (a special's span: its string)."""
    ids: list[int] = []
    pieces: list[Piece] | None = [] if offsets else None
    named = specials.ids()

    def run(start: int, end: int) -> None:
        if pieces is None:
            ids.extend(tok.encode(text[start:end]))
            return
        for p in tok.encode_with_offsets(text[start:end]):
            ids.append(p.id)
            pieces.append(Piece(p.id, p.piece, p.start + start, p.end + start))

    at = 0
    for m in specials.pattern.finditer(text) if specials.pattern is not None else ():
        if m.start() > at:
            run(at, m.start())
        ids.append(named[m.group()])
        if pieces is not None:
            pieces.append(Piece(ids[-1], m.group(), m.start(), m.end()))
        at = m.end()
    if at < len(text):
        run(at, len(text))
    return ids, pieces


def detokenize(tok: TextTokenizer, specials: Specials, ids: Sequence[int]) -> str:
    """The text of `ids`, special ids written as their strings (module doc)."""
    parts: list[str] = []
    run: list[int] = []
    for i in ids:
        special = specials.strings.get(i)
        if special is None:
            run.append(i)
            continue
        if run:
            parts.append(tok.decode(run))
            run = []
        parts.append(special)
    if run:
        parts.append(tok.decode(run))
    return "".join(parts)


def offsets(tok: TextTokenizer, specials: Specials, ids: Sequence[int], text: str
            ) -> list[int]:
    """Where each of `ids` starts in `text` (their `detokenize`): each piece's text is the
    text of (previous piece, piece) after the previous piece's own (a piece's leading space
    survives), O(1) a token; clamped to the text."""
    out: list[int] = []
    at = 0
    prev: int | None = None
    for i in ids:
        out.append(min(at, len(text)))
        special = specials.strings.get(i)
        if special is not None:
            at += len(special)
            prev = None
            continue
        if prev is None:
            piece = tok.decode([i])
        else:
            alone, pair = tok.decode([prev]), tok.decode([prev, i])
            piece = pair[len(alone):] if pair.startswith(alone) else tok.decode([i])
        at += len(piece)
        prev = i
    return out


def check_ids(ids: Sequence[int], vocab_size: int, where: str, param: str = "prompt"
              ) -> None:
    """A 400 naming the first id outside the vocabulary (`where`: the field's name and
    index, `param` the field)."""
    for j, i in enumerate(ids):
        if not 0 <= i < vocab_size:
            raise BadRequest(f"{where}[{j}]: token id {i} is not in the vocabulary (0 to "
                             f"{vocab_size - 1})", param=param)


def info(tok: TextTokenizer, specials: Specials, name: str, max_tokens: int) -> dict[str, Any]:
    """What `/tokenizer_info` says (vLLM's fields that lm-eval reads, and the ids)."""
    def string(i: int) -> str | None:
        return specials.strings.get(i)

    return {"model": name, "tokenizer_class": type(tok).__name__,
            "kind": tok.kind, "vocab_size": tok.vocab_size,
            "bos_token": string(tok.bos_id), "eos_token": string(tok.eos_id),
            "pad_token": string(tok.pad_id), "unk_token": string(tok.unk_id),
            "bos_token_id": tok.bos_id, "eos_token_id": tok.eos_id,
            "pad_token_id": tok.pad_id, "unk_token_id": tok.unk_id,
            "model_max_length": max_tokens, "add_bos_token": True, "chat_template": None}


def find_stop(text: str, stops: tuple[str, ...], checked: int = 0) -> int | None:
    """Where the earliest stop string starts in `text`, or None; `text[:checked]` is known to
    hold none (only a stop string that ends after it is looked for)."""
    found = [i for i in (text.find(s, max(checked - len(s) + 1, 0)) for s in stops if s)
             if i >= 0]
    return min(found) if found else None


def held(text: str, stops: tuple[str, ...]) -> int:
    """Characters at the end of `text` that could begin a stop string (not sent yet)."""
    best = 0
    for s in stops:
        for k in range(min(len(s) - 1, len(text)), best, -1):
            if text.endswith(s[:k]):
                best = k
                break
    return best
