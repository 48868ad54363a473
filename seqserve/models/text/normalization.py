"""SentencePiece normalization rules, including the project's own, compiled into tokenizer.model.

SentencePiece normalizes text with a character map (longest match, one pass) stored inside
the model file (`normalizer_spec.precompiled_charsmap`), and keeps an alignment from the
normalized text back to the input, so piece offsets still point into what the user sent.
Named rules:

- SentencePiece's own (`nmt_nfkc_cf`, `nmt_nfkc`, `nfkc`, `nfkc_cf`, `identity`).
- `PUNCT_AS_SPACE` ("nmt_nfkc_cf_punct"): `nmt_nfkc_cf` (NFKC, case folding, control
  characters) with the punctuation of `PUNCTUATION` read as a space (so "Ninety-three." and
  "thousand," become "ninety-three" and "thousand") and the Unicode hyphens U+2010/U+2011 read
  as "-". The hyphen itself is kept: French and German number words need it. For data where
  punctuation carries no meaning, such as number phrases.

A custom rule is built by decompiling the base rule's compiled map (a darts-clone double
array trie), changing it and handing SentencePiece's trainer the result as a rule TSV; the
trained tokenizer.model then carries the compiled rule, so the server applies exactly what
training and export saw, with no code of ours on the serving path.
"""

from __future__ import annotations

import io
import struct
from collections.abc import Iterator
from functools import cache

PUNCT_AS_SPACE = "nmt_nfkc_cf_punct"
BUILTIN_RULES = ("nmt_nfkc_cf", "nmt_nfkc", "nfkc", "nfkc_cf", "identity")
RULES = (*BUILTIN_RULES, PUNCT_AS_SPACE)
"""Every normalization name `train_tokenizer` accepts."""
PUNCTUATION = frozenset(
    ",.;:!?\"'`()[]{}"  # ASCII
    "\u2018\u2019\u201a\u201b\u201c\u201d\u201e\u201f"  # curly single and double quotes
    "\u00ab\u00bb\u2039\u203a"  # guillemets
    "\u2026\u00a1\u00bf\u2013\u2014"  # ellipsis, inverted ! and ?, en and em dash
)
"""Characters `PUNCT_AS_SPACE` reads as a space."""
HYPHENS = {"\u2010": "-", "\u2011": "-"}
"""Unicode hyphen and non-breaking hyphen: the ASCII hyphen-minus under `PUNCT_AS_SPACE`."""


def rule_tsv(name: str) -> str | None:
    """The rule TSV of a custom rule (None for SentencePiece's built-in names).

    One line per rule: source code points TAB target code points, each hex, space-separated.
    """
    if name in BUILTIN_RULES:
        return None
    if name != PUNCT_AS_SPACE:
        raise ValueError(f"unknown normalization {name!r}: use one of {', '.join(RULES)}")
    return _punct_as_space_tsv()


@cache
def _punct_as_space_tsv() -> str:
    rules = {key: _punct_as_space(value) for key, value in builtin_rules("nmt_nfkc_cf").items()}
    for char in PUNCTUATION | set(HYPHENS):
        rules[char] = _punct_as_space(char)
    return "".join(f"{_hex(k)}\t{_hex(v)}\n" for k, v in sorted(rules.items()))


def _punct_as_space(text: str) -> str:
    return "".join(" " if c in PUNCTUATION else HYPHENS.get(c, c) for c in text)


def _hex(text: str) -> str:
    return " ".join(f"{ord(c):X}" for c in text)


@cache
def builtin_rules(name: str) -> dict[str, str]:
    """SentencePiece's built-in rule `name` as {source: replacement} (exact: compiling it
    again gives the same bytes)."""
    return decompile(compiled_map(name))


def compiled_map(name: str) -> bytes:
    """The precompiled character map SentencePiece stores for rule `name` (read from a tiny
    model trained with it, the library's only public way to get it)."""
    import sentencepiece as spm
    from sentencepiece import sentencepiece_model_pb2 as model_pb2

    writer = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(["a b c"]), model_writer=writer, vocab_size=7,
        model_type="word", normalization_rule_name=name, hard_vocab_limit=False,
        minloglevel=2)
    proto = model_pb2.ModelProto()  # type: ignore[attr-defined]
    proto.ParseFromString(writer.getvalue())
    return bytes(proto.normalizer_spec.precompiled_charsmap)


def decompile(blob: bytes) -> dict[str, str]:
    """{source: replacement} of a precompiled map.

    Layout: uint32 trie size in bytes, the darts-clone double array (uint32 units) whose keys
    are UTF-8 sources and whose values are offsets of NUL-terminated replacements, then the
    replacements."""
    import numpy as np

    if not blob:
        return {}
    (size,) = struct.unpack_from("<I", blob, 0)
    units = np.frombuffer(blob, dtype="<u4", count=size // 4, offset=4).astype(np.int64)
    strings = blob[4 + size:]
    labels = units & ((1 << 31) | 0xFF)  # a unit's label, with the leaf bit
    offsets = (units >> 10) << ((units & (1 << 9)) >> 6)
    has_leaf = (units >> 8) & 1
    out: dict[str, str] = {}
    for key, node in _nodes(labels, offsets):
        if key and has_leaf[node]:
            start = int(units[node ^ offsets[node]] & ((1 << 31) - 1))
            out[key.decode("utf-8")] = strings[start:strings.index(b"\0", start)].decode("utf-8")
    return out


def _nodes(labels: object, offsets: object) -> Iterator[tuple[bytes, int]]:
    """(key bytes, node index) of every trie node, depth first; a child with byte c of node
    n sits at n ^ offset[n] ^ c and carries label c."""
    import numpy as np

    lab, off = np.asarray(labels), np.asarray(offsets)
    chars = np.arange(1, 256)
    stack: list[tuple[bytes, int]] = [(b"", 0)]
    while stack:
        key, node = stack.pop()
        yield key, node
        children = (node ^ int(off[node])) ^ chars  # (255,)
        inside = children < len(lab)
        found = lab[children[inside]] == chars[inside]
        for c, child in zip(chars[inside][found], children[inside][found], strict=True):
            stack.append((key + bytes([int(c)]), int(child)))
