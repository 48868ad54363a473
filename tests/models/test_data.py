"""Built-in datasets: determinism, disjoint splits, balance, correct wording; the CLI."""

from __future__ import annotations

import datetime as dt
import json
from collections import Counter, defaultdict

import pytest
from num2words import num2words

from seqserve.cli import main
from seqserve.models.data import langid, numbers, surface, wording
from seqserve.models.data.dataset import Dataset
from seqserve.models.data.registry import BUILTIN, generate, load_dataset, write_dataset
from seqserve.models.data.sampling import SHARED_BELOW
from seqserve.models.errors import DataError


@pytest.fixture(scope="module")
def langid_small() -> Dataset:
    return generate("langid", size=960, seed=7, values=True)


@pytest.fixture(scope="module", params=["numbers-en-fr", "numbers-en-de"])
def numbers_small(request: pytest.FixtureRequest) -> Dataset:
    return generate(request.param, size=600, seed=7, values=True)


def _value_splits(ds: Dataset) -> dict[str, set[str]]:
    """Underlying value -> the splits it occurs in (the seen-value small-number test rows,
    models/data/surface.py, left out)."""
    where: dict[str, set[str]] = defaultdict(set)
    for split, rows in ds.splits.items():
        for row in rows:
            if row.get("form") == surface.SMALL:
                continue
            for value in row["value"].split("|"):
                where[value].add(split)
    return where


@pytest.mark.parametrize("name", sorted(BUILTIN))
def test_same_seed_same_data_other_seed_other_data(name: str) -> None:
    a = generate(name, size=160, seed=1)
    b = generate(name, size=160, seed=1)
    c = generate(name, size=160, seed=2)
    assert a.splits == b.splits
    assert a.splits["train"] != c.splits["train"]


@pytest.mark.parametrize("name", sorted(BUILTIN))
def test_values_never_shared_between_splits(name: str) -> None:
    ds = generate(name, size=800, seed=3, values=True)
    for value, splits in _value_splits(ds).items():
        if value.isdigit() and int(value) < SHARED_BELOW:
            assert splits == {"train"}, value
        else:
            assert len(splits) == 1, (value, splits)
    for row in ds.splits["test"] + ds.splits["valid"]:
        value = row["value"].split("|")[0]
        if value.isdigit() and int(value) < SHARED_BELOW:
            assert row.get("form") == surface.SMALL, row


def test_split_of_a_value_does_not_depend_on_size() -> None:
    small = _value_splits(generate("numbers-en-fr", size=200, seed=5, values=True))
    large = _value_splits(generate("numbers-en-fr", size=900, seed=5, values=True))
    shared = set(small) & set(large)
    assert len(shared) > 20
    for value in shared:
        assert small[value] == large[value], value


def test_langid_has_every_language_balanced(langid_small: Dataset) -> None:
    assert langid_small.labels == sorted(langid.LANGUAGES)
    assert len(langid_small.labels) >= 12
    for confusable in ("es", "pt", "ca", "it", "da", "no", "sv", "cs", "sk", "ru", "uk"):
        assert confusable in langid_small.labels
    for split, rows in langid_small.splits.items():
        counts = Counter(row["label"] for row in rows)
        assert set(counts) == set(langid_small.labels), split
        assert len(set(counts.values())) == 1, (split, counts)
    assert len(langid_small.splits["train"]) == 960


def test_langid_texts_unambiguous_unique_and_varied(langid_small: Dataset) -> None:
    labels_of: dict[str, set[str]] = defaultdict(set)
    rows = [row for split in langid_small.splits.values() for row in split]
    for row in rows:
        labels_of[row["text"]].add(row["label"])
    assert all(len(labels) == 1 for labels in labels_of.values())
    assert len(labels_of) == len(rows)  # no duplicated (text, label)
    lengths = [len(row["text"].split()) for row in rows]
    assert min(lengths) == 1
    assert 15 <= max(lengths) <= 40
    assert {row["kind"] for row in rows} == set(langid.KINDS)
    assert all(row["text"] == row["text"].lower() for row in rows)


def test_langid_texts_are_the_wording_of_their_value(langid_small: Dataset) -> None:
    for row in langid_small.splits["train"]:
        if row["kind"] == "cardinal":
            expected = num2words(int(row["value"]), lang=row["label"]).replace(",", "")
            assert row["text"] == " ".join(expected.lower().split())
        if row["kind"] == "date":
            day = dt.date.fromisoformat(row["value"])
            assert wording.month_name(day.month, row["label"]) in row["text"]


def test_numbers_pairs_are_the_wording_of_one_value(numbers_small: Dataset) -> None:
    target = numbers_small.name.rsplit("-", 1)[1]
    kinds = Counter(row["kind"] for row in numbers_small.splits["train"])
    assert set(kinds) == set(numbers.KINDS)
    for split, rows in numbers_small.splits.items():
        for row in rows:
            if row["kind"] in ("cardinal", "ordinal", "year"):
                n = int(row["value"])
                to = row["kind"]
                assert row["target"] == wording.normalise(num2words(n, lang=target, to=to))
                if row["form"] == "plain" and split != "train":  # train rows: a random mix
                    assert row["source"] == wording.normalise(num2words(n, lang="en", to=to))
            assert row["target"] == row["target"].lower()
    sources = [row["source"] for rows in numbers_small.splits.values() for row in rows
               if row["form"] != surface.SMALL]
    assert len(sources) == len(set(sources))


def test_numbers_value_ranges(numbers_small: Dataset) -> None:
    cardinals = [
        int(r["value"])
        for rows in numbers_small.splits.values()
        for r in rows
        if r["kind"] == "cardinal"
    ]
    assert min(cardinals) < 100 and max(cardinals) >= 100_000  # log-uniform: both ends
    train = numbers_small.splits["train"]
    years = [dt.date.fromisoformat(r["value"]).year for r in train if r["kind"] == "date"]
    assert min(years) >= 1900 and max(years) <= 2099


@pytest.mark.parametrize(
    ("kind", "value", "lang", "expected"),
    [
        ("cardinal", 21, "fr", "vingt et un"),
        ("cardinal", 21, "de", "einundzwanzig"),
        ("cardinal", 21, "en", "twenty-one"),
        ("ordinal", 21, "de", "einundzwanzigste"),
        ("year", 1987, "en", "nineteen eighty-seven"),
        ("date", dt.date(2005, 3, 21), "en", "the twenty-first of march two thousand and five"),
        ("date", dt.date(2005, 3, 21), "fr", "le vingt et un mars deux mille cinq"),
        ("date", dt.date(2005, 3, 21), "de", "einundzwanzigster märz zweitausendfünf"),
        ("date", dt.date(1999, 7, 1), "fr", "le premier juillet mille neuf cent quatre-vingt-dix-neuf"),  # noqa: E501
        ("currency", (21, 50, "EUR"), "fr", "vingt et un euros et cinquante centimes"),
        ("currency", (1, 1, "USD"), "de", "ein dollar und ein cent"),
        ("currency", (101, 0, "EUR"), "de", "einhundertein euro"),
        ("currency", (0, 5, "USD"), "en", "five cents"),
    ],
)  # fmt: skip
def test_translation_wording(kind: str, value: object, lang: str, expected: str) -> None:
    assert numbers.word(kind, value, lang) == expected


def test_write_then_load_round_trip(tmp_path) -> None:  # type: ignore[no-untyped-def]
    out = write_dataset("numbers-en-de", tmp_path / "d", size=120, seed=4)
    meta = json.loads((out / "meta.json").read_text())
    assert meta["task"] == "translation" and meta["seed"] == 4 and meta["size"] == 120
    loaded = load_dataset(str(out))
    assert loaded.splits == generate("numbers-en-de", size=120, seed=4).splits
    assert meta["counts"] == loaded.counts()


def test_unknown_dataset_is_a_data_error() -> None:
    with pytest.raises(DataError, match="no-such-set"):
        load_dataset("no-such-set")


def test_cli_writes_and_counts(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "langid"
    rc = main(["data", "langid", "--out", str(out), "--size", "160", "--seed", "3", "--show", "1"])
    assert rc == 0
    printed = capsys.readouterr().out
    rows = (out / "train.jsonl").read_text(encoding="utf-8").splitlines()
    assert len(rows) == 160
    assert "train" in printed and "160" in printed and "sv=10" in printed
    assert json.loads(rows[0])["label"] in langid.LANGUAGES
    assert json.loads((out / "meta.json").read_text())["labels"] == sorted(langid.LANGUAGES)


def test_cli_reports_bad_name_without_traceback(capsys) -> None:  # type: ignore[no-untyped-def]
    assert main(["data", "nope"]) == 2
    assert "error: nope" in capsys.readouterr().err
