"""Built-in datasets by name, and loading any dataset spec (name, written folder, user data).

`write_dataset` writes the on-disk format of docs/contracts.md: train/valid/test.jsonl and
meta.json.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from functools import partial
from pathlib import Path

from seqserve.models.data import langid, numbers, tags
from seqserve.models.data.dataset import SPLITS, Dataset
from seqserve.models.data.readers import read_user_data
from seqserve.models.errors import DataError

Generator = Callable[..., Dataset]
BUILTIN: dict[str, Generator] = {
    "langid": langid.generate,
    "numbers-en-fr": partial(numbers.generate, "fr"),
    "numbers-en-de": partial(numbers.generate, "de"),
    "numbers-tags": tags.generate,
}
"""Built-in name -> generator(size=..., seed=...)."""
DEFAULT_SIZES = {
    "langid": langid.DEFAULT_SIZE,
    "numbers-en-fr": numbers.DEFAULT_SIZE,
    "numbers-en-de": numbers.DEFAULT_SIZE,
    "numbers-tags": tags.DEFAULT_SIZE,
}
"""Default train size per built-in."""


def generate(name: str, size: int | None = None, seed: int = 0, values: bool = False) -> Dataset:
    """Generate a built-in dataset; `size` = train examples (default per dataset). With
    `values` each example also names its underlying value ("value")."""
    if name not in BUILTIN:
        raise DataError(f"unknown built-in dataset {name!r}; choose from {sorted(BUILTIN)}")
    if size is not None and size < 1:
        raise DataError(f"size must be at least 1, got {size}")
    return BUILTIN[name](size=size or DEFAULT_SIZES[name], seed=seed, values=values)


def save_dataset(ds: Dataset, out_dir: str | Path) -> Path:
    """Write `ds` as out_dir/{train,valid,test}.jsonl + meta.json; returns out_dir."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for split, rows in ds.splits.items():
        with (out / f"{split}.jsonl").open("w", encoding="utf-8") as f:
            for row in rows:
                f.write(json.dumps(row, ensure_ascii=False) + "\n")
    (out / "meta.json").write_text(json.dumps(ds.meta(), indent=2, ensure_ascii=False) + "\n")
    return out


def write_dataset(name: str, out_dir: str | Path, size: int | None = None, seed: int = 0) -> Path:
    """Generate built-in `name` and write it to `out_dir`; returns out_dir."""
    return save_dataset(generate(name, size=size, seed=seed), out_dir)


def _read_written(folder: Path) -> Dataset:
    """A folder written by `write_dataset` (meta.json + jsonl splits)."""
    try:
        meta = json.loads((folder / "meta.json").read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise DataError(f"{folder / 'meta.json'}: unreadable: {exc}") from exc
    if meta.get("task") == "tagging":
        return tags.read_folder(folder, meta)
    user = read_user_data(folder)  # the same checks as user data, split files required
    for split in SPLITS:
        if not (folder / f"{split}.jsonl").is_file():
            raise DataError(f"{folder}: meta.json present but {split}.jsonl missing")
    if meta.get("task", user.task) != user.task:
        raise DataError(f"{folder / 'meta.json'}: task {meta['task']!r} but files are {user.task}")
    labels = list(meta.get("labels") or user.labels)
    return Dataset(
        str(meta.get("name", folder.name)),
        user.task,
        user.splits,
        labels,
        meta.get("seed"),
        meta.get("size"),
        meta.get("normalization"),
    )


def load_dataset(spec: str | Path, size: int | None = None, seed: int = 0) -> Dataset:
    """A dataset from a built-in name (generated with size/seed), a folder written by
    `write_dataset`, or user data (folder with train/valid/test .csv/.tsv/.jsonl, or a file)."""
    if isinstance(spec, str) and spec in BUILTIN:
        return generate(spec, size=size, seed=seed)
    path = Path(spec)
    if not path.exists():
        raise DataError(
            f"{spec}: neither a built-in dataset ({', '.join(sorted(BUILTIN))}) nor an "
            "existing folder or file"
        )
    if path.is_dir() and (path / "meta.json").is_file():
        return _read_written(path)
    return read_user_data(path)
