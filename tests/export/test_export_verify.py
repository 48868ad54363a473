"""verify_bundle / `seqserve verify`, overwrite refusal and atomic failure of export_run."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from seqserve.cli import main
from seqserve.export.bundle import export_run
from seqserve.export.manifest import Manifest, sha256_file, write_manifest
from seqserve.export.verify import verify_bundle
from seqserve.models.errors import BundleError, UserError

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")  # torch.jit.load


@pytest.fixture()
def repo_copy(tiny_repo: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(tiny_repo, tmp_path / "repo"))


def _flip(path: Path, where: float) -> None:
    data = bytearray(path.read_bytes())
    data[min(len(data) - 1, int(len(data) * where))] ^= 0x01
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("name", ["tiny-clf", "tiny-mt"])
def test_verify_passes_on_exported_bundles(tiny_repo: Path, name: str,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    report = verify_bundle(tiny_repo / name / "1")
    parity = report["parity"]
    assert parity["passed"] and parity["reference"] == "torchscript"
    assert set(parity["invariance_max_diff"]) == {"onnx", "torchscript"}
    assert main(["verify", str(tiny_repo / name / "1")]) == 0
    assert "OK" in capsys.readouterr().out


def test_verify_fails_on_any_flipped_byte(repo_copy: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    for name in ("tiny-clf", "tiny-mt"):
        bundle = repo_copy / name / "1"
        files = sorted(p.name for p in bundle.iterdir())
        assert "manifest.json" in files and "tokenizer.model" in files
        for file in files:
            for where in (0.0, 0.5, 1.0):
                original = (bundle / file).read_bytes()
                _flip(bundle / file, where)
                with pytest.raises(BundleError, match=file.replace(".", r"\.")):
                    verify_bundle(bundle, parity=False)
                assert main(["verify", str(bundle), "--no-parity"]) == 2
                assert file in capsys.readouterr().err
                (bundle / file).write_bytes(original)
        verify_bundle(bundle, parity=False)  # restored: passes again


def _edit_manifest(bundle: Path, edit: Callable[[dict[str, Any]], None], resign: bool) -> None:
    data = json.loads((bundle / "manifest.json").read_text())
    edit(data)
    if resign:  # a careful editor who also rewrites the manifest checksum
        write_manifest(bundle, Manifest.from_dict(data))
    else:
        (bundle / "manifest.json").write_text(json.dumps(data, indent=2))


@pytest.mark.parametrize("resign", [False, True])
def test_verify_fails_on_edited_hash_list(repo_copy: Path, resign: bool) -> None:
    bundle = repo_copy / "tiny-mt" / "1"
    original = (bundle / "manifest.json").read_bytes()

    def swap(d: dict[str, Any]) -> None:
        files = d["files"]
        files["encoder.onnx"], files["decoder_step.onnx"] = (files["decoder_step.onnx"],
                                                             files["encoder.onnx"])

    def drop(d: dict[str, Any]) -> None:
        del d["files"]["tokenizer.model"]

    for edit in (swap, drop):
        _edit_manifest(bundle, edit, resign)
        with pytest.raises(BundleError) as err:
            verify_bundle(bundle, parity=False)
        named = (["encoder.onnx", "decoder_step.onnx"] if edit is swap
                 else ["tokenizer.model"]) if resign else ["manifest.json"]
        assert any(n in str(err.value) for n in named), err.value
        (bundle / "manifest.json").write_bytes(original)


def test_verify_parity_catches_swapped_weights(repo_copy: Path) -> None:
    """A TorchScript twin traced from another model, re-hashed into the manifest: hashes
    pass, the ONNX vs TorchScript parity does not."""
    import torch

    from seqserve.export.formats import export_torchscript
    from seqserve.export.graphs import graph_defs
    from seqserve.models.checkpoint import build_model

    bundle = repo_copy / "tiny-mt" / "1"
    config = json.loads((bundle / "manifest.json").read_text())["source_run"]["config"]
    torch.manual_seed(123)
    other = build_model("translator", config["model"])
    step = graph_defs("translator", other, config["model"]["vocab_size"])[1]
    export_torchscript(step, bundle / "decoder_step.pt")
    data = json.loads((bundle / "manifest.json").read_text())
    data["files"]["decoder_step.pt"] = sha256_file(bundle / "decoder_step.pt")
    write_manifest(bundle, Manifest.from_dict(data))
    verify_bundle(bundle, parity=False)
    with pytest.raises(BundleError, match="onnx vs torchscript: decoder_step"):
        verify_bundle(bundle)


def test_export_refuses_to_overwrite(repo_copy: Path, tiny_classifier_run: Path,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    bundle = repo_copy / "tiny-clf" / "1"
    before = {p.name: sha256_file(p) for p in bundle.iterdir()}
    with pytest.raises(UserError, match="already exists"):
        export_run(tiny_classifier_run, repo_copy, "tiny-clf", version=1, progress=False)
    code = main(["export", str(tiny_classifier_run), "--repo", str(repo_copy), "--name",
                 "tiny-clf", "--version", "1"])
    assert code == 2 and "already exists" in capsys.readouterr().err
    assert {p.name: sha256_file(p) for p in bundle.iterdir()} == before
    assert sorted(p.name for p in (repo_copy / "tiny-clf").iterdir()) == ["1"]


def test_cli_export_next_version(repo_copy: Path, tiny_classifier_run: Path,
                                 capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["export", str(tiny_classifier_run), "--repo", str(repo_copy), "--name",
                 "tiny-clf", "--formats", "onnx", "--threads", "1"])
    out = capsys.readouterr().out
    assert code == 0
    bundle = repo_copy / "tiny-clf" / "2"
    assert sorted(p.name for p in bundle.iterdir()) == [
        "classifier.onnx", "manifest.json", "tokenizer.model"]
    assert "classifier.onnx" in out and "PASSED" in out and "max |row in batch" in out
    report = verify_bundle(bundle)
    assert report["parity"]["reference"] == "onnx"


def test_failed_parity_leaves_nothing(make_run: Callable[..., Path], tmp_path: Path,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """A model that lets padding leak into short rows fails the export; no version folder
    and no temporary folder remain."""
    import torch

    import seqserve.models.checkpoint as checkpoint

    real_load_run = checkpoint.load_run

    def leaky_load_run(run_dir: Path) -> Any:
        model: Any
        model, config, tok = real_load_run(run_dir)
        classify = model.classify

        def ignore_lengths(ids: torch.Tensor, lengths: torch.Tensor) -> Any:
            return classify(ids, torch.ones_like(lengths) * ids.shape[1])

        model.classify = ignore_lengths
        return model, config, tok

    monkeypatch.setattr(checkpoint, "load_run", leaky_load_run)
    run = make_run("classifier")
    with pytest.raises(BundleError, match="batch invariance"):
        export_run(run, tmp_path, "leaky", progress=False)
    assert list((tmp_path / "leaky").iterdir()) == []


def test_export_rejects_bad_arguments(tiny_classifier_run: Path, tmp_path: Path) -> None:
    for kwargs in ({"name": "../x"}, {"name": ".hidden"}, {"name": "m", "version": 0},
                   {"name": "m", "formats": ("tflite",)}):
        with pytest.raises(UserError):
            export_run(tiny_classifier_run, tmp_path, progress=False, **kwargs)
    unfinished = Path(shutil.copytree(tiny_classifier_run, tmp_path / "run"))
    (unfinished / "DONE").unlink()
    with pytest.raises(UserError, match="not finished"):
        export_run(unfinished, tmp_path, "m", progress=False)


def test_verify_without_parity_never_imports_torch(tiny_repo: Path) -> None:
    """`seqserve verify --no-parity` checks hashes, schema, tokenizer and graph signatures
    with ONNX Runtime: a machine with the server's dependencies only (no torch) can run it."""
    import subprocess
    import sys

    code = ("import sys\nfrom seqserve.cli import main\n"
            f"assert main(['verify', {str(tiny_repo / 'tiny-mt' / '1')!r}, '--no-parity']) == 0\n"
            "assert 'torch' not in sys.modules, 'torch was imported'\n")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 0, run.stderr[-3000:]
