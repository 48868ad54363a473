"""Models exported the way PyTorch now defaults to: `torch.onnx.export(..., dynamo=True)`
fixes the sequence length of nn.LSTM / nn.GRU to the example's. pack says exactly that, with
the fix, in the user's own file and tensor names; a series graph without a lengths input is
named as such."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch
from foreign_models import LSTMTagger, char_tokenizer
from series_support import TutorialLSTMTagger
from torch import Tensor, nn

from seqserve.cli import main


def _export(module: nn.Module, example: tuple[Tensor, ...], path: Path, inputs: list[str],
            outputs: list[str], dynamo: bool) -> Path:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if dynamo:  # as a user passing a Dim for batch and sequence would
            batch, seq = torch.export.Dim("batch"), torch.export.Dim("seq")
            torch.onnx.export(module.eval(), example, str(path), input_names=inputs,
                              output_names=outputs, dynamo=True,
                              dynamic_shapes=({0: batch, 1: seq}, {0: batch}))
        else:
            axes = {inputs[0]: {0: "b", 1: "t"}, inputs[1]: {0: "b"},
                    outputs[0]: {0: "b", 1: "t"}}
            torch.onnx.export(module.eval(), example, str(path), input_names=inputs,
                              output_names=outputs, dynamic_axes=axes, dynamo=False)
    return path


def test_a_dynamo_export_with_a_fixed_sequence_axis_is_named_with_its_fix(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    tok = char_tokenizer(tmp_path / "chars.json")
    tagger = LSTMTagger(30, 4)
    example = (torch.randint(2, 30, (3, 7)), torch.tensor([7, 5, 2]))
    args = ["--tokenizer", str(tok), "--labels", "a,b,c,d", "--repo", str(tmp_path / "repo"),
            "--max-tokens", "16"]
    _export(tagger, example, tmp_path / "plain.onnx", ["tokens", "n"], ["tag_scores"], True)
    assert main(["pack", "tagger", "--onnx", str(tmp_path / "plain.onnx"), "--name", "t",
                 *args]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "plain.onnx: output 'tag_scores' has its sequence axis (dim 1) fixed at 7" in err
    assert "dynamo=False" in err and "'tokens'" in err
    # the fix as given: the TorchScript-based exporter keeps the sequence axis dynamic
    _export(tagger, example, tmp_path / "ts.onnx", ["tokens", "n"], ["tag_scores"], False)
    import onnx

    out = onnx.load(str(tmp_path / "ts.onnx")).graph.output[0]
    assert out.type.tensor_type.shape.dim[1].dim_param == "t"


class NoLengthsGRU(nn.Module):
    """A forecaster as often written: (x, h0) -> (y, hn), no lengths."""

    def __init__(self) -> None:
        super().__init__()
        self.gru = nn.GRU(4, 8, batch_first=True)
        self.head = nn.Linear(8, 1)

    def forward(self, x: Tensor, h0: Tensor) -> tuple[Tensor, Tensor]:
        y, hn = self.gru(x, h0)
        return self.head(y), hn


def test_a_series_graph_without_lengths_is_named_as_such(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Before, this got "expected 1 output": the second input was taken for the lengths."""
    model = NoLengthsGRU().eval()
    path = tmp_path / "forecaster.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, (torch.randn(2, 5, 4), torch.zeros(1, 2, 8)), str(path),
                          input_names=["x", "h0"], output_names=["y", "hn"], dynamo=False,
                          dynamic_axes={"x": {0: "b", 1: "t"}, "h0": {1: "b"},
                                        "y": {0: "b", 1: "t"}, "hn": {1: "b"}})
    assert main(["pack", "sequence-tagger", "--onnx", str(path), "--features", "4",
                 "--outputs", "1", "--repo", str(tmp_path / "repo"), "--name", "f"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "forecaster.onnx: your graph has no lengths input" in err
    assert "'h0' is float" in err and "length_aware" in err


def test_a_stateless_series_tagger_from_the_default_exporter(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]
                                                              ) -> None:
    """A per-step series model exported with dynamo=True: the same diagnosis."""
    x, n = torch.randn(3, 6, 3), torch.tensor([6, 4, 2])
    _export(TutorialLSTMTagger(), (x, n), tmp_path / "level.onnx", ["x", "n"], ["y"], True)
    assert main(["pack", "sequence-tagger", "--onnx", str(tmp_path / "level.onnx"),
                 "--features", "3", "--outputs", "1", "--repo", str(tmp_path / "repo"),
                 "--name", "lv"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "level.onnx: output 'y' has its sequence axis (dim 1) fixed at 6" in err
