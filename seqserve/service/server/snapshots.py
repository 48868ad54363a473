"""Copies of the bundle versions a server serves, taken once: what every process loads.

A repository's files can change under a running server: a file truncated or rewritten in
place, a version folder replaced. Were each process to read the repository when it loads a
version, two processes could serve different bytes under one version: an API process
restarted after a crash would load the changed files while its siblings serve the copy they
loaded before. So the supervisor copies each version once, when the model control loads it
(and at start), into its private work folder, and hands every process the copy's path: each
process verifies and loads the same bytes (the copy never changes), a restarted one too. A
version whose repository files changed afterwards is loaded again from a new copy, which
every process verifies the same way; while that fails, the copy verified before serves on
everywhere (the model control reports the change).

Content-addressed: each file is stored once under the sha256 of its bytes (`objects/`, read
only), and a version's copy is a folder of hard links to them named by the digest of its
name, version and listing (`<key>/<name>/<version>/`): the same files give the same folder,
versions that share a tokenizer share its bytes, and files changed in place give another
folder (the loaded one stays as it was). The copy keeps the repository's shape below
`<key>/`, so a load's failure names `name/version/file` as it does in the repository
(`engine.loading.failure_reason`).

The copy keeps what the load checks: every regular file of the version folder (one the
manifest does not list too, so the load refuses it as it would in the repository), a
symbolic link that leads out of the version folder as such a link (refused likewise), and at
most MAX_MANIFEST_BYTES + 1 bytes of manifest.json (refused for its size likewise); a folder
inside is copied empty (Kubernetes' `..data`: the files linked through it are copied as
files; any other folder is refused by the load as in the repository). `collect(keep)`
removes the copies the table no longer names and the objects no copy links.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import tempfile
from collections.abc import Iterable
from pathlib import Path

from seqserve.export.manifest import MANIFEST_FILE, MAX_MANIFEST_BYTES

CHUNK = 1 << 20
OBJECTS = "objects"


class Snapshots:
    """The copies under `root` (module doc)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.objects = root / OBJECTS
        self.objects.mkdir(parents=True, exist_ok=True)

    def copy(self, name: str, version: int, path: Path) -> Path:
        """The copy of version folder `path` (made now, or the same one made before):
        `root/<key>/<name>/<version>`. OSError when the files cannot be read or written."""
        real_root = path.resolve()
        listing: list[tuple[str, str, str]] = []
        for entry in sorted(os.scandir(path), key=lambda e: e.name):
            real = Path(entry.path).resolve()
            if real_root not in real.parents:
                listing.append((entry.name, "link", str(real)))
            elif real.is_dir():
                listing.append((entry.name, "folder", ""))
            elif real.is_file():
                limit = MAX_MANIFEST_BYTES + 1 if entry.name == MANIFEST_FILE else None
                listing.append((entry.name, "file", self._store(real, limit)))
        key = hashlib.sha256(repr((name, version, listing)).encode()).hexdigest()[:24]
        final = self.root / key / name / str(version)
        if final.is_dir():
            return final
        staging = Path(tempfile.mkdtemp(prefix=".tmp-", dir=self.root))
        try:
            folder = staging / name / str(version)
            folder.mkdir(parents=True)
            for entry_name, kind, what in listing:
                if kind == "link":
                    os.symlink(what, folder / entry_name)
                elif kind == "folder":
                    (folder / entry_name).mkdir()
                else:
                    os.link(self.objects / what, folder / entry_name)
            with contextlib.suppress(OSError):  # made meanwhile: the same bytes
                staging.rename(self.root / key)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        return final

    def _store(self, source: Path, limit: int | None) -> str:
        """Copy `source` (at most `limit` bytes) into the objects; its sha256."""
        digest = hashlib.sha256()
        fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=self.objects)
        try:
            with open(source, "rb") as src, os.fdopen(fd, "wb") as dst:
                left = limit
                while left is None or left > 0:
                    chunk = src.read(CHUNK if left is None else min(CHUNK, left))
                    if not chunk:
                        break
                    digest.update(chunk)
                    dst.write(chunk)
                    if left is not None:
                        left -= len(chunk)
            os.chmod(tmp, 0o444)
            target = self.objects / digest.hexdigest()
            if not target.exists():
                os.replace(tmp, target)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
        return digest.hexdigest()

    def owns(self, path: str | Path) -> bool:
        """Whether `path` is one of these copies (not a repository folder)."""
        return self.root in Path(path).parents

    def collect(self, keep: Iterable[str | Path]) -> None:
        """Remove every copy but those of `keep`, then every object no copy links."""
        kept = {Path(p).relative_to(self.root).parts[0] for p in keep if self.owns(p)}
        for folder in self.root.iterdir():
            if folder.name not in kept and folder.name != OBJECTS \
                    and not folder.name.startswith("."):
                shutil.rmtree(folder, ignore_errors=True)
        for obj in self.objects.iterdir():
            with contextlib.suppress(OSError):
                if not obj.name.startswith(".") and obj.stat().st_nlink == 1:
                    obj.unlink()
