"""User data readers: CSV, TSV, JSONL; every bad input is a DataError naming file and line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from seqserve.models.data.readers import read_file, read_user_data
from seqserve.models.data.registry import load_dataset
from seqserve.models.errors import DataError


def _write(path: Path, text: str | bytes) -> Path:
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text, encoding="utf-8")
    return path


def test_csv_with_quotes_commas_and_newlines(tmp_path: Path) -> None:
    path = _write(tmp_path / "train.csv", 'Text,Label\n"hello, world",en \n"two\nlines",fr\n')
    task, rows = read_file(path)
    assert task == "classification"
    assert rows == [{"text": "hello, world", "label": "en"}, {"text": "two\nlines", "label": "fr"}]


def test_tsv_translation_with_extra_column(tmp_path: Path) -> None:
    path = _write(tmp_path / "train.tsv", "source\ttarget\tkind\none\tun\tcardinal\n\n")
    task, rows = read_file(path)
    assert task == "translation"
    assert rows == [{"source": "one", "target": "un", "kind": "cardinal"}]


def test_jsonl_with_bom_blank_lines_and_number_labels(tmp_path: Path) -> None:
    lines = [
        json.dumps({"text": "dvacet", "label": "cs"}),
        "",
        json.dumps({"text": "x", "label": 7}),
    ]
    path = _write(tmp_path / "d.jsonl", ("\n".join(lines) + "\n").encode("utf-8-sig"))
    task, rows = read_file(path)
    assert task == "classification"
    assert [r["label"] for r in rows] == ["cs", "7"]


def test_folder_with_three_splits(tmp_path: Path) -> None:
    for split, n in (("train", 4), ("valid", 2), ("test", 2)):
        body = "".join(f"t{split}{i},{'ab'[i % 2]}\n" for i in range(n))
        _write(tmp_path / f"{split}.csv", "text,label\n" + body)
    ds = load_dataset(str(tmp_path))
    assert ds.task == "classification"
    assert ds.counts() == {"train": 4, "valid": 2, "test": 2}
    assert ds.labels == ["a", "b"]


def test_single_file_is_carved_into_disjoint_splits(tmp_path: Path) -> None:
    body = "".join(f"s{i}\tt{i}\n" for i in range(300))
    ds = read_user_data(_write(tmp_path / "all.tsv", "source\ttarget\n" + body))
    sources = {s: {r["source"] for r in rows} for s, rows in ds.splits.items()}
    assert sum(len(v) for v in sources.values()) == 300
    assert not (sources["train"] & sources["valid"] or sources["train"] & sources["test"])
    assert sources["valid"] and sources["test"]
    assert read_user_data(tmp_path / "all.tsv").splits == ds.splits  # deterministic


@pytest.mark.parametrize(
    ("name", "content", "pattern"),
    [
        ("train.csv", "text,lbl\nhi,en\n", r"train\.csv line 1: missing column.*'label'"),
        ("train.tsv", "", r"train\.tsv: file is empty"),
        ("train.jsonl", "\n \n", r"train\.jsonl: file is empty"),
        ("train.csv", "text,label\n", r"train\.csv: no examples"),
        ("train.csv", "text,label\nok,en\n ,fr\n", r"train\.csv line 3: empty 'text'"),
        ("train.csv", "text,label\nok,en\nfoo\n", r"train\.csv line 3: expected 2 fields"),
        ("train.jsonl", '{"text": "a", "label": "b"}\n{"text": "a",\n', r"line 2: malformed JSON"),
        ("train.jsonl", '{"text": "a", "label": "b"}\n[1, 2]\n', r"line 2: expected a JSON object"),
        ("train.jsonl", '{"text": "a", "label": "b"}\n{"text": ""}\n', r"line 2: empty 'text'"),
        ("train.jsonl", '\n{"source": "a"}\n', r"line 2: missing column"),
        ("train.jsonl", '{"text": "a", "label": null}\n', r"line 1: missing field 'label'"),
        ("train.jsonl", '{"text": ["a"], "label": 1}\n', r"line 1: 'text' must be a string"),
        ("train.jsonl", '{"text": "a", "label": "b"}\n{"text": "c"}\n', r"missing field 'label'"),
        ("train.txt", "a,b\n", r"unsupported file type '\.txt'"),
    ],
)  # fmt: skip
def test_bad_files_name_file_and_line(
    tmp_path: Path, name: str, content: str, pattern: str
) -> None:
    with pytest.raises(DataError, match=pattern):
        read_file(_write(tmp_path / name, content))


def test_non_utf8_names_the_byte_offset_and_line(tmp_path: Path) -> None:
    data = b"text,label\nok,en\nbad \xe9t\xe9,fr\n"
    path = _write(tmp_path / "train.csv", data)
    with pytest.raises(DataError) as info:
        read_file(path)
    message = str(info.value)
    assert str(path) in message
    assert f"byte offset {data.index(0xE9)}" in message
    assert "line 3" in message and "0xe9" in message


def test_label_missing_from_train_is_reported(tmp_path: Path) -> None:
    _write(tmp_path / "train.csv", "text,label\na,x\nb,y\n")
    _write(tmp_path / "valid.csv", "text,label\nc,x\n")
    _write(tmp_path / "test.csv", "text,label\nd,z\n")
    with pytest.raises(DataError, match=r"test\.csv: labels \['z'\] do not occur in train"):
        load_dataset(str(tmp_path))


def test_mixed_tasks_and_missing_train(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="no train file"):
        load_dataset(str(tmp_path))
    _write(tmp_path / "train.csv", "text,label\na,x\n")
    _write(tmp_path / "valid.jsonl", '{"source": "a", "target": "b"}\n')
    with pytest.raises(DataError, match=r"valid\.jsonl: columns are for translation"):
        load_dataset(str(tmp_path))
