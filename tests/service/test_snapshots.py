"""The copies every process of a supervised server loads a version from
(server/snapshots.py): the same files give the same copy, files changed in place another one
(the first stays as it was), what the load refuses in the repository it refuses in the copy,
and `collect` keeps only what the table names."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from seqserve.export.manifest import BundleError, load_bundle
from seqserve.service.engine.loading import failure_reason
from seqserve.service.server.snapshots import Snapshots

CLF = "tiny-clf"


@pytest.fixture
def repo(tiny_repo: Path, tmp_path: Path) -> Path:
    out = tmp_path / "repo"
    shutil.copytree(tiny_repo / CLF, out / CLF)
    return out


def _sizes(folder: Path) -> dict[str, int]:
    return {p.name: p.stat().st_size for p in folder.iterdir()}


def test_a_copy_verifies_and_outlives_files_changed_in_place(repo: Path, tmp_path: Path
                                                             ) -> None:
    copies = Snapshots(tmp_path / "work" / "bundles")
    source = repo / CLF / "1"
    first = copies.copy(CLF, 1, source)
    assert first.parts[-2:] == (CLF, "1") and copies.owns(first)
    load_bundle(first, verify=True)  # what every process does with it
    assert copies.copy(CLF, 1, source) == first  # the same files: the same copy
    assert copies.copy(CLF, 2, source) != first  # another version: its own folder
    before = _sizes(first)
    graph = source / "classifier.onnx"
    with open(graph, "r+b") as f:  # truncated in place, as an operator's mistake would
        f.truncate(graph.stat().st_size // 2)
    changed = copies.copy(CLF, 1, source)
    assert changed != first and _sizes(first) == before
    load_bundle(first, verify=True)  # the verified copy is as it was
    with pytest.raises(BundleError) as failure:
        load_bundle(changed, verify=True)
    reason = failure_reason(failure.value, changed)
    assert "sha256 mismatch" in reason and f"{CLF}/1/classifier.onnx" in reason
    assert str(tmp_path) not in reason  # named as in the repository, not the copy's folder
    copies.collect([first])
    assert first.is_dir() and not changed.exists()
    linked = {p.stat().st_ino for p in first.iterdir()}
    assert {p.stat().st_ino for p in copies.objects.iterdir()} == linked
    copies.collect([])
    assert not first.exists() and not list(copies.objects.iterdir())


def test_what_the_repository_refuses_the_copy_refuses(repo: Path, tmp_path: Path) -> None:
    copies = Snapshots(tmp_path / "work" / "bundles")
    source = repo / CLF / "1"
    elsewhere = tmp_path / "elsewhere.model"
    shutil.move(source / "tokenizer.model", elsewhere)
    os.symlink(elsewhere, source / "tokenizer.model")  # a link out of the version folder
    with pytest.raises(BundleError, match="leads out of its version folder"):
        load_bundle(source, verify=True)
    copy = copies.copy(CLF, 1, source)
    with pytest.raises(BundleError, match="leads out of its version folder"):
        load_bundle(copy, verify=True)
    (source / "tokenizer.model").unlink()
    shutil.move(elsewhere, source / "tokenizer.model")
    (source / "extra").mkdir()  # a folder the manifest does not list
    with pytest.raises(BundleError, match="not listed"):
        load_bundle(copies.copy(CLF, 1, source), verify=True)
