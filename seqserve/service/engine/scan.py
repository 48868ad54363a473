"""The repository as the model control sees it: versions on disk, their files, each model's
version policy, and which versions a server loads at start.

A version folder (`repo/NAME/VERSION/`, VERSION a positive integer) is taken once its
`manifest.json` exists: a bundle writer writes it last (`export.writer`, `seqserve pack`), and
a folder renamed into place whole (`mv .tmp-3 3`) appears with it. Whether every file is
there and intact is the load's business (`load_bundle` checks every sha256): a version that
fails is retried only when its files change, which `fingerprint` tells (names, sizes and
modification times of its files, links followed: no file is read, so a scan is cheap).

`<model>/policy.json` chooses which of a model's versions serve (TF Serving's version
policy): `{"policy": "all"}` (the default, also without the file), `{"policy": "latest",
"n": 2}` (the n highest), `{"policy": "specific", "versions": [1, 3]}`; and optionally
`"default": V`, the version unpinned requests go to while it is ready (else the highest
ready version).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from seqserve.export.manifest import MANIFEST_FILE, BundleError

POLICY_FILE = "policy.json"
Mode = Literal["none", "poll", "explicit"]


@dataclass(frozen=True)
class Policy:
    """Which versions of a model serve, and its default (module doc)."""

    policy: Literal["all", "latest", "specific"] = "all"
    n: int = 1
    versions: tuple[int, ...] = ()
    default: int | None = None

    def wanted(self, versions: Iterable[int]) -> list[int]:
        """The versions of `versions` this policy serves, ascending."""
        found = sorted(set(versions))
        if self.policy == "latest":
            return found[-self.n:]
        if self.policy == "specific":
            return [v for v in found if v in self.versions]
        return found

    def choose_default(self, ready: Iterable[int]) -> int | None:
        """The default among the `ready` versions: the policy's while it is ready, else the
        highest."""
        ready = set(ready)
        if self.default is not None and self.default in ready:
            return self.default
        return max(ready, default=None)


def read_policy(model_dir: Path) -> Policy:
    """`model_dir/policy.json`, or the default policy without one (BundleError: invalid)."""
    path = model_dir / POLICY_FILE
    if not path.is_file():
        return Policy()
    where = f"{model_dir.name}/{POLICY_FILE}"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BundleError(f"{where}: not readable JSON ({exc})") from exc
    if not isinstance(data, dict):
        raise BundleError(f"{where}: must hold a JSON object")
    unknown = set(data) - {"policy", "n", "versions", "default"}
    if unknown:
        raise BundleError(f"{where}: unknown keys {sorted(unknown)}")
    kind = data.get("policy", "all")
    if kind not in ("all", "latest", "specific"):
        raise BundleError(f"{where}: policy must be 'all', 'latest' or 'specific', not {kind!r}")
    n, versions, default = data.get("n", 1), data.get("versions", []), data.get("default")
    if not _count(n):
        raise BundleError(f"{where}: n must be a positive integer, not {n!r}")
    if not isinstance(versions, list) or not all(_count(v) for v in versions):
        raise BundleError(f"{where}: versions must be a list of positive integers")
    if kind == "specific" and not versions:
        raise BundleError(f"{where}: policy 'specific' needs its versions")
    if default is not None and not _count(default):
        raise BundleError(f"{where}: default must be a positive integer, not {default!r}")
    return Policy(kind, n, tuple(versions), default)


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def fingerprint(version_dir: Path) -> str:
    """What changes when a version's files change (module doc)."""
    h = hashlib.sha256()
    try:
        entries = sorted(os.scandir(version_dir), key=lambda e: e.name)
    except OSError:
        return ""
    for entry in entries:
        try:
            st = entry.stat()  # follows links: a relinked file is a changed file
        except OSError:
            continue
        h.update(f"{entry.name}\0{st.st_size}\0{st.st_mtime_ns}\0{st.st_ino}\n".encode())
    return h.hexdigest()[:16]


@dataclass(frozen=True)
class Found:
    """One version folder that holds a manifest."""

    name: str
    version: int
    path: Path
    print: str
    """Its `fingerprint`."""


@dataclass
class ModelDir:
    """One model folder: its complete versions, its policy (or why it cannot be read), and
    the version folders not published yet (no manifest)."""

    name: str
    versions: dict[int, Found] = field(default_factory=dict)
    policy: Policy = Policy()
    error: str | None = None
    pending: list[int] = field(default_factory=list)

    def wanted(self) -> dict[int, Found]:
        """The versions its policy serves (none while its policy file is invalid)."""
        if self.error is not None:
            return {}
        return {v: self.versions[v] for v in self.policy.wanted(self.versions)}


def scan(repo: str | os.PathLike[str], names: Iterable[str] | None = None
         ) -> dict[str, ModelDir]:
    """Every model folder of `repo` (or those of `names`), by name."""
    root = Path(repo)
    only = None if names is None else set(names)
    found: dict[str, ModelDir] = {}
    if not root.is_dir():
        return found
    for model_dir in sorted(root.iterdir()):
        name = model_dir.name
        if name.startswith(".") or not model_dir.is_dir() or (only and name not in only):
            continue
        model = found[name] = ModelDir(name)
        try:
            model.policy = read_policy(model_dir)
        except BundleError as exc:
            model.error = str(exc)
        for vdir in model_dir.iterdir():
            if not (vdir.name.isdigit() and vdir.name.isascii() and vdir.is_dir()):
                continue
            version = int(vdir.name)
            if version < 1:
                continue
            if (vdir / MANIFEST_FILE).is_file():
                model.versions[version] = Found(name, version, vdir, fingerprint(vdir))
            else:
                model.pending.append(version)
    return found


def startup_bundles(repo: str | os.PathLike[str], mode: Mode,
                    load_models: Iterable[str] = ()) -> list[tuple[str, int, Path]]:
    """(name, version, path) of what a server loads at start, by name then version: every
    version its model's policy serves (`explicit`: of the `load_models` only)."""
    names = list(load_models) if mode == "explicit" else None
    if names is not None and not names:
        return []
    out = [(f.name, f.version, f.path) for model in scan(repo, names).values()
           for f in model.wanted().values()]
    return sorted(out, key=lambda t: (t[0], t[1]))

