"""`seqserve inspect` on a bundle packed from a user's own ONNX file: the graph keeps its own
tensor names (chars, n, scores) and inspect shows them beside the contract's."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest

from seqserve.cli import main


def _inspect(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    assert main(["inspect", *args]) == 0
    return capsys.readouterr().out


def test_packed_bundle_shows_the_files_own_tensor_names(capsys: pytest.CaptureFixture[str],
                                                        tmp_path: Path) -> None:
    import torch
    from foreign_models import CharGRUClassifier, char_tokenizer

    tok = char_tokenizer(tmp_path / "chars.json")
    model = CharGRUClassifier(30, 2).eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, (torch.randint(2, 30, (2, 5)), torch.tensor([5, 3])),
                          str(tmp_path / "names.onnx"), input_names=["chars", "n"],
                          output_names=["scores"], opset_version=17, dynamo=False,
                          dynamic_axes={"chars": {0: "b", 1: "t"}, "n": {0: "b"},
                                        "scores": {0: "b"}})
    assert main(["pack", "classifier", "--onnx", str(tmp_path / "names.onnx"), "--tokenizer",
                 str(tok), "--labels", "en,fr", "--repo", str(tmp_path / "repo"), "--name",
                 "names", "--max-tokens", "16"]) == 0
    capsys.readouterr()
    out = _inspect(capsys, str(tmp_path / "repo" / "names"))
    assert "input  input_ids <- chars: int64 [b*, t*]" in out
    assert "output logits <- scores: float32 [b*, 2]" in out
    assert "pad 0 '<pad>'" in out and "bos -1, eos -1" in out
    info = json.loads(_inspect(capsys, str(tmp_path / "repo" / "names" / "1"), "--json"))
    logits = info["graphs"]["classifier"]["outputs"][0]
    assert logits == {"name": "logits", "in_file": "scores", "dtype": "float32",
                      "shape": ["b", 2], "contract": ["batch", "classes"],
                      "dynamic": ["b"]}
