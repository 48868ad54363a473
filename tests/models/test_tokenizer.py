"""SentencePiece wrapper: fixed specials, round trip, offsets into the original text."""

from __future__ import annotations

import unicodedata
from pathlib import Path

import pytest

from seqserve.models.data.registry import generate
from seqserve.models.errors import DataError, UserError
from seqserve.models.text.tokenizer import ModelType, Tokenizer, train_tokenizer

CORPUS = list(generate("numbers-en-fr", size=300, seed=0).texts()) + list(
    generate("langid", size=320, seed=0).texts()
)
NORMAL = [row["target"] for row in generate("numbers-en-fr", size=300, seed=0).splits["train"]]


@pytest.fixture(scope="module")
def tok(tmp_path_factory: pytest.TempPathFactory) -> Tokenizer:
    path = tmp_path_factory.mktemp("tok") / "tokenizer.model"
    train_tokenizer(CORPUS, path, vocab_size=500, model_type="unigram", seed=0)
    return Tokenizer.load(path)


def test_special_ids_are_fixed(tok: Tokenizer) -> None:
    assert (tok.pad_id, tok.unk_id, tok.bos_id, tok.eos_id) == (0, 1, 2, 3)
    assert [tok.id_to_piece(i) for i in range(4)] == ["<pad>", "<unk>", "<s>", "</s>"]
    ids = [i for text in CORPUS[:50] for i in tok.encode(text)]
    assert not {0, 2, 3} & set(ids)
    assert tok.vocab_size == 500
    with pytest.raises(IndexError):
        tok.id_to_piece(tok.vocab_size)


def test_round_trip_is_the_normalised_text(tok: Tokenizer) -> None:
    for text in CORPUS[:200]:  # English sources are written as people write them
        assert tok.decode(tok.encode(text)) == tok.normalize(text)
    for text in NORMAL[:200]:
        assert tok.decode(tok.encode(text)) == text  # these are already normal
    messy = "  Vingt   ET  un  "
    assert tok.normalize(messy) == "vingt et un"
    assert tok.decode(tok.encode(messy)) == tok.normalize(messy)
    ids = tok.encode("vingt et un")
    assert tok.decode([tok.bos_id, *ids, tok.eos_id, tok.pad_id]) == "vingt et un"


def test_empty_input(tok: Tokenizer) -> None:
    assert tok.encode("") == []
    assert tok.encode_with_offsets("") == []
    assert tok.decode([]) == ""


@pytest.mark.parametrize(
    "text",
    [
        "vingt et un",
        "двадцать один евро",
        "  Ｖｉｎｇｔ   ET  Un ",
        "zweitausendfünf März",
        "ﬁ café",
    ],
)
def test_offsets_slice_the_original_text(tok: Tokenizer, text: str) -> None:
    pieces = tok.encode_with_offsets(text)
    assert [p.id for p in pieces] == tok.encode(text)
    ends = [0]
    for p in pieces:
        assert ends[-1] <= p.start <= p.end <= len(text)  # monotone, in bounds, no overlap
        ends.append(p.end)
    joined = "".join(p.piece for p in pieces if p.id != tok.unk_id).replace("\u2581", "")
    covered = "".join(text[p.start : p.end] for p in pieces if p.id != tok.unk_id)
    assert unicodedata.normalize("NFKC", covered).lower().replace(" ", "") == joined


def test_offsets_are_characters_not_bytes(tok: Tokenizer) -> None:
    text = "двадцать один"
    pieces = tok.encode_with_offsets(text)
    assert pieces[-1].end == len(text)  # 13 characters, 25 bytes
    assert "".join(text[p.start : p.end] for p in pieces) == text
    for p in pieces:  # nothing to normalise here: each span is the piece itself
        assert text[p.start : p.end].strip() == p.piece.lstrip("\u2581")


def test_training_is_deterministic_and_saved(tmp_path: Path) -> None:
    a = train_tokenizer(CORPUS, tmp_path / "a.model", 300, model_type="bpe", seed=1)
    b = train_tokenizer(CORPUS, tmp_path / "b.model", 300, model_type="bpe", seed=1)
    assert a.model_proto == b.model_proto
    assert (tmp_path / "a.model").read_bytes() == a.model_proto
    assert Tokenizer.load(tmp_path / "b.model").encode("vingt et un") == a.encode("vingt et un")


@pytest.mark.parametrize("model_type", ["unigram", "bpe", "word", "char"])
def test_vocab_larger_than_data_allows_shrinks(model_type: ModelType) -> None:
    tok = train_tokenizer(["vingt et un", "vingt deux", "trente"], None, 5000, model_type)
    assert 4 < tok.vocab_size < 5000
    assert tok.decode(tok.encode("vingt et un")) == "vingt et un"


def test_unusable_inputs_are_user_errors(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="no non-empty text"):
        train_tokenizer(["", "  "], None, 100)
    with pytest.raises(DataError, match="cannot train"):
        train_tokenizer(["abcdefghijklmnop"], None, 6)
    bad = tmp_path / "bad.model"
    bad.write_bytes(b"not a model")
    with pytest.raises(UserError, match="bad.model"):
        Tokenizer.load(bad)
    with pytest.raises(UserError, match="missing.model"):
        Tokenizer.load(tmp_path / "missing.model")
