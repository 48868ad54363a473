"""Readers for user data: CSV, TSV and JSONL files with (text, label) or (source, target).

Every problem becomes a `DataError` that names the file and the line (or byte offset): a
missing column, an empty file, bytes that are not UTF-8, a malformed JSON line, an empty
field. Extra columns are kept (e.g. "kind").
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

from seqserve.models.data.dataset import SPLITS, TASK_FIELDS, Dataset, Example, Task, split_of
from seqserve.models.data.tags import check_row
from seqserve.models.errors import DataError

SUFFIXES = (".csv", ".tsv", ".jsonl")
EVAL_FRACTION = 0.1
"""Share of a lone train file carved out for valid and for test (by a hash of the input)."""


def _decode(path: Path) -> str:
    """The file's text; DataError for a missing/empty file or bytes that are not UTF-8."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise DataError(f"{path}: cannot read: {exc.strerror or exc}") from exc
    if not raw.strip():
        raise DataError(f"{path}: file is empty")
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise DataError(
            f"{path} line {line}: not UTF-8: byte 0x{raw[exc.start]:02x} at byte offset "
            f"{exc.start} ({exc.reason}); save the file as UTF-8"
        ) from exc


def _task_of(columns: list[str], path: Path, line: int = 1) -> Task:
    for task, (src, out) in TASK_FIELDS.items():
        if src in columns and out in columns:
            return task  # type: ignore[return-value]
    expected = " or ".join(f"{a!r} and {b!r}" for a, b in TASK_FIELDS.values())
    raise DataError(f"{path} line {line}: missing column: found {columns}, expected {expected}")


def _check(row: Example, fields: tuple[str, str], path: Path, line: int) -> Example:
    for name in fields:
        value = row.get(name)
        if value is None:
            raise DataError(f"{path} line {line}: missing field {name!r}")
        if not isinstance(value, str):
            raise DataError(f"{path} line {line}: {name!r} must be a string, got {value!r}")
        if not value.strip():
            raise DataError(f"{path} line {line}: empty {name!r}")
    if "label" in fields:
        row["label"] = row["label"].strip()  # "en " and "en" are one class
    return row


def _read_delimited(path: Path, text: str, delimiter: str) -> tuple[Task, list[Example]]:
    reader = csv.reader(text.splitlines(keepends=True), delimiter=delimiter)
    header = [h.strip().lower() for h in next(reader)]  # "Text,Label" is fine too
    task = _task_of(header, path)
    fields = TASK_FIELDS[task]
    rows: list[Example] = []
    for values in reader:
        if not any(v.strip() for v in values):
            continue  # blank line
        if len(values) != len(header):
            raise DataError(
                f"{path} line {reader.line_num}: expected {len(header)} fields "
                f"({delimiter!r}-separated), got {len(values)}"
            )
        row = dict(zip(header, values, strict=True))
        if task == "tagging":  # tags column: whitespace-separated, one per word
            rows.append(check_row({**row, "tags": row["tags"].split()},
                                  f"{path} line {reader.line_num}"))
            continue
        rows.append(_check(row, fields, path, reader.line_num))
    return task, rows


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _read_jsonl(path: Path, text: str) -> tuple[Task, list[Example]]:
    task: Task | None = None
    rows: list[Example] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DataError(f"{path} line {number}: malformed JSON: {exc.msg}") from exc
        if not isinstance(obj, dict):
            raise DataError(f"{path} line {number}: expected a JSON object, got {obj!r:.60}")
        if task is None:
            task = _task_of(list(obj), path, number)
        if task == "tagging":
            rows.append(check_row(obj, f"{path} line {number}"))
            continue
        # numbers are fine as labels ({"label": 3}); null, lists and objects are not
        row = {k: str(v) if _is_number(v) else v for k, v in obj.items()}
        row = _check(row, TASK_FIELDS[task], path, number)
        rows.append({k: v if isinstance(v, str) else json.dumps(v) for k, v in row.items()})
    if task is None:
        raise DataError(f"{path}: file is empty")
    return task, rows


def read_file(path: str | Path) -> tuple[Task, list[Example]]:
    """Read one CSV (comma), TSV (tab) or JSONL file -> (task, examples)."""
    path = Path(path)
    if path.suffix not in SUFFIXES:
        raise DataError(f"{path}: unsupported file type {path.suffix!r}; use one of {SUFFIXES}")
    text = _decode(path)
    if path.suffix == ".jsonl":
        task, rows = _read_jsonl(path, text)
    else:
        task, rows = _read_delimited(path, text, "\t" if path.suffix == ".tsv" else ",")
    if not rows:
        raise DataError(f"{path}: no examples after the header")
    return task, rows


def _find(folder: Path, split: str) -> Path | None:
    found = [folder / f"{split}{s}" for s in SUFFIXES if (folder / f"{split}{s}").is_file()]
    if len(found) > 1:
        raise DataError(f"{folder}: several {split} files {[p.name for p in found]}; keep one")
    return found[0] if found else None


def _carve(rows: list[Example], field: str) -> dict[str, list[Example]]:
    """Split one file's rows into train/valid/test by a hash of the input text."""
    splits: dict[str, list[Example]] = {s: [] for s in SPLITS}
    for row in rows:
        splits[split_of(row[field], 0, EVAL_FRACTION)].append(row)
    return splits


def _labels(rows: list[Example], task: str) -> set[str]:
    if task == "tagging":
        return {tag for row in rows for tag in row["tags"]}
    return {row["label"] for row in rows}


def read_user_data(spec: str | Path) -> Dataset:
    """A folder with train.* (and valid.*, test.*) or a single file of user data.

    A missing valid/test (or a single file) is carved out of train by a hash of each input.
    For classification and tagging every valid/test label must occur in train. Tagging rows
    are {"text", "tags": [one tag per whitespace word]} (JSONL) or a whitespace-separated
    `tags` column (CSV/TSV).
    """
    spec = Path(spec)
    files = {s: _find(spec, s) for s in SPLITS} if spec.is_dir() else {"train": spec}
    train = files.get("train")
    if train is None:
        raise DataError(f"{spec}: no train file (train.csv, train.tsv or train.jsonl)")
    task, train_rows = read_file(train)
    src, _ = TASK_FIELDS[task]
    splits = {"train": train_rows}
    for split in ("valid", "test"):
        path = files.get(split)
        if path is None:
            continue
        split_task, splits[split] = read_file(path)
        if split_task != task:
            raise DataError(f"{path}: columns are for {split_task}, but {train} is {task}")
    if "valid" not in splits or "test" not in splits:
        carved = _carve(train_rows, src)
        splits["train"] = carved["train"]
        for split in ("valid", "test"):
            splits.setdefault(split, carved[split])
    labels: list[str] = []
    if task in ("classification", "tagging"):
        labels = sorted(_labels(splits["train"], task))
        for split in ("valid", "test"):
            unseen = sorted(_labels(splits[split], task) - set(labels))
            if unseen:
                raise DataError(
                    f"{files.get(split) or spec}: labels {unseen[:5]} do not occur in train"
                )
    return Dataset(str(spec), task, splits, labels)
