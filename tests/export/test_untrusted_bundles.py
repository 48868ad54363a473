"""A bundle is untrusted input: `seqserve verify` and the server refuse what could make them
allocate without bound, read files outside the version folder, or read external data, and
keep accepting the folders Kubernetes volumes publish through symbolic links."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from seqserve.cli import main
from seqserve.export.contract import MAX_MANIFEST_BYTES, MAX_SERIES_VALUES, MAX_TOKENIZER_BYTES
from seqserve.export.manifest import manifest_checksum, sha256_file
from seqserve.export.verify import verify_bundle
from seqserve.models.errors import BundleError
from seqserve.service.engine.loading import build_served
from seqserve.service.engine.options import EngineOptions
from seqserve.service.runtimes.base import RuntimeUnavailable
from seqserve.service.runtimes.onnx import OnnxRuntime
from seqserve.service.web.settings import Settings

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")  # torch.jit.load


@pytest.fixture()
def bundle(tiny_repo: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(tiny_repo / "tiny-clf" / "1", tmp_path / "repo" / "clf" / "1"))


def _options(bundle: Path) -> EngineOptions:
    """The server's engine options for the repository holding `bundle`."""
    return Settings(repo=bundle.parent.parent, instances=1, decode_groups=1,
                    runtime_calls="threads", warmup=False).engine_options()


def _rewrite(bundle: Path, edit: Callable[[dict[str, Any]], None]) -> None:
    """Edit manifest.json and sign it again (its own checksum matches: only the content is
    hostile, as a bundle made by hand would be)."""
    data = json.loads((bundle / "manifest.json").read_text())
    edit(data)
    data["manifest_sha256"] = manifest_checksum(data)
    (bundle / "manifest.json").write_text(json.dumps(data, indent=2))


def _limits(**limits: int) -> Callable[[dict[str, Any]], None]:
    return lambda d: d.setdefault("limits", {}).update(limits)


def _vocab(size: int) -> Callable[[dict[str, Any]], None]:
    return lambda d: d["tokenizer"].update(vocab_size=size)


@pytest.mark.parametrize("edit, field", [
    (_limits(max_tokens=10**9), "max_tokens"),
    (_limits(max_decode_length=2**40), "max_decode_length"),
    (_vocab(10**12), "vocab_size"),
    (lambda d: d.update(labels=[f"l{i}" for i in range(70_000)]), "labels"),
])
def test_declared_sizes_are_bounded_before_anything_is_allocated(
        bundle: Path, edit: Callable[[dict[str, Any]], None], field: str,
        capsys: pytest.CaptureFixture[str]) -> None:
    """Before, `max_tokens: 1e9` grew `seqserve verify` to 23 GB (a parity batch of that
    length) and a vocabulary of 1e12 passed; now each is refused by name at once."""
    _rewrite(bundle, edit)
    with pytest.raises(BundleError, match=field):
        verify_bundle(bundle)
    assert main(["verify", str(bundle)]) == 2
    assert field in capsys.readouterr().err
    with pytest.raises(BundleError, match=field):  # the server's loader: the same check
        build_served("clf", bundle, _options(bundle))


def test_a_series_bundle_is_bounded_in_steps_times_features(tiny_series_repo: Path,
                                                            tmp_path: Path) -> None:
    src = next(p for p in sorted(tiny_series_repo.glob("*/1")))
    bundle = Path(shutil.copytree(src, tmp_path / "s" / "1"))

    def edit(d: dict[str, Any]) -> None:  # each within its own bound; together too many
        d.pop("normalization", None)
        d.update(features=128, limits={"max_steps": MAX_SERIES_VALUES // 128 + 1})

    _rewrite(bundle, edit)
    with pytest.raises(BundleError, match="values per series"):
        verify_bundle(bundle, parity=False)


def test_a_link_out_of_the_version_folder_is_refused(bundle: Path, tmp_path: Path) -> None:
    """A file listed with the right hash but reached through a link to elsewhere (another
    bundle's file, anything on the disk) was read and served; now refused by name."""
    outside = tmp_path / "elsewhere" / "tokenizer.model"
    outside.parent.mkdir()
    (bundle / "tokenizer.model").rename(outside)
    (bundle / "tokenizer.model").symlink_to(outside)
    with pytest.raises(BundleError, match="tokenizer.model: a symbolic link that leads out"):
        verify_bundle(bundle, parity=False)
    with pytest.raises(BundleError, match="leads out"):
        build_served("clf", bundle, _options(bundle))


def test_a_manifest_linked_out_of_the_version_folder_is_refused(bundle: Path,
                                                               tmp_path: Path) -> None:
    """manifest.json itself reached through a link to elsewhere was read and served (every
    file it lists was refused for the same thing); now refused by name, by the server too."""
    outside = tmp_path / "elsewhere" / "manifest.json"
    outside.parent.mkdir()
    (bundle / "manifest.json").rename(outside)
    (bundle / "manifest.json").symlink_to(outside)
    with pytest.raises(BundleError, match="manifest.json: a symbolic link that leads out"):
        verify_bundle(bundle, parity=False)
    with pytest.raises(BundleError, match="manifest.json: a symbolic link that leads out"):
        build_served("clf", bundle, _options(bundle))


def test_an_oversized_manifest_is_refused_before_it_is_parsed(
        bundle: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import seqserve.export.manifest as manifest_module

    manifest = bundle / "manifest.json"
    with manifest.open("ab") as f:  # valid JSON (trailing blanks) but over the bound
        f.write(b" " * (MAX_MANIFEST_BYTES + 1 - manifest.stat().st_size))
    parsed: list[int] = []
    real_loads = json.loads
    monkeypatch.setattr(manifest_module.json, "loads",
                        lambda text, *a, **k: parsed.append(len(text)) or real_loads(text))
    with pytest.raises(BundleError, match="over the 16 MiB a manifest.json may have"):
        verify_bundle(bundle, parity=False)
    with pytest.raises(BundleError, match="16 MiB a manifest.json"):
        build_served("clf", bundle, _options(bundle))
    assert all(n < MAX_MANIFEST_BYTES for n in parsed)


def test_kubernetes_volume_links_inside_the_folder_keep_working(bundle: Path) -> None:
    """A ConfigMap / projected volume: the files in `..<timestamp>/`, `..data` linked to it
    and every file linked to `..data/<file>` (Kubernetes' atomic writer)."""
    stamp = bundle / "..2026_12_04_10_00_00.123456789"
    stamp.mkdir()
    for path in sorted(p for p in bundle.iterdir() if p.is_file()):
        path.rename(stamp / path.name)
        path.symlink_to(Path("..data") / path.name)
    (bundle / "..data").symlink_to(stamp.name)
    report = verify_bundle(bundle)
    assert report["parity"]["passed"]


def test_an_oversized_tokenizer_file_is_refused_before_it_is_read(bundle: Path) -> None:
    tok = bundle / "tokenizer.model"
    with tok.open("ab") as f:
        f.truncate(MAX_TOKENIZER_BYTES + 1)
    _rewrite(bundle, lambda d: d["files"].update({"tokenizer.model": sha256_file(tok)}))
    with pytest.raises(BundleError, match="tokenizer file may have"):
        verify_bundle(bundle, parity=False)


def test_external_data_is_refused_by_verify_and_by_the_server(bundle: Path) -> None:
    """Before, verify refused a graph whose weights sit in an external data file, but the
    server loaded it (ONNX Runtime follows the file's reference); now both refuse."""
    import onnx

    graph = bundle / "classifier.onnx"
    model = onnx.load(str(graph))
    onnx.save_model(model, str(graph), save_as_external_data=True,
                    all_tensors_to_one_file=True, location="classifier.onnx.data",
                    size_threshold=0)
    data = bundle / "classifier.onnx.data"

    def relist(d: dict[str, Any]) -> None:
        d["files"].update({"classifier.onnx": sha256_file(graph),
                           "classifier.onnx.data": sha256_file(data)})

    _rewrite(bundle, relist)
    with pytest.raises(BundleError, match="external data"):
        verify_bundle(bundle, parity=False)
    with pytest.raises(RuntimeUnavailable, match="external data"):
        OnnxRuntime({"classifier": graph}, ["CPUExecutionProvider"])
