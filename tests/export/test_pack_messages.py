"""pack's refusals name the user's own files and tensors (plain.onnx, tag_scores), never the
contract's (tagger.onnx, log_probs), for models written outside seqserve; a graph that lost
its lengths input is told why; a series over the served limit names the flag that sets it
(the server's --max-tokens capping a --max-steps 512 bundle)."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from foreign_models import LSTMTagger, char_tokenizer
from torch import Tensor, nn

from seqserve.cli import main


class MaskedTagger(LSTMTagger):
    """The tutorial's tagger, its scores zeroed past each row's length (it reads lengths)."""

    def forward(self, ids: Tensor, lengths: Tensor) -> Tensor:
        out = super().forward(ids, lengths)
        return out * (torch.arange(ids.shape[1])[None] < lengths[:, None])[..., None].float()


class NaiveBiTagger(nn.Module):
    """A bidirectional LSTM run over the padded batch (its backward direction sees padding)."""

    def __init__(self) -> None:
        super().__init__()
        self.emb, self.rnn = nn.Embedding(30, 8), nn.LSTM(8, 8, bidirectional=True,
                                                          batch_first=True)
        self.out = nn.Linear(16, 3)

    def forward(self, ids: Tensor, lengths: Tensor) -> Tensor:
        h, _ = self.rnn(self.emb(ids))
        return self.out(h) * (lengths[:, None, None] > 0).float()


def _export(model: nn.Module, path: Path) -> Path:
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model.eval(), (torch.randint(2, 30, (2, 5)), torch.tensor([5, 3])),
                          str(path), input_names=["tokens", "n"], output_names=["tag_scores"],
                          dynamic_axes={"tokens": {0: "b", 1: "t"}, "n": {0: "b"},
                                        "tag_scores": {0: "b", 1: "t"}},
                          opset_version=17, dynamo=False)
    return path


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("messages")
    torch.manual_seed(0)
    return {"dir": d, "tok": char_tokenizer(d / "chars.json"),
            "plain": _export(MaskedTagger(30, 4), d / "plain.onnx"),
            "nolen": _export(LSTMTagger(30, 4), d / "nolen.onnx"),
            "bi": _export(NaiveBiTagger(), d / "bi.onnx")}


def _refusal(files: dict[str, Path], capsys: pytest.CaptureFixture[str], task: str,
             onnx: str, *extra: str) -> str:
    assert main(["pack", task, "--onnx", str(files[onnx]), "--tokenizer", str(files["tok"]),
                 "--repo", str(files["dir"] / "repo"), "--name", onnx, "--max-tokens", "16",
                 *extra]) == 2
    err = capsys.readouterr().err
    assert not (files["dir"] / "repo" / onnx / "1").exists()
    return err


def test_label_count_names_the_users_file_and_output(files: dict[str, Path],
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    err = _refusal(files, capsys, "tagger", "plain", "--labels", "a,b,c")
    assert "plain.onnx's output 'tag_scores' has 4 scores per token but 3 labels" in err
    assert "tagger.onnx" not in err and "log_probs" not in err


def test_padding_refusal_names_the_users_file_and_output(
        files: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    err = _refusal(files, capsys, "tagger", "bi", "--labels", "a,b,c")
    assert "batch invariance of bi.onnx's output 'tag_scores' is broken" in err
    assert "seqserve.pack.bidirectional" in err
    assert "tagger.onnx" not in err and "tagger.log_probs" not in err


def test_signature_refusal_names_the_users_file(files: dict[str, Path],
                                                capsys: pytest.CaptureFixture[str]) -> None:
    err = _refusal(files, capsys, "classifier", "plain", "--labels", "a,b,c,d")
    assert "plain.onnx: output tag_scores has rank 3" in err
    assert "classifier.onnx" not in err


def test_names_the_graph_lacks(files: dict[str, Path],
                               capsys: pytest.CaptureFixture[str]) -> None:
    err = _refusal(files, capsys, "tagger", "nolen", "--labels", "a,b,c,d")
    assert "nolen.onnx: the graph's inputs are ['tokens']" in err
    assert "your graph has no lengths input" in err and "never reads" in err
    err = _refusal(files, capsys, "tagger", "plain", "--labels", "a,b,c,d",
                   "--output-names", "scores")
    assert "plain.onnx: --output-names ['scores']: not in the graph, whose outputs are " \
           "['tag_scores']" in err


def test_series_limit_names_the_flag_that_sets_it(tmp_path: Path) -> None:
    from series_support import GRUForecaster, init
    from service_fakes import serve_in_thread, settings

    from seqserve.export.pack.api import sequence_tagger
    from seqserve.service.server.app import create_app

    repo = tmp_path / "repo"
    sequence_tagger(init(GRUForecaster()), features=3, outputs=1, repo=repo, name="long",
                    version=1, max_steps=512, progress=False,
                    grid={"batch_sizes": (1, 3), "lengths": (1, 7)})

    def refused(steps: int, **overrides: Any) -> str:
        with serve_in_thread(create_app(settings(repo, **overrides))) as url:
            r = httpx.post(f"{url}/v1/models/long/predict",
                           json={"series": [[[0.0, 0.0, 0.0]] * steps]}, timeout=60)
        assert r.status_code == 400, r.text
        return str(r.json()["error"])

    capped = refused(300)  # the server's default --max-tokens 256 caps the bundle's 512
    assert "series[0] has 300 steps > the model's limit 256" in capped
    assert "--max-tokens 256 caps this bundle's max_steps 512" in capped
    assert "serve with --max-tokens 512" in capped
    own = refused(600, max_tokens=1024, max_batch_tokens=8192)
    assert "> the model's limit 512 (the bundle's max_steps" in own
    assert "seqserve pack --max-steps" in own


def test_a_tokenizer_without_an_unknown_token_is_refused_with_that_reason(
        files: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    files = {**files, "tok": char_tokenizer(files["dir"] / "no-unk.json", specials=("<pad>",))}
    err = _refusal(files, capsys, "tagger", "plain", "--labels", "a,b,c,d")
    assert "its WordLevel model has no unknown token in its vocabulary" in err
    assert "add the model's unk_token" in err and "backtracking" not in err


def test_a_tokenizer_larger_than_the_embedding_is_refused_with_both_sizes(
        files: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    letters = [chr(c) for c in range(ord("a"), ord("z") + 1)] + list("0123456789 .,")
    files = {**files, "tok": char_tokenizer(files["dir"] / "big.json", letters=letters)}
    err = _refusal(files, capsys, "tagger", "plain", "--labels", "a,b,c,d")
    assert "plain.onnx: the tagger graph takes token ids below 30 (its embedding has 30 " \
           f"rows) but the tokenizer has {len(letters) + 2} tokens" in err
