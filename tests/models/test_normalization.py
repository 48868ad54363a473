"""Tokenizer normalization rules: SentencePiece's built-in rule decompiled exactly, the
punctuation rule compiled into tokenizer.model, and offsets into the text the user sent."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
import sentencepiece as spm
from sentencepiece import sentencepiece_model_pb2 as model_pb2

from seqserve.models.data.registry import generate
from seqserve.models.errors import UserError
from seqserve.models.text import normalization
from seqserve.models.text.normalization import PUNCT_AS_SPACE
from seqserve.models.text.tokenizer import Tokenizer, train_tokenizer
from seqserve.models.text.word_align import align

PLAIN = "one thousand five hundred and ninety-three"
MESSY = [
    "One thousand, five hundred and ninety-three.",
    '"ONE THOUSAND, FIVE HUNDRED AND NINETY-THREE!"',
    "  one   thousand,five hundred\tand ninety\u2011three ...",
    "(One Thousand, Five Hundred And Ninety-Three)\u2026",
    "\u201cone thousand \u2014 five hundred and ninety-three\u201d ?",
]


@pytest.fixture(scope="module")
def tok(tmp_path_factory: pytest.TempPathFactory) -> Tokenizer:
    """A unigram tokenizer on number phrases with the punctuation rule, loaded from disk."""
    path = tmp_path_factory.mktemp("tok") / "tokenizer.model"
    texts = list(generate("numbers-en-fr", size=300, seed=0).texts())
    train_tokenizer(texts, path, 300, model_type="unigram", normalization=PUNCT_AS_SPACE)
    return Tokenizer.load(path)


def _compile(tsv: str, tmp_path: Path) -> bytes:
    rules = tmp_path / "rules.tsv"
    rules.write_text(tsv, encoding="utf-8")
    writer = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(["a b c"]), model_writer=writer,
                                   vocab_size=7, model_type="word", hard_vocab_limit=False,
                                   normalization_rule_tsv=str(rules), minloglevel=2)
    proto = model_pb2.ModelProto()  # type: ignore[attr-defined]
    proto.ParseFromString(writer.getvalue())
    return bytes(proto.normalizer_spec.precompiled_charsmap)


def test_builtin_rule_decompiles_exactly(tmp_path: Path) -> None:
    rules = normalization.builtin_rules("nmt_nfkc_cf")
    assert rules["A"] == "a" and rules["\uff21"] == "a"  # case folding, NFKC full width
    tsv = "".join(f"{normalization._hex(k)}\t{normalization._hex(v)}\n"
                  for k, v in sorted(rules.items()))
    assert _compile(tsv, tmp_path) == normalization.compiled_map("nmt_nfkc_cf")


def test_punctuation_case_and_spacing_reach_the_model_as_the_plain_phrase(
        tok: Tokenizer) -> None:
    for text in MESSY:
        assert tok.normalize(text) == PLAIN, text
        assert tok.encode(text) == tok.encode(PLAIN), text
    assert tok.normalize("quatre-vingt-dix") == "quatre-vingt-dix"  # hyphens are words here
    assert tok.decode(tok.encode("quatre-vingt-dix-huit")) == "quatre-vingt-dix-huit"
    assert tok.encode("...") == [] and tok.encode(" , ") == []


def test_the_rule_travels_inside_the_model_file(tok: Tokenizer, tmp_path: Path) -> None:
    proto = model_pb2.ModelProto()  # type: ignore[attr-defined]
    proto.ParseFromString(tok.model_proto)
    assert proto.normalizer_spec.name == PUNCT_AS_SPACE
    again = Tokenizer.load(tok.save(tmp_path / "copy.model"))
    assert [again.encode(t) for t in MESSY] == [tok.encode(t) for t in MESSY]


@pytest.mark.parametrize("text", [*MESSY, "Ninety-three.", "  twenty  one ,  "])
def test_offsets_point_into_the_text_the_user_sent(tok: Tokenizer, text: str) -> None:
    pieces = tok.encode_with_offsets(text)
    end = 0
    for p in pieces:
        assert end <= p.start <= p.end <= len(text)  # monotone, in bounds, no overlap
        end = p.end
        # a span holds its piece plus the spaces / punctuation before it that it stands for
        assert tok.normalize(text[p.start : p.end]).replace(" ", "") == p.piece.lstrip("\u2581")
    for word in align(text, pieces):
        assert text[word.start : word.end] == word.text
        if any(c.isalpha() for c in word.text):
            first = pieces[word.piece]
            assert word.start <= first.end <= word.end  # its own piece, ending inside it
        else:
            assert word.piece == -1  # punctuation alone: no piece, not the next word's


def test_attached_punctuation_stays_with_its_word(tok: Tokenizer) -> None:
    text = '"Two hundred and ninety-three."'
    words = align(text, tok.encode_with_offsets(text))
    assert [w.text for w in words] == ['"Two', "hundred", "and", 'ninety-three."']
    assert all(w.piece >= 0 for w in words)
    assert len({w.piece for w in words}) == 4


def test_unknown_rule_is_a_user_error() -> None:
    with pytest.raises(UserError, match="no-such-rule"):
        train_tokenizer(["one two"], None, 10, normalization="no-such-rule")
    with pytest.raises(ValueError, match="no-such-rule"):
        normalization.rule_tsv("no-such-rule")
    assert normalization.rule_tsv("nmt_nfkc_cf") is None
