"""Tagger export and the LSTM-variant export grid: ONNX + TorchScript, dynamic axes, parity
against eager and batch invariance within the export's bounds (parity.py), `rnn_form` in
the manifest."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from tagger_support import train_tiny_tagger, write_untrained_tagger

from seqserve.export.bundle import export_run
from seqserve.export.manifest import load_bundle
from seqserve.export.parity import INVARIANCE_TOL, PARITY_TOL
from seqserve.models.checkpoint import load_run
from seqserve.models.nn.tagger import Tagger

GRID = {"batch_sizes": (1, 3, 8), "lengths": (1, 7, 24)}
VARIANTS: list[dict[str, Any]] = [
    {"peephole": True},
    {"cifg": True},
    {"proj_size": 6},
    {"peephole": True, "cifg": True, "proj_size": 6},
]
_counter = itertools.count()


@pytest.fixture(scope="module")
def tiny_tagger_bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """model_repository/tiny-tag/1 exported from a short real tagger run."""
    run = train_tiny_tagger(tmp_path_factory.mktemp("tagger-run"))
    repo = tmp_path_factory.mktemp("tagger-repo")
    return export_run(run, repo, "tiny-tag", version=1, progress=False)


def _check_report(manifest: Any) -> None:
    parity = manifest.parity
    assert parity["passed"], parity["failures"]
    assert set(parity["parity_max_abs"]) == {"onnx", "torchscript"}
    for row in parity["parity_max_abs"].values():
        assert row and max(row.values()) <= PARITY_TOL
    for row in parity["invariance_max_diff"].values():
        assert row and max(row.values()) <= INVARIANCE_TOL


def test_tagger_bundle_signature_and_parity(tiny_tagger_bundle: Path) -> None:
    manifest = load_bundle(tiny_tagger_bundle)
    assert manifest.task == "tagger" and "unit" in manifest.labels
    graph = manifest.graphs["tagger"]
    assert [t.name for t in graph.inputs] == ["input_ids", "lengths"]
    assert [(t.name, t.shape) for t in graph.outputs] == [("log_probs",
                                                          ("batch", "seq", "labels"))]
    assert graph.onnx and graph.torchscript
    assert manifest.to_dict()["graphs"]["tagger"]["rnn_form"] == "native"
    _check_report(manifest)
    assert manifest.source_run["test_metrics"]["token_accuracy"] > 0.5


def test_onnx_tagger_matches_eager_on_new_lengths(tiny_tagger_bundle: Path) -> None:
    import onnxruntime as ort

    manifest = load_bundle(tiny_tagger_bundle)
    model, config, _ = load_run(manifest.source_run["path"])
    assert isinstance(model, Tagger)
    session = ort.InferenceSession(str(tiny_tagger_bundle / "tagger.onnx"),
                                   providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(3)
    for batch, longest in [(2, 5), (5, 33)]:
        lengths = rng.integers(1, longest + 1, size=batch).astype(np.int64)
        lengths[0] = longest
        ids = rng.integers(4, config["model"]["vocab_size"], (batch, longest)).astype(np.int64)
        ids[np.arange(longest)[None] >= lengths[:, None]] = 0
        (got,) = session.run(["log_probs"], {"input_ids": ids, "lengths": lengths})
        with torch.no_grad():
            want = model.tag(torch.from_numpy(ids), torch.from_numpy(lengths)).numpy()
        assert got.shape == (batch, longest, len(manifest.labels))
        assert np.abs(got - want).max() <= 1e-4


@pytest.fixture(scope="module")
def variant_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("variant-repo")


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: "+".join(sorted(v)))
@pytest.mark.parametrize("task", ["tagger", "classifier", "translator"])
def test_variant_exports_with_parity_and_invariance(
        task: str, variant: dict[str, Any], make_run: Callable[..., Path],
        variant_repo: Path, tmp_path: Path) -> None:
    if task == "tagger":
        run = write_untrained_tagger(tmp_path / "run", **variant)
    else:
        run = make_run(task, cell="lstm", hidden_size=16, max_length=24, **variant)
    name = f"{task}-{next(_counter)}"
    bundle = export_run(run, variant_repo, name, version=1, progress=False, grid=GRID)
    manifest = load_bundle(bundle)
    _check_report(manifest)
    forms = {g: spec["rnn_form"] for g, spec in manifest.to_dict()["graphs"].items()}
    first = "encoder" if task == "translator" else task
    assert forms[first] == "loop"
    if task == "translator":
        assert forms["decoder_step"] == "native"
