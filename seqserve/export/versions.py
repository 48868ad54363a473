"""A model repository's version folders, as export writes them and the server lists them:
`REPO/NAME/VERSION/` with a manifest.json, VERSION a positive integer."""

from __future__ import annotations

import os
from pathlib import Path

from seqserve.export.manifest import MANIFEST_FILE


def list_bundles(repo: str | os.PathLike[str]) -> list[tuple[str, int, Path]]:
    """(name, version, path) of every `repo/NAME/VERSION/` holding a manifest.json.

    Version folders are positive integers; other folders (including the temporary folders an
    export writes before its atomic rename, which start with ".") are skipped. Sorted by name,
    then version ascending.
    """
    root = Path(repo)
    if not root.is_dir():
        return []
    found: list[tuple[str, int, Path]] = []
    for model_dir in sorted(root.iterdir()):
        if not model_dir.is_dir() or model_dir.name.startswith("."):
            continue
        for vdir in model_dir.iterdir():
            if not (vdir.is_dir() and vdir.name.isdigit() and vdir.name.isascii()):
                continue
            version = int(vdir.name)
            if version >= 1 and (vdir / MANIFEST_FILE).is_file():
                found.append((model_dir.name, version, vdir))
    return sorted(found, key=lambda t: (t[0], t[1]))


def next_version(repo: str | os.PathLike[str], name: str) -> int:
    """One more than the highest integer version folder of `name` (1 when there is none)."""
    model_dir = Path(repo) / name
    if not model_dir.is_dir():
        return 1
    versions = [
        int(p.name) for p in model_dir.iterdir()
        if p.is_dir() and p.name.isdigit() and p.name.isascii()
    ]
    return max(versions, default=0) + 1
