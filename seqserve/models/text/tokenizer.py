"""SentencePiece tokenizer wrapper (torch-free: the server imports it).

Special ids are fixed for every model: pad=0, unk=1, bos=2, eos=3. `encode` never adds bos or
eos; `decode` skips the specials. `encode_with_offsets` maps each piece back to character
offsets in the ORIGINAL text, although SentencePiece matches pieces on the normalised text
(NFKC, case folding, collapsed whitespace): the encoder's proto output carries byte spans
into the input, which are converted to character spans here.
"""

from __future__ import annotations

import bisect
import io
import re
import tempfile
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import sentencepiece as spm

from seqserve.models.errors import DataError, UserError
from seqserve.models.text.normalization import RULES, rule_tsv

PAD_ID, UNK_ID, BOS_ID, EOS_ID = 0, 1, 2, 3
ModelType = Literal["unigram", "bpe", "word", "char"]
_SPACE = "\u2581"  # SentencePiece's visible space "▁"
_TOO_HIGH = re.compile(r"<= ?(\d+)")


@dataclass(frozen=True)
class Piece:
    """One token: its id, its vocabulary piece, and its span text[start:end] (characters)."""

    id: int
    piece: str
    start: int
    end: int


class Tokenizer:
    """A loaded SentencePiece model; by default with the project's fixed special ids.

    `specials=(pad, unk, bos, eos)` loads a SentencePiece model trained elsewhere with the
    special ids its bundle manifest declares instead (docs/bundle-format.md)."""

    pad_id, unk_id, bos_id, eos_id = PAD_ID, UNK_ID, BOS_ID, EOS_ID
    kind = "sentencepiece"

    def __init__(self, model_proto: bytes,
                 specials: tuple[int, int, int, int] | None = None) -> None:
        self._sp = spm.SentencePieceProcessor(model_proto=model_proto)
        self._blank: str | None = None
        self._pieces: tuple[str, ...] | None = None  # every id's piece, read once (`pieces`)
        self.model_proto = model_proto
        """The serialized model (the bytes of tokenizer.model)."""
        if specials is not None:
            self.pad_id, self.unk_id, self.bos_id, self.eos_id = specials
            return
        specials = (self._sp.pad_id(), self._sp.unk_id(), self._sp.bos_id(), self._sp.eos_id())
        if specials != (PAD_ID, UNK_ID, BOS_ID, EOS_ID):
            raise UserError(
                f"tokenizer special ids are {specials} (pad, unk, bos, eos); expected "
                f"{(PAD_ID, UNK_ID, BOS_ID, EOS_ID)}: train it with "
                "seqserve.models.text.tokenizer.train_tokenizer"
            )

    @classmethod
    def load(cls, path: str | Path,
             specials: tuple[int, int, int, int] | None = None) -> Tokenizer:
        """Load tokenizer.model from disk (`specials`: see the class doc)."""
        try:
            data = Path(path).read_bytes()
        except OSError as exc:
            raise UserError(f"{path}: cannot read tokenizer: {exc.strerror or exc}") from exc
        try:
            return cls(data, specials)
        except (RuntimeError, OSError) as exc:  # sentencepiece: "could not parse ModelProto"
            raise UserError(f"{path}: not a SentencePiece model ({exc})") from exc

    def save(self, path: str | Path) -> Path:
        """Write tokenizer.model to `path`."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(self.model_proto)
        return path

    def blank_characters(self) -> str:
        """The characters this tokenizer drops, as a regex class body (`\\x01-\\x20...`):
        those its normalization turns into nothing or whitespace (control and format
        characters, spaces, and punctuation under `nmt_nfkc_cf_punct`), over the planes where
        Unicode puts such characters (0, 1 and 14). A text made only of them has no tokens.
        Computed once (about 0.1 s)."""
        if self._blank is None:
            planes = (range(1, 0xD800), range(0xE000, 0x20000), range(0xE0000, 0xF0000))
            blank = [c for plane in planes for c in plane
                     if not self._sp.normalize(chr(c)).replace("\u2581", " ").strip()]
            self._blank = "".join(class_range(a, b) for a, b in code_runs(blank))
        return self._blank

    @property
    def vocab_size(self) -> int:
        """Number of ids, specials included."""
        return int(self._sp.get_piece_size())

    def encode(self, text: str) -> list[int]:
        """Token ids of `text` (no bos/eos); [] for an empty or blank text."""
        return list(self._sp.encode(text)) if text else []

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        """`encode` over many texts."""
        return [self.encode(t) for t in texts]

    def encode_with_offsets(self, text: str) -> list[Piece]:
        """Pieces with character spans into `text`. A piece that only stands for a removed
        space (the dummy prefix) has an empty span at the next piece's start."""
        if not text:
            return []
        proto = self._sp.encode(text, out_type="proto")
        char_at = _byte_to_char(text)
        return [Piece(int(p.id), p.piece, char_at(p.begin), char_at(p.end)) for p in proto.pieces]

    def decode(self, ids: Iterable[int]) -> str:
        """Text of `ids`; pad/bos/eos are skipped."""
        skip = (self.pad_id, self.bos_id, self.eos_id)
        return str(self._sp.decode([i for i in map(int, ids) if i not in skip]))

    def id_to_piece(self, i: int) -> str:
        """The vocabulary piece of id `i` (e.g. "▁vingt")."""
        pieces = self.pieces()
        if not 0 <= i < len(pieces):
            raise IndexError(f"token id {i} out of range [0, {len(pieces)})")
        return pieces[i]

    def pieces(self) -> tuple[str, ...]:
        """Every id's piece, by id (read from the model once: an answer's tokens are looked
        up here, not through a call into sentencepiece per token)."""
        if self._pieces is None:
            sp = self._sp
            self._pieces = tuple(str(sp.id_to_piece(i)) for i in range(sp.get_piece_size()))
        return self._pieces

    def normalize(self, text: str) -> str:
        """`text` as the tokenizer sees it (NFKC, case folding, collapsed spaces): what
        decode(encode(text)) gives back when every character is in the vocabulary."""
        return str(self._sp.normalize(text)).replace(_SPACE, " ").strip()


def _byte_to_char(text: str) -> Callable[[int], int]:
    """A function mapping a UTF-8 byte offset in `text` to its character offset."""
    starts = [0]  # byte offset where each character starts, plus the end
    for ch in text:
        starts.append(starts[-1] + len(ch.encode("utf-8")))

    def char_at(byte_offset: int) -> int:
        return bisect.bisect_left(starts, byte_offset)

    return char_at


def _sentences(texts: Iterable[str], strip: bool = True) -> Iterator[str]:
    for t in texts:
        t = t.strip() if strip else t
        if t.strip():
            yield t


def train_tokenizer(
    texts: Iterable[str],
    out_path: str | Path | None,
    vocab_size: int,
    model_type: ModelType = "unigram",
    character_coverage: float = 1.0,
    seed: int = 0,
    num_threads: int = 1,
    normalization: str = "nmt_nfkc_cf",
    min_vocab_size: int = 8,
) -> Tokenizer:
    """Train a SentencePiece model in-process, deterministically, and save it to `out_path`.

    `normalization` is a rule of models/text/normalization.py: "nmt_nfkc_cf" (default: NFKC +
    lowercase, the built-in datasets are lowercase), "nmt_nfkc" (keeps case), "identity", or
    "nmt_nfkc_cf_punct" (nmt_nfkc_cf with punctuation read as a space). The rule is compiled
    into the model, so loading it needs nothing else.
    `model_type="char"` keeps every space as a piece ("▁") and adds no leading "▁" piece
    (no dummy prefix, no whitespace collapsing), so a character model sees the text as
    written; the setting is compiled into the model (older char models keep theirs).
    If the data cannot fill `vocab_size`, training is retried with the largest size
    SentencePiece reports as possible (or half the size) down to `min_vocab_size`.
    """
    if normalization not in RULES:
        raise UserError(f"unknown normalization {normalization!r}: use one of {', '.join(RULES)}")
    corpus = list(_sentences(texts, strip=model_type != "char"))
    if not corpus:
        raise DataError("cannot train a tokenizer: no non-empty text")
    size = vocab_size
    while True:
        try:
            proto = _train_once(
                corpus, size, model_type, character_coverage, seed, num_threads, normalization
            )
            break
        except RuntimeError as exc:
            found = _TOO_HIGH.search(str(exc))
            smaller = int(found.group(1)) if found else size // 2
            if smaller >= size or smaller < min_vocab_size:
                raise DataError(f"cannot train a {model_type} tokenizer: {exc}") from exc
            size = smaller
    tok = Tokenizer(proto)
    if out_path is not None:
        tok.save(out_path)
    return tok


def _train_once(
    corpus: list[str],
    vocab_size: int,
    model_type: str,
    character_coverage: float,
    seed: int,
    num_threads: int,
    normalization: str,
) -> bytes:
    spm.set_random_generator_seed(seed)
    writer = io.BytesIO()
    rules = rule_tsv(normalization)
    with tempfile.TemporaryDirectory() as tmp:
        rule_path = Path(tmp) / "rules.tsv"
        if rules is not None:
            rule_path.write_text(rules, encoding="utf-8")
        _train_spm(corpus, writer, vocab_size, model_type, character_coverage, num_threads,
                   {"normalization_rule_tsv": str(rule_path)} if rules is not None
                   else {"normalization_rule_name": normalization})
    return writer.getvalue() if rules is None else _named(writer.getvalue(), normalization)


def _named(model: bytes, normalization: str) -> bytes:
    """`model` with its normalizer named (SentencePiece names a rule TSV "user_defined")."""
    from sentencepiece import sentencepiece_model_pb2 as model_pb2

    proto = model_pb2.ModelProto()  # type: ignore[attr-defined]
    proto.ParseFromString(model)
    proto.normalizer_spec.name = normalization
    return bytes(proto.SerializeToString())


def _train_spm(corpus: list[str], writer: io.BytesIO, vocab_size: int, model_type: str,
               character_coverage: float, num_threads: int, rule: dict[str, str]) -> None:
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(corpus),
        model_writer=writer,
        vocab_size=vocab_size,
        model_type=model_type,
        character_coverage=character_coverage,
        pad_id=PAD_ID,
        unk_id=UNK_ID,
        bos_id=BOS_ID,
        eos_id=EOS_ID,
        hard_vocab_limit=False,
        num_threads=num_threads,
        input_sentence_size=0,
        shuffle_input_sentence=False,
        max_sentence_length=1 << 16,
        minloglevel=2,
        # a character model sees the text as written: spaces kept, no "▁" prefix piece
        add_dummy_prefix=model_type != "char",
        remove_extra_whitespaces=model_type != "char",
        **rule,  # type: ignore[arg-type]
    )


def code_runs(codes: list[int]) -> Iterator[tuple[int, int]]:
    """Consecutive runs [a, b] of sorted code points."""
    start = prev = None
    for c in codes:
        if prev is not None and c == prev + 1:
            prev = c
            continue
        if start is not None and prev is not None:
            yield start, prev
        start = prev = c
    if start is not None and prev is not None:
        yield start, prev


def class_range(a: int, b: int) -> str:
    """A regex class item for [a, b], in escapes both Python and ECMA regexes read."""
    def esc(c: int) -> str:
        if c < 0x100:
            return f"\\x{c:02x}"
        return f"\\u{c:04x}" if c < 0x10000 else f"\\U{c:08x}"

    return esc(a) if a == b else f"{esc(a)}-{esc(b)}"
