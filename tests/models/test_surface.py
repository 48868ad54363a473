"""Surface forms of the number datasets: every form in every split, held-out rows that show
exactly their form, one target per value whatever the form, tags aligned with words."""

from __future__ import annotations

import datetime as dt
import random
import re
from collections import defaultdict

import pytest

from seqserve.models.data import english, numbers, surface, tags
from seqserve.models.data.dataset import Dataset
from seqserve.models.data.english import LEXICON, Words
from seqserve.models.data.registry import generate
from seqserve.models.data.sampling import split_for
from seqserve.models.data.surface import FORMS, SMALL, Style
from seqserve.models.data.values import KINDS
from seqserve.models.text.normalization import PUNCT_AS_SPACE

MONTHS = {"january", "february", "march", "april", "may", "june", "july", "august",
          "september", "october", "november", "december"}


@pytest.fixture(scope="module")
def fr() -> Dataset:
    return generate("numbers-en-fr", size=1200, seed=3, values=True)


@pytest.fixture(scope="module")
def tagged() -> Dataset:
    return generate("numbers-tags", size=1200, seed=3, values=True)


def _bare(word: str) -> str:
    """A written word as its dictionary form: punctuation stripped, lower case."""
    return re.sub(r"[^a-z-]", "", word.lower())


def test_every_form_in_every_split(fr: Dataset, tagged: Dataset) -> None:
    for ds in (fr, tagged):
        assert ds.normalization == PUNCT_AS_SPACE
        assert ds.meta()["normalization"] == PUNCT_AS_SPACE
        for split, rows in ds.splits.items():
            forms = {row["form"] for row in rows}
            assert forms == set(FORMS) | ({SMALL} if split == "test" else set()), split
        assert {row["kind"] for row in ds.splits["test"]} == set(KINDS)


def test_held_out_values_never_reach_training(fr: Dataset) -> None:
    where = defaultdict(set)
    for split, rows in fr.splits.items():
        for row in rows:
            if row["form"] != SMALL:
                where[row["value"]].add(split)
                assert split_for(_key(row["value"]), 3) == split
    assert all(len(splits) == 1 for splits in where.values())


def _key(value: str) -> int | str:
    return int(value) if value.isdigit() else value


def test_held_out_rows_show_exactly_their_form(fr: Dataset) -> None:
    checks = {
        "commas": lambda s: "," in s and s == s.lower(),
        "no_and": lambda s: " and " not in f" {s} " or s.endswith(("cents", "cent")),
        "spaced": lambda s: "-" not in s,
        "article": lambda s: s.startswith(("a hundred", "a thousand")),
        "capitalised": lambda s: s[0].isupper() and s[1:] == s[1:].lower(),
        "upper": lambda s: s == s.upper(),
        "title": lambda s: all(w[0].isupper() for w in s.split()),
        "full_stop": lambda s: s.endswith(".") and s[:-1] == s[:-1].lower(),
        "punctuated": lambda s: not s[0].isalpha() or not s[-1].isalpha(),
        "spaces": lambda s: s != " ".join(s.split()),
        "plain": lambda s: re.fullmatch(r"[a-z]+(?:[ -][a-z]+)*", s) is not None,
    }
    for split in ("valid", "test"):
        for row in fr.splits[split]:
            check = checks.get(row["form"])
            assert check is None or check(row["source"]), row
            if row["form"] in ("no_and", "spaced", "commas", "article") and (
                    row["kind"] != "currency"):  # (an amount's value is not in the row)
                kind, value = row["kind"], _value(row)
                assert row["source"] != " ".join(w for w, _ in english.phrase(kind, value,
                                                                             Words())), row


def _value(row: dict[str, str]) -> object:
    if row["kind"] == "date":
        return dt.date.fromisoformat(row["value"])
    return int(row["value"])


def test_one_target_per_value_in_every_form(fr: Dataset) -> None:
    targets: dict[tuple[str, str], set[str]] = defaultdict(set)
    for rows in fr.splits.values():
        for row in rows:
            if row["kind"] != "currency":  # (its value names only the units)
                targets[row["kind"], row["value"]].add(row["target"])
            if row["kind"] in ("cardinal", "ordinal", "year"):
                assert row["target"] == numbers.word(row["kind"], int(row["value"]), "fr")
    assert all(len(t) == 1 for t in targets.values())


def test_tags_align_with_words_in_every_form(tagged: Dataset) -> None:
    fixed = {"article": {"the", "a"}, "prep": {"of"}, "month": MONTHS,
             "currency": {"euro", "euros", "dollar", "dollars"}, "cents": {"cent", "cents"}}
    for rows in tagged.splits.values():
        for row in rows:
            words = row["text"].split()
            assert len(words) == len(row["tags"]), row
            for word, tag in zip(words, row["tags"], strict=True):
                bare = _bare(word)
                if tag in fixed:
                    assert bare in fixed[tag], (word, tag, row)
                elif tag == "ordinal":
                    assert bare.endswith(("th", "st", "nd", "rd")), (word, row)
                elif tag != "year":
                    assert LEXICON[bare.split("-")[0]] == tag, (word, tag, row)


def test_english_styles_word_by_word() -> None:
    def words(kind: str, value: object, **style: bool) -> str:
        return " ".join(w for w, _ in english.phrase(kind, value, Words(**style)))

    assert words("cardinal", 1593) == "one thousand five hundred and ninety-three"
    assert words("cardinal", 1593, commas=True) == "one thousand, five hundred and ninety-three"
    assert words("cardinal", 1593, conj=False) == "one thousand five hundred ninety-three"
    assert words("cardinal", 1593, article=True) == "a thousand five hundred and ninety-three"
    assert words("cardinal", 593, article=True) == "five hundred and ninety-three"
    assert words("ordinal", 21, hyphens=False) == "twenty first"
    assert words("year", 1905, hyphens=False) == "nineteen oh five"
    assert words("year", 2005, conj=False) == "two thousand five"
    assert words("currency", (100, 5, "EUR"), article=True) == "a hundred euros and five cents"
    assert words("date", dt.date(2005, 3, 21), commas=True) == (
        "the twenty-first of march, two thousand and five")
    assert tags.tagged("ordinal", 21, Words(hyphens=False))[1] == ["ten", "ordinal"]
    assert tags.tagged("cardinal", 121, Words(article=True, hyphens=False))[1] == [
        "article", "hundred", "conj", "ten", "unit"]


def test_render_keeps_one_tag_per_whitespace_word() -> None:
    tokens = english.phrase("cardinal", 21_000, Words(hyphens=False))
    for style in (Style(case="title", prefix="(", suffix=")."), Style(case="upper", spacing=7),
                  Style(case="capital", prefix="\u201c", suffix="\u201d")):
        text, labels = surface.render(tokens, style)
        assert len(text.split()) == len(labels) == 3
        assert [_bare(w) for w in text.split()] == ["twenty", "one", "thousand"]


def test_small_rows_are_every_number_below_100_twice() -> None:
    rows = surface.small_phrases(random.Random(0))
    assert sorted(p.key for p in rows) == sorted([*range(100)] * 2)
    assert all(p.form == SMALL and p.kind == "cardinal" for p in rows)
    assert len({p.text for p in rows}) == len(rows)  # two distinct forms per number
