"""The one bundle writer: how `seqserve export` (export/bundle.py) and `seqserve pack`
(export/pack/bundle.py) put a bundle folder on disk (`write_bundle`).

A bundle is written into a hidden temporary folder beside its version folder
(`staged_version`); the caller writes its files there (graphs, tokenizers) and names them in
a manifest; the writer stamps that manifest (created, libraries, every file's sha256), writes
it last and reads it back verified (schema, declared signatures, every file's hash), runs the
caller's checks (signatures as ONNX Runtime sees them, parity, batch invariance) and records
their parity report the same way; only then is the folder renamed to its version number,
atomically: a half-written bundle never appears under a version name, and a version is never
overwritten.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import platform
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from seqserve.export.manifest import (
    Manifest,
    hash_files,
    load_bundle,
    write_manifest,
)
from seqserve.export.versions import next_version
from seqserve.models.errors import BundleError, UserError

FORMATS = ("onnx", "torchscript")
SUFFIX = {"onnx": ".onnx", "torchscript": ".pt"}


def check_args(name: str, version: int | None, formats: tuple[str, ...] | list[str]
               ) -> tuple[str, ...]:
    """The bundle's folder name, version and formats, checked; the formats deduplicated."""
    if not name or name.startswith(".") or "/" in name or "\\" in name or name != name.strip():
        raise UserError(f"model name {name!r} is not a plain folder name")
    if version is not None and version < 1:
        raise UserError(f"--version {version} must be a positive integer")
    chosen = tuple(dict.fromkeys(f.strip() for f in formats if f.strip()))
    unknown = [f for f in chosen if f not in FORMATS]
    if unknown or not chosen:
        raise UserError(f"formats {list(formats)}: choose from {', '.join(FORMATS)}")
    return chosen


def say(progress: bool, text: str) -> None:
    if progress:
        print(f"== {text}", flush=True)


def _created() -> str:
    """The manifest's `created` stamp: now, UTC, to the second."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _libraries() -> dict[str, str]:
    """The library versions a bundle was written with (the manifest's `libraries`)."""
    import onnx
    import onnxruntime
    import torch

    return {"python": platform.python_version(), "torch": torch.__version__,
            "onnx": onnx.__version__, "onnxruntime": onnxruntime.__version__}


@contextlib.contextmanager
def staged_version(repo: str | os.PathLike[str], name: str,
                   version: int | None) -> Iterator[tuple[int, Path, Path]]:
    """(version, target, tmp): the version to write (the next free one when None), its
    folder and a fresh temporary folder beside it to write into. When the block ends the
    temporary folder is renamed to the version atomically; when it raises it is removed.
    A version that exists is refused: versions are never overwritten."""
    model_dir = Path(repo) / name
    version = version or next_version(repo, name)
    target = model_dir / str(version)
    if target.exists():
        raise UserError(f"{target} already exists: versions are never overwritten; pass a new "
                        "--version or leave it out for the next free one")
    model_dir.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{version}-", dir=model_dir))
    try:
        yield version, target, tmp
        _publish(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _publish(tmp: Path, target: Path) -> None:
    """Atomic rename of the finished folder to its version name (never over a bundle)."""
    try:
        os.rename(tmp, target)
    except OSError as exc:
        raise UserError(f"{target} appeared while exporting; not overwritten ({exc})") from exc
    os.chmod(target, 0o755)


Build = Callable[[Path, int, Path], Manifest]
"""(tmp, version, target) -> the manifest of the files it wrote into tmp (no hashes yet)."""
Check = Callable[[Path, Manifest], dict[str, Any]]
"""(tmp, manifest as read back) -> the parity report of the written graphs."""


def write_bundle(repo: str | os.PathLike[str], name: str, version: int | None, build: Build,
                 check: Check, *, progress: bool, started: float | None = None,
                 explain: Callable[[dict[str, Any]], str] | None = None) -> Path:
    """Write bundle `repo/name/version` (None: the next free version) and return its path
    (module doc): `build` writes the files, `check` returns the parity report (a failed one
    refuses the bundle with `explain(report)`, or its failures listed). `started`: when the
    work began, for the summary printed with `progress`."""
    started = time.perf_counter() if started is None else started
    with staged_version(repo, name, version) as (version, target, tmp):
        manifest = dataclasses.replace(build(tmp, version, target), created=_created(),
                                       libraries=_libraries(), files=hash_files(tmp))
        manifest = _finish(tmp, manifest)
        manifest = _record_parity(tmp, manifest, check(tmp, manifest), explain)
    _summary(progress, target, manifest, started)
    return target


def _finish(tmp: Path, manifest: Manifest) -> Manifest:
    """Write the manifest last and read the folder back verified (schema, declared
    signatures, hashes, its own checksum): the manifest as a server would load it."""
    write_manifest(tmp, manifest)
    return load_bundle(tmp, verify=True, require_checksum=True)


def _record_parity(tmp: Path, manifest: Manifest, report: dict[str, Any],
                   explain: Callable[[dict[str, Any]], str] | None) -> Manifest:
    """The manifest with its passed parity report, written and read back verified (a
    failed report is a BundleError: `explain(report)`, or its failures listed)."""
    if not report["passed"]:
        raise BundleError(explain(report) if explain is not None else
                          "parity check failed, nothing was written:\n  "
                          + "\n  ".join(report["failures"]))
    return _finish(tmp, Manifest.from_dict({**manifest.to_dict(), "parity": report}))


def _summary(progress: bool, target: Path, manifest: Manifest, started: float) -> None:
    """The written bundle's summary (files, sizes, parity), when `progress`."""
    if progress:
        from seqserve.export.summary import format_summary

        print(format_summary(target, manifest, time.perf_counter() - started))
