"""seqserve.export.manifest: round trip, hash checks, listing; and that it stays torch-free."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from seqserve.export.contract import GraphSpec, TensorSpec
from seqserve.export.manifest import (
    Manifest,
    hash_files,
    load_bundle,
    manifest_checksum,
    read_manifest,
    sha256_file,
    write_manifest,
)
from seqserve.export.versions import list_bundles, next_version
from seqserve.models.errors import BundleError


def _clf_manifest(version: int = 1, files: dict[str, str] | None = None) -> Manifest:
    graph = GraphSpec(
        inputs=(
            TensorSpec("input_ids", "int64", ("batch", "seq")),
            TensorSpec("lengths", "int64", ("batch",)),
        ),
        outputs=(
            TensorSpec("logits", "float32", ("batch", "classes")),
            TensorSpec("attention", "float32", ("batch", "seq")),
        ),
        onnx="classifier.onnx",
        torchscript="classifier.pt",
    )
    return Manifest(
        task="classifier", name="m", version=version, graphs={"classifier": graph},
        labels=["a", "b"], limits={"max_tokens": 64}, opset=17, files=files or {},
    )


def _make_bundle(root: Path, version: int = 1) -> Path:
    bundle = root / "m" / str(version)
    bundle.mkdir(parents=True)
    for name, data in [("classifier.onnx", b"onnx"), ("classifier.pt", b"pt"),
                       ("tokenizer.model", b"tok")]:
        (bundle / name).write_bytes(data)
    write_manifest(bundle, _clf_manifest(version, hash_files(bundle)))
    return bundle


def test_round_trip(tmp_path: Path) -> None:
    bundle = _make_bundle(tmp_path)
    m = read_manifest(bundle)
    assert m == _clf_manifest(1, hash_files(bundle))
    assert m.formats == ["onnx", "torchscript"]
    assert m.graphs["classifier"].inputs[0].shape == ("batch", "seq")
    raw = json.loads((bundle / "manifest.json").read_text())
    assert raw["schema_version"] == 4 and raw["graphs"]["classifier"]["onnx"] == "classifier.onnx"


def test_sha256_file(tmp_path: Path) -> None:
    p = tmp_path / "x"
    p.write_bytes(b"abc")
    assert sha256_file(p) == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"


def test_load_bundle_ok(tmp_path: Path) -> None:
    assert load_bundle(_make_bundle(tmp_path)).name == "m"


@pytest.mark.parametrize("name", ["classifier.onnx", "classifier.pt", "tokenizer.model"])
def test_load_bundle_flipped_byte(tmp_path: Path, name: str) -> None:
    bundle = _make_bundle(tmp_path)
    data = bytearray((bundle / name).read_bytes())
    data[0] ^= 1
    (bundle / name).write_bytes(bytes(data))
    with pytest.raises(BundleError, match=name):
        load_bundle(bundle)
    load_bundle(bundle, verify=False)  # reading alone still works


def test_load_bundle_extra_and_missing(tmp_path: Path) -> None:
    bundle = _make_bundle(tmp_path)
    (bundle / "evil.pt").write_bytes(b"x")
    with pytest.raises(BundleError, match="evil.pt.*not listed"):
        load_bundle(bundle)
    (bundle / "evil.pt").unlink()
    (bundle / "classifier.pt").unlink()
    with pytest.raises(BundleError, match="classifier.pt.*missing"):
        load_bundle(bundle)


def test_load_bundle_edited_hash_list(tmp_path: Path) -> None:
    bundle = _make_bundle(tmp_path)
    raw = json.loads((bundle / "manifest.json").read_text())
    raw["files"]["classifier.pt"] = "0" * 64
    (bundle / "manifest.json").write_text(json.dumps(raw))
    with pytest.raises(BundleError, match="manifest.json was changed"):
        load_bundle(bundle)
    # the same edit with a recomputed checksum is caught by the file hash
    write_manifest(bundle, Manifest.from_dict(raw))
    with pytest.raises(BundleError, match="classifier.pt.*sha256 mismatch"):
        load_bundle(bundle)
    # an entry removed from the list: the file is then unlisted
    del raw["files"]["classifier.pt"]
    write_manifest(bundle, Manifest.from_dict(raw))
    with pytest.raises(BundleError, match="classifier.pt"):
        load_bundle(bundle)


def test_checksum_optional_unless_required(tmp_path: Path) -> None:
    bundle = _make_bundle(tmp_path)
    raw = json.loads((bundle / "manifest.json").read_text())
    assert raw["manifest_sha256"] == manifest_checksum(raw)
    del raw["manifest_sha256"]
    (bundle / "manifest.json").write_text(json.dumps(raw))
    assert load_bundle(bundle).name == "m"  # hand-written manifests without it still load
    with pytest.raises(BundleError, match="no manifest_sha256"):
        load_bundle(bundle, require_checksum=True)


def test_bad_manifests(tmp_path: Path) -> None:
    bundle = _make_bundle(tmp_path)
    (bundle / "manifest.json").write_text("{not json")
    with pytest.raises(BundleError, match="not valid JSON"):
        read_manifest(bundle)
    (bundle / "manifest.json").write_text(json.dumps({"schema_version": 1, "task": "x"}))
    with pytest.raises(BundleError):
        read_manifest(bundle)
    (bundle / "manifest.json").unlink()
    with pytest.raises(BundleError, match="missing"):
        read_manifest(bundle)


def test_list_bundles_and_next_version(tmp_path: Path) -> None:
    _make_bundle(tmp_path, 2)
    _make_bundle(tmp_path, 10)
    (tmp_path / "m" / "0").mkdir()
    (tmp_path / "m" / "latest").mkdir()
    (tmp_path / "m" / ".tmp-3").mkdir()
    assert [(n, v) for n, v, _ in list_bundles(tmp_path)] == [("m", 2), ("m", 10)]
    assert next_version(tmp_path, "m") == 11
    assert next_version(tmp_path, "other") == 1
    assert list_bundles(tmp_path / "nope") == []


def test_manifest_module_is_torch_free() -> None:
    code = (
        "import sys\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] in ('torch', 'onnx', 'onnxruntime'):\n"
        "            raise ImportError('blocked ' + name)\n"
        "sys.meta_path.insert(0, Block())\n"
        "import seqserve.export.manifest\n"
        "print('ok')\n"
    )
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr


def _mt_manifest(**fields: object) -> Manifest:
    graph = GraphSpec(inputs=(), outputs=())
    return Manifest(task="translator", name="mt", version=1,  # type: ignore[arg-type]
                    graphs={"encoder": graph, "decoder_step": graph}, **fields)


def test_translator_decoder_field() -> None:
    """`decoder` round-trips; a translator manifest without it (older bundles) is luong and
    has attention; `none` has none; a wrong decoder or one on a classifier is refused."""
    for decoder, attention in (("none", False), ("bahdanau", True), ("luong", True)):
        m = _mt_manifest(decoder=decoder)
        raw = m.to_dict()
        assert raw["decoder"] == decoder and Manifest.from_dict(raw) == m
        assert m.has_attention is attention
    old = _mt_manifest()
    assert "decoder" not in old.to_dict() and old.decoder is None and old.has_attention
    with pytest.raises(BundleError, match="decoder 'dot'"):
        _mt_manifest(decoder="dot")
    with pytest.raises(BundleError, match="decoder"):
        Manifest.from_dict({**_clf_manifest().to_dict(), "decoder": "luong"})


def test_attention_keys_come_from_the_encoder_and_go_to_the_step(tiny_repo: Path) -> None:
    """Schema 3's projected attention keys: an encoder that returns `keys` with a step that
    does not take them (or the other way round) is refused before anything runs; both or
    neither pass."""
    import dataclasses

    from seqserve.export.manifest import check_declared

    keyed = load_bundle(tiny_repo / "tiny-mt" / "1")
    enc, step = keyed.graphs["encoder"], keyed.graphs["decoder_step"]
    assert [t.name for t in enc.outputs][-1] == "keys"
    check_declared(keyed)
    bare_enc = dataclasses.replace(enc, outputs=enc.outputs[:-1])
    bare_step = dataclasses.replace(step, inputs=step.inputs[:-1])
    check_declared(dataclasses.replace(keyed, graphs={"encoder": bare_enc,
                                                      "decoder_step": bare_step}))
    for graphs in ({"encoder": enc, "decoder_step": bare_step},
                   {"encoder": bare_enc, "decoder_step": step}):
        with pytest.raises(BundleError, match="keys"):
            check_declared(dataclasses.replace(keyed, graphs=graphs))
