"""export_run over every cell and attention type: files, manifest, symbolic dims, and an
independent parity / batch-invariance check through ONNX Runtime and TorchScript."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

from seqserve.export.bundle import export_run
from seqserve.export.manifest import load_bundle
from seqserve.models.checkpoint import load_run

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")  # torch.jit.load

CELLS = ("rnn", "lstm", "gru")
ATTENTIONS = ("additive", "dot", "general")
# every cell with every attention, over both tasks; bidirectionality and depth vary too
COMBOS = [(c, a) for c in CELLS for a in ATTENTIONS]
# translators: every cell with every decoder x score (x input feeding for luong)
DECODERS = [("none", "none", False), ("bahdanau", "additive", False),
            *[("luong", a, f) for a in ATTENTIONS for f in (False, True)]]
TRANSLATOR_COMBOS = [(c, *d) for c in CELLS for d in DECODERS]


def _symbolic_dims(path: Path) -> dict[str, list[str | int]]:
    model = onnx.load(str(path))
    return {v.name: [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim]
            for v in (*model.graph.input, *model.graph.output)}


def _assert_all_symbolic(path: Path) -> None:
    for name, dims in _symbolic_dims(path).items():
        if name == "k":
            assert dims == [1]
            continue
        assert dims and all(isinstance(d, str) and d for d in dims), (path.name, name, dims)


def _batch(rng: np.random.Generator, lengths: list[int], vocab: int) -> tuple[np.ndarray, ...]:
    ids = rng.integers(4, vocab, size=(len(lengths), max(lengths)), dtype=np.int64)
    lens = np.array(lengths, dtype=np.int64)
    ids[np.arange(ids.shape[1])[None, :] >= lens[:, None]] = 0
    return ids, lens


def _formats(bundle: Path, graph: str) -> tuple[Callable[..., list[np.ndarray]], ...]:
    sess = ort.InferenceSession(str(bundle / f"{graph}.onnx"), providers=["CPUExecutionProvider"])
    names = [i.name for i in sess.get_inputs()]
    ts = torch.jit.load(str(bundle / f"{graph}.pt"))

    def run_onnx(*args: np.ndarray) -> list[np.ndarray]:
        return list(sess.run(None, dict(zip(names, args, strict=True))))

    def run_ts(*args: np.ndarray) -> list[np.ndarray]:
        with torch.no_grad():
            return [o.numpy() for o in ts(*(torch.from_numpy(a) for a in args))]

    return run_onnx, run_ts


def _max(a: list[np.ndarray], b: list[np.ndarray]) -> float:
    return max(float(np.abs(x.astype(np.float64) - y.astype(np.float64)).max())
               for x, y in zip(a, b, strict=True))


@pytest.mark.parametrize(("cell", "attention"), COMBOS)
def test_classifier_export(make_run: Callable[..., Path], tmp_path: Path, cell: str,
                           attention: str) -> None:
    bidirectional = cell != "rnn" or attention != "dot"  # one unidirectional model
    run = make_run("classifier", cell=cell, attention=attention, bidirectional=bidirectional,
                   num_layers=1 + (cell == "gru"))
    bundle = export_run(run, tmp_path, "clf", progress=False)
    assert bundle == tmp_path / "clf" / "1"
    assert sorted(p.name for p in bundle.iterdir()) == [
        "classifier.onnx", "classifier.pt", "manifest.json", "tokenizer.model"]
    manifest = load_bundle(bundle)
    assert manifest.parity["passed"] and manifest.opset == 17
    assert manifest.labels == ["alpha", "beta", "gamma"]
    _assert_all_symbolic(bundle / "classifier.onnx")

    model: Any
    model, config, _ = load_run(run)
    rng = np.random.default_rng(1)
    lengths = [config["model"]["max_length"], 1, 7, 64, 30]
    ids, lens = _batch(rng, lengths, config["model"]["vocab_size"])
    with torch.no_grad():
        eager = [t.numpy() for t in model.classify(torch.from_numpy(ids), torch.from_numpy(lens))]
    for run_fmt in _formats(bundle, "classifier"):
        batch = run_fmt(ids, lens)
        assert _max(batch, eager) <= 1e-4
        for b, n in enumerate(lengths):
            alone = run_fmt(ids[b : b + 1, :n], lens[b : b + 1])
            assert _max([batch[0][b : b + 1], batch[1][b : b + 1, :n]], alone) <= 1e-5
            assert np.all(batch[1][b, n:] == 0)


@pytest.mark.parametrize(("cell", "decoder", "attention", "feeding"), TRANSLATOR_COMBOS)
def test_translator_export(make_run: Callable[..., Path], tmp_path: Path, cell: str,
                           decoder: str, attention: str, feeding: bool) -> None:
    run = make_run("translator", cell=cell, attention=attention, decoder=decoder,
                   input_feeding=feeding, num_layers=1 + (cell == "lstm"),
                   bidirectional=cell != "rnn")
    bundle = export_run(run, tmp_path, "mt", progress=False)
    manifest = load_bundle(bundle)
    assert manifest.decoder == decoder and manifest.has_attention == (decoder != "none")
    report = manifest.parity
    assert report["passed"] and all(report["k_dynamic"].values())
    assert set(report["parity_max_abs"]) == {"onnx", "torchscript"}
    for graph in ("encoder", "decoder_step"):
        _assert_all_symbolic(bundle / f"{graph}.onnx")

    model: Any
    model, config, _ = load_run(run)
    vocab = config["model"]["vocab_size"]
    rng = np.random.default_rng(2)
    lengths = [5, config["model"]["max_length"], 1, 64]
    ids, lens = _batch(rng, lengths, vocab)
    memory_index = np.array([0, 0, 1, 2, 3, 3], dtype=np.int64)
    prev = rng.integers(4, vocab, size=memory_index.shape[0], dtype=np.int64)
    # additive and general attention project the memory once per request in the encoder
    # (schema 3's optional keys); the keyed step answers as the step that projects it itself
    keyed = model.projects_keys
    assert keyed == (decoder != "none" and attention != "dot")
    assert [t.name for t in manifest.graphs["decoder_step"].inputs][-1:] == (
        ["keys"] if keyed else ["k"])
    with torch.no_grad():
        encode = model.encode_keys if keyed else model.encode
        enc = encode(torch.from_numpy(ids), torch.from_numpy(lens))
        step_args = [prev, enc[2].numpy()[memory_index], enc[0].numpy(), enc[1].numpy(),
                     memory_index]
        extra = [enc[3].numpy()] if keyed else []
        for k in (1, 5):
            eager = [t.numpy() for t in model.decode_step(
                *(torch.from_numpy(a) for a in step_args), k)]
            for (run_enc, run_step) in zip(_formats(bundle, "encoder"),
                                           _formats(bundle, "decoder_step"), strict=True):
                assert _max(run_enc(ids, lens), [t.numpy() for t in enc]) <= 1e-4
                got = run_step(*step_args, np.array([k], dtype=np.int64), *extra)
                assert got[1].shape == (len(memory_index), k)
                assert np.array_equal(got[2], eager[2])
                assert _max(got, eager) <= 1e-4


def test_frozen_dims_are_rejected(make_run: Callable[..., Path], tmp_path: Path) -> None:
    """A graph exported without dynamic axes declares the example's sizes: check_onnx fails
    and names the frozen dim; the same graph with the contract's axes passes."""
    import warnings

    from seqserve.export.formats import check_onnx, dynamic_axes
    from seqserve.export.graphs import graph_defs
    from seqserve.models.errors import BundleError

    model, config, _ = load_run(make_run("translator"))
    encoder = graph_defs("translator", model, config["model"]["vocab_size"])[0]
    names = {"input_names": [t.name for t in encoder.spec.inputs],
             "output_names": [t.name for t in encoder.spec.outputs]}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(encoder.module, encoder.example, str(tmp_path / "frozen.onnx"),
                          opset_version=17, dynamo=False, **names)  # type: ignore[arg-type]
        torch.onnx.export(encoder.module, encoder.example, str(tmp_path / "ok.onnx"),
                          opset_version=17, dynamo=False,
                          dynamic_axes=dynamic_axes(encoder.spec), **names)  # type: ignore[arg-type]
    with pytest.raises(BundleError, match=r"src_ids dim 0 is a frozen size 3"):
        check_onnx(tmp_path / "frozen.onnx", encoder.spec, 17)
    check_onnx(tmp_path / "ok.onnx", encoder.spec, 17)
    with pytest.raises(BundleError, match="opset"):
        check_onnx(tmp_path / "ok.onnx", encoder.spec, 18)
