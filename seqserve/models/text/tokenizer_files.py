"""Every tokenizer file a bundle may carry, behind one interface (torch-free: the server
imports it).

- SentencePiece `.model` (`seqserve.models.text.tokenizer.Tokenizer`): seqserve's own training
  writes these (special ids pad 0, unk 1, bos 2, eos 3), and a model trained elsewhere loads
  with the ids its manifest declares.
- Hugging Face `tokenizers` `tokenizer.json` (`JsonTokenizer`): character, word, BPE,
  WordPiece and Unigram vocabularies. A text is encoded as the tokenizer's own
  post-processor does (the special tokens the model saw in training, e.g. `[CLS] ... [SEP]`),
  offsets are character spans into the original text (special tokens get an empty span),
  decoding skips special tokens.

`special_ids(path, overrides)` reads a tokenizer file's special ids (pad, unk, bos, eos) from
its special tokens by name; `load_tokenizer(path, kind, specials)` opens a file as a bundle
declares it. Both are what `seqserve pack` and the server use, so they see the same ids.

A tokenizer.json can fail on a text: a backtracking regex in its normalizer or pre-tokenizer
(`(a|aa)+$`, `(x+x+)+y`) makes the Rust library panic ("retry-limit-in-match over") on a
30-character run of one letter, or crawl first. `JsonTokenizer` turns that (pyo3's
PanicException, a BaseException) into `TokenizerFailed` where the library is called;
`probe_tokenizer` runs a tokenizer on adversarial texts under a time budget, and `seqserve
verify` and the server's bundle loading refuse a tokenizer that panics or crawls on them.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from seqserve.models.errors import BundleError, DataError, UserError
from seqserve.models.text.tokenizer import Piece, Tokenizer, class_range, code_runs

KINDS = ("sentencepiece", "tokenizers")
"""Tokenizer kinds of a bundle: SentencePiece .model, Hugging Face tokenizer.json."""
SPECIALS = ("pad", "unk", "bos", "eos")
TOKEN_NAMES: dict[str, tuple[str, ...]] = {
    "pad": ("<pad>", "[PAD]", "<PAD>", "<|pad|>", "PAD"),
    "unk": ("<unk>", "[UNK]", "<UNK>", "<|unk|>", "UNK"),
    "bos": ("<s>", "<bos>", "<BOS>", "<sos>", "<SOS>", "[BOS]", "[CLS]", "<|startoftext|>",
            "<|begin_of_text|>", "SOS"),
    "eos": ("</s>", "<eos>", "<EOS>", "[EOS]", "[SEP]", "<|endoftext|>", "<|end_of_text|>",
            "EOS"),
}
"""The special tokens looked up by name, first found wins (override with pack's --pad-token,
--unk-token, --bos-token, --eos-token)."""
_CONTROL = ("\\x01-\\x20\\x7f-\\x9f\\xa0\\u1680\\u2000-\\u200f\\u2028\\u2029\\u202f\\u205f"
            "\\u3000\\ufeff")


MISSING_UNK = re.compile(r"(\w+) error: Missing \S+ token from the vocabulary")
"""Hugging Face tokenizers' error for a word-level model (WordLevel, WordPiece) whose unknown
token is not in its vocabulary, met on the first word outside it."""
PROBE_BUDGET_S = 0.05
"""Most seconds a tokenizer may take on one probe text (each under 200 characters): a
working one takes well under a millisecond."""
_MIXED = ("Hello Привет مرحبا नमस्ते 你好世界 こんにちは 안녕하세요 Γειά σου שלום "
          "ไทย ქართული Ẓ̌ ﬁ ½ ")
PROBE_TEXTS: tuple[tuple[str, str], ...] = (
    *((f"{c!r} x 32", c * 32) for c in "ax0.- 'é"),
    *((f"{c!r} x 31 then {e!r}", c * 31 + e) for c, e in ("ab", "xy", "x!", "1a", "!a",
                                                           " a", "aA")),
    ("'ab' x 16 then 'c'", "ab" * 16 + "c"),
    ("\"a'\" x 16", "a'" * 16),
    ("'!?' x 16", "!?" * 16),
    ("'...' then a word, x 8", "... word " * 8),
    ("'e' with 31 combining accents", "e" + "\u0301" * 31),
    ("long mixed scripts", (_MIXED * 3)[:180]),
    ("emoji x 16", "\U0001f44d" * 16),
    ("emoji with skin tones and flags", "\U0001f44d\U0001f3fd\U0001f1eb\U0001f1f7" * 6),
    ("zero-width-joined emoji x 6", "\U0001f468\u200d\U0001f469\u200d\U0001f467" * 6),
    ("zero-width joiners between letters", "a\u200db\u200cc\u200b" * 8),
    ("'\\u200d' x 31 then 'a'", "\u200d" * 31 + "a"),
)
"""Texts on which a tokenizer with a backtracking regex panics or crawls: long runs of one
character (then another), repeated punctuation, combining marks, mixed scripts, emoji and
zero-width joiners."""


class TokenizerFailed(DataError):
    """A tokenizer that could not process a text: a Rust panic inside `tokenizers` (a regex
    over its backtracking limit) or an error it raised. The message says why."""


def is_panic(exc: BaseException) -> bool:
    """Whether `exc` is pyo3's PanicException (a Rust panic raised into Python): a
    BaseException, so `except Exception` misses it, and not importable by name."""
    kind = type(exc)
    return kind.__name__ == "PanicException" and kind.__module__ == "pyo3_runtime"


def _failed(exc: BaseException) -> TokenizerFailed:
    lines = str(exc).strip().splitlines()
    why = lines[0][:200] if lines else ""
    return TokenizerFailed(f"{type(exc).__name__}: {why}" if why else type(exc).__name__)


def probe_tokenizer(tok: TextTokenizer, name: str = "tokenizer",
                    budget_s: float = PROBE_BUDGET_S) -> None:
    """Encode (and decode) each of PROBE_TEXTS; BundleError naming the text and what went
    wrong when the tokenizer fails on one (a panic) or takes over `budget_s` on it twice
    (a backtracking regex that would fail or stall every such request). About a millisecond
    for a working tokenizer."""
    with contextlib.suppress(Exception):  # one that fails here fails below, named
        tok.encode("warm up")  # a first call may set things up: not timed
    for label, text in PROBE_TEXTS:
        took = []
        for _ in range(2):  # a slow first run may be this machine: the better of two counts
            start = time.perf_counter()
            try:
                tok.decode(tok.encode(text))
            except Exception as exc:  # TokenizerFailed, or SentencePiece's own errors
                missing = MISSING_UNK.search(str(exc))
                if missing is not None:
                    raise BundleError(
                        f"{name}: its {missing[1]} model has no unknown token in its "
                        "vocabulary, so every word outside the vocabulary fails to encode "
                        f"({label}: {exc}); add the model's unk_token (\"unk_token\" under "
                        "\"model\" in tokenizer.json) to its vocabulary") from exc
                raise BundleError(
                    f"{name}: the tokenizer fails on a short text ({label}: {exc}); a "
                    "backtracking regex in its normalizer or pre-tokenizer? Every text like "
                    "it would fail: fix the tokenizer") from exc
            took.append(time.perf_counter() - start)
            if took[-1] <= budget_s:
                break
        if min(took) > budget_s:
            raise BundleError(
                f"{name}: the tokenizer takes {min(took) * 1000:.0f} ms on a short text "
                f"({label}; the limit is {budget_s * 1000:.0f} ms): a backtracking regex in its "
                "normalizer or pre-tokenizer? Every text like it would stall the server: fix "
                "the tokenizer")


class TextTokenizer(Protocol):
    """What workers and pack need from a tokenizer (SentencePiece or tokenizer.json)."""

    kind: str
    pad_id: int
    unk_id: int
    bos_id: int
    eos_id: int

    @property
    def vocab_size(self) -> int: ...

    def encode(self, text: str) -> list[int]: ...

    def encode_with_offsets(self, text: str) -> list[Piece]: ...

    def decode(self, ids: Iterable[int]) -> str: ...

    def id_to_piece(self, i: int) -> str: ...

    def blank_characters(self) -> str: ...


@dataclass(frozen=True)
class SpecialIds:
    """A tokenizer's special ids as a bundle declares them (-1: the tokenizer has none)."""

    pad_id: int
    unk_id: int
    bos_id: int
    eos_id: int
    vocab_size: int

    def astuple(self) -> tuple[int, int, int, int]:
        return self.pad_id, self.unk_id, self.bos_id, self.eos_id


class JsonTokenizer:
    """A Hugging Face `tokenizers` tokenizer.json with the special ids of its bundle."""

    kind = "tokenizers"

    def __init__(self, tok: Any, specials: tuple[int, int, int, int]) -> None:
        self._tok = tok
        self.pad_id, self.unk_id, self.bos_id, self.eos_id = specials
        self._special = {int(i) for i in tok.get_added_tokens_decoder()
                         if tok.get_added_tokens_decoder()[i].special}
        self._special |= {i for i in specials if i >= 0}
        self._blank: str | None = None

    @classmethod
    def load(cls, path: str | Path, specials: tuple[int, int, int, int] | None = None
             ) -> JsonTokenizer:
        """Open tokenizer.json; `specials` None: read them by name (`special_ids`)."""
        tok = _open_json(Path(path))
        if specials is None:
            specials = _json_specials(tok, {}).astuple()
        return cls(tok, specials)

    @property
    def vocab_size(self) -> int:
        return int(self._tok.get_vocab_size(with_added_tokens=True))

    def encode(self, text: str) -> list[int]:
        """Ids as the tokenizer's post-processor writes them; [] for an empty text.
        TokenizerFailed when the tokenizer cannot process the text."""
        return list(self._encoding(text).ids) if text else []

    def encode_with_offsets(self, text: str) -> list[Piece]:
        if not text:
            return []
        enc = self._encoding(text)
        return [Piece(int(i), str(t), int(a), int(b))
                for i, t, (a, b) in zip(enc.ids, enc.tokens, enc.offsets, strict=True)]

    def words(self, text: str) -> list[tuple[int, int, int]]:
        """The words of the tokenizer's own pre-tokenizer in `text` (a BERT pre-tokenizer
        splits "Hello," into "Hello" and ","), each as (the index of its first token in
        `encode(text)`, start, end), [start, end) a character span of `text`."""
        if not text:
            return []
        enc = self._encoding(text)
        out: dict[int, list[int]] = {}
        for i, (word, (start, end)) in enumerate(zip(enc.word_ids, enc.offsets, strict=True)):
            if word is None:
                continue  # a special token the post-processor added
            if word in out:
                out[word][2] = max(out[word][2], int(end))
            else:
                out[word] = [i, int(start), int(end)]
        return [(first, start, end) for first, start, end in out.values()]

    def _encoding(self, text: str) -> Any:
        try:
            return self._tok.encode(text)
        except Exception as exc:  # tokenizers raises plain Exception
            raise _failed(exc) from exc
        except BaseException as exc:  # a Rust panic (module doc); anything else goes on
            if not is_panic(exc):
                raise
            raise _failed(exc) from exc

    def decode(self, ids: Iterable[int]) -> str:
        """The text of `ids`, special tokens skipped; TokenizerFailed when the tokenizer's
        decoder fails."""
        keep = [int(i) for i in ids if int(i) not in self._special]
        try:
            return str(self._tok.decode(keep, skip_special_tokens=True))
        except Exception as exc:
            raise _failed(exc) from exc
        except BaseException as exc:
            if not is_panic(exc):
                raise
            raise _failed(exc) from exc

    def id_to_piece(self, i: int) -> str:
        piece = self._tok.id_to_token(int(i))
        if piece is None:
            raise IndexError(f"token id {i} out of range [0, {self.vocab_size})")
        return str(piece)

    def blank_characters(self) -> str:
        """Control characters and whitespace, plus what the tokenizer's normalizer removes
        (checked on the Basic Multilingual Plane; computed once)."""
        if self._blank is None:
            extra = ""
            norm = self._tok.normalizer
            if norm is not None:
                ctrl = re.compile(f"[{_CONTROL}]")
                gone = [c for c in range(0x21, 0xD800)
                        if not ctrl.match(chr(c)) and not norm.normalize_str(chr(c)).strip()]
                extra = "".join(class_range(a, b) for a, b in code_runs(gone))
            self._blank = _CONTROL + extra
        return self._blank


def tokenizer_kind(path: str | os.PathLike[str]) -> str:
    """"tokenizers" for a .json file, "sentencepiece" for anything else (.model)."""
    return "tokenizers" if Path(path).suffix.lower() == ".json" else "sentencepiece"


def load_tokenizer(path: str | os.PathLike[str], kind: str | None = None,
                   specials: tuple[int, int, int, int] | None = None) -> TextTokenizer:
    """Open a tokenizer file as a bundle declares it (kind None: from the file suffix;
    specials None: SentencePiece's fixed ids / tokenizer.json's by name)."""
    kind = kind or tokenizer_kind(path)
    if kind not in KINDS:
        raise UserError(f"tokenizer kind {kind!r} is not one of {KINDS}")
    if kind == "tokenizers":
        return JsonTokenizer.load(Path(path), specials)
    if specials is not None and specials == (0, 1, 2, 3):
        specials = None  # seqserve's own: check the file agrees
    return Tokenizer.load(Path(path), specials)


def special_ids(path: str | os.PathLike[str],
                overrides: Mapping[str, str | int | None] | None = None) -> SpecialIds:
    """The special ids of a tokenizer file: read from its special tokens by name
    (`TOKEN_NAMES`), or as `overrides` name them ({"pad": "<blank>"} or {"pad": 0}: a token
    or an id). A special the tokenizer lacks is -1; UserError for an override it lacks."""
    given: dict[str, str | int] = {k: v for k, v in (overrides or {}).items() if v is not None}
    bad = sorted(set(given) - set(SPECIALS))
    if bad:
        raise UserError(f"unknown special token(s) {bad}: choose from {SPECIALS}")
    path = Path(path)
    if tokenizer_kind(path) == "tokenizers":
        return _json_specials(_open_json(path), given)
    import sentencepiece as spm

    try:
        sp = spm.SentencePieceProcessor(model_proto=path.read_bytes())
    except (OSError, RuntimeError) as exc:
        raise UserError(f"{path}: not a SentencePiece model ({exc})") from exc
    found = {"pad": sp.pad_id(), "unk": sp.unk_id(), "bos": sp.bos_id(), "eos": sp.eos_id()}
    size = int(sp.get_piece_size())
    for name, value in given.items():
        found[name] = _resolve(path, name, value, size, lambda t: sp.piece_to_id(t)
                               if sp.id_to_piece(sp.piece_to_id(t)) == t else None)
    return SpecialIds(found["pad"], found["unk"], found["bos"], found["eos"], size)


def _open_json(path: Path) -> Any:
    try:
        from tokenizers import Tokenizer as HFTokenizer
    except ImportError as exc:  # pragma: no cover - a serving dependency
        raise UserError("reading tokenizer.json needs the `tokenizers` package "
                        "(pip install tokenizers)") from exc
    try:
        return HFTokenizer.from_file(str(path))
    except Exception as exc:  # tokenizers raises its own Exception subclass
        raise UserError(f"{path}: not a Hugging Face tokenizer.json ({exc})") from exc


def _json_specials(tok: Any, overrides: Mapping[str, str | int]) -> SpecialIds:
    size = int(tok.get_vocab_size(with_added_tokens=True))
    found: dict[str, int] = {}
    for name in SPECIALS:
        if name in overrides:
            found[name] = _resolve("tokenizer.json", name, overrides[name], size,
                                   tok.token_to_id)
            continue
        found[name] = next((int(i) for t in TOKEN_NAMES[name]
                            if (i := tok.token_to_id(t)) is not None), -1)
    if found["unk"] < 0:
        unk = json.loads(tok.to_str()).get("model", {}).get("unk_token")
        if unk is not None and tok.token_to_id(unk) is not None:
            found["unk"] = int(tok.token_to_id(unk))
    if found["pad"] < 0 and tok.padding is not None:
        found["pad"] = int(tok.padding["pad_id"])
    return SpecialIds(found["pad"], found["unk"], found["bos"], found["eos"], size)


def _resolve(where: Any, name: str, value: str | int, size: int, lookup: Any) -> int:
    """An override as an id: an int (or digits) within the vocabulary, or a token it has."""
    if isinstance(value, int) or (isinstance(value, str) and value.isdigit()):
        i = int(value)
        if not 0 <= i < size:
            raise UserError(f"--{name}-token {value}: id outside the vocabulary [0, {size})")
        return i
    i = lookup(value)
    if i is None:
        raise UserError(f"--{name}-token {value!r}: {where} has no such token")
    return int(i)

