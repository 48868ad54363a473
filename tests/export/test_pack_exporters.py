"""Models exported the way PyTorch now defaults to: `torch.onnx.export(..., dynamo=True)`
declares the sequence length of nn.LSTM / nn.GRU outputs as the example's, yet the graph
answers every length. pack judges a graph by running it at several lengths and batch sizes:
such a graph is accepted (its declared dims made dynamic in the bundle), one that truly
answers only the example's length is refused naming the length and the fix; a series graph
without a lengths input is named as such."""

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


def _declared(path: Path, output: int = 0) -> list[object]:
    import onnx

    dims = onnx.load(str(path)).graph.output[output].type.tensor_type.shape.dim
    return [d.dim_param or d.dim_value for d in dims]


def test_a_dynamo_export_with_a_declared_fixed_sequence_axis_is_accepted(
        tmp_path: Path) -> None:
    tok = char_tokenizer(tmp_path / "chars.json")
    tagger = LSTMTagger(30, 4)
    example = (torch.randint(2, 30, (3, 7)), torch.tensor([7, 5, 2]))
    _export(tagger, example, tmp_path / "plain.onnx", ["tokens", "n"], ["tag_scores"], True)
    assert _declared(tmp_path / "plain.onnx")[1] == 7  # what the default exporter declares
    assert main(["pack", "tagger", "--onnx", str(tmp_path / "plain.onnx"), "--name", "t",
                 "--tokenizer", str(tok), "--labels", "a,b,c,d", "--repo",
                 str(tmp_path / "repo"), "--max-tokens", "16"]) == 0  # ran at 1, 7 and 16


class PlainGRUClassifier(nn.Module):
    """A plain nn.GRU classifier: the last valid state -> logits."""

    def __init__(self, flatten: bool = False) -> None:
        super().__init__()
        self.emb = nn.Embedding(30, 8)
        self.gru = nn.GRU(8, 12, batch_first=True)
        self.flatten = flatten
        self.out = nn.Linear(12 * 7 if flatten else 12, 3)

    def forward(self, ids: Tensor, lengths: Tensor) -> Tensor:
        h, _ = self.gru(self.emb(ids))
        if self.flatten:  # written for length 7 only
            mask = (torch.arange(ids.shape[1])[None] < lengths[:, None]).unsqueeze(-1)
            return self.out((h * mask).reshape(h.shape[0], -1))
        last = h.gather(1, (lengths - 1).view(-1, 1, 1).expand(-1, 1, h.shape[2]))
        return self.out(last.squeeze(1))


def test_a_plain_gru_classifier_from_the_default_exporter_is_accepted(
        tmp_path: Path) -> None:
    tok = char_tokenizer(tmp_path / "chars.json")
    example = (torch.randint(2, 30, (3, 7)), torch.tensor([7, 5, 2]))
    _export(PlainGRUClassifier(), example, tmp_path / "gru.onnx", ["ids", "lengths"],
            ["logits"], True)
    repo = tmp_path / "repo"
    assert main(["pack", "classifier", "--onnx", str(tmp_path / "gru.onnx"), "--name", "c",
                 "--tokenizer", str(tok), "--labels", "a,b,c", "--repo", str(repo),
                 "--max-tokens", "16"]) == 0
    import onnx

    graph = onnx.load(str(repo / "c" / "1" / "classifier.onnx")).graph
    assert [d.dim_param for d in graph.input[0].type.tensor_type.shape.dim] == ["batch", "seq"]


def test_a_graph_that_answers_one_length_only_is_refused_naming_it(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    tok = char_tokenizer(tmp_path / "chars.json")
    example = (torch.randint(2, 30, (3, 7)), torch.tensor([7, 5, 2]))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(PlainGRUClassifier(flatten=True).eval(), example,
                          str(tmp_path / "seven.onnx"), dynamo=True,
                          input_names=["ids", "lengths"], output_names=["logits"],
                          dynamic_shapes=({0: torch.export.Dim("batch")},
                                          {0: torch.export.Dim("batch")}))
    assert main(["pack", "classifier", "--onnx", str(tmp_path / "seven.onnx"), "--name", "c",
                 "--tokenizer", str(tok), "--labels", "a,b,c", "--repo",
                 str(tmp_path / "repo"), "--max-tokens", "16"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "seven.onnx: the classifier graph fails on a (1, 3) batch of token ids" in err
    assert not (tmp_path / "repo" / "c" / "1").exists()


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


def test_a_stateless_series_tagger_from_the_default_exporter(tmp_path: Path) -> None:
    """A per-step series model exported with dynamo=True: accepted, judged by running it."""
    x, n = torch.randn(3, 6, 3), torch.tensor([6, 4, 2])
    _export(TutorialLSTMTagger(), (x, n), tmp_path / "level.onnx", ["x", "n"], ["y"], True)
    assert main(["pack", "sequence-tagger", "--onnx", str(tmp_path / "level.onnx"),
                 "--features", "3", "--outputs", "1", "--repo", str(tmp_path / "repo"),
                 "--name", "lv"]) == 0
