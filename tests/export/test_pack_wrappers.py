"""seqserve's own length-aware wrappers under PyTorch's default ONNX exporter.

Modules written as the tutorials write them, their recurrent layer wrapped with
`seqserve.pack.bidirectional` or `seqserve.pack.length_aware` (nn.LSTM and nn.GRU, batch_first
either way), exported by `torch.onnx.export(..., dynamo=True)` with a dynamic batch and
sequence: ONNX Runtime answers at every length (one step, the example's, others, a long one)
and every batch composition as the eager module does, each row alone and in its padded batch
(1e-4). Packed by `seqserve.pack`, such modules go through that exporter (the manifest's
`source.exporter` is "dynamo") and are served equal to eager."""

from __future__ import annotations

import json
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import onnxruntime as ort
import pytest
import torch
from foreign_models import char_tokenizer
from torch import Tensor, nn

import seqserve.pack
from seqserve.models.text.tokenizer_files import load_tokenizer

VOCAB = 30  # char_tokenizer: <pad>, <unk> and 28 characters
EXAMPLE = [6, 4, 2]
BATCHES = [[1], [1, 1], [5], [6, 4, 2], [2, 9, 1, 5], [23, 1, 12, 7], [3, 3]]
"""Lengths of the batches run: one step, the example's, shorter and longer ones, mixed."""


class JointBiRNN(nn.Module):
    """Joint intent detection and slot filling: a bidirectional layer, slot scores per token
    and the intent from both directions' final states (time-major when not batch_first)."""

    def __init__(self, cell: type[nn.RNNBase], batch_first: bool, hidden: int = 10) -> None:
        super().__init__()
        self.batch_first = batch_first
        self.embedding = nn.Embedding(VOCAB, 8, padding_idx=0)
        self.rnn = seqserve.pack.bidirectional(cell(8, hidden, num_layers=2,
                                                    bidirectional=True,
                                                    batch_first=batch_first))
        self.slots = nn.Linear(2 * hidden, 4)
        self.intent = nn.Linear(2 * hidden, 3)

    def forward(self, ids: Tensor, lengths: Tensor) -> tuple[Tensor, Tensor]:
        embedded = self.embedding(ids if self.batch_first else ids.t())
        output, hidden = self.rnn(embedded, lengths)
        if isinstance(hidden, tuple):  # an LSTM's (h_n, c_n)
            hidden = hidden[0]
        output = output if self.batch_first else output.transpose(0, 1)  # (B, T, 2H)
        return self.slots(output), self.intent(torch.cat((hidden[-2], hidden[-1]), dim=1))


class LengthAwareEncoder(nn.Module):
    """The seq2seq tutorial's encoder, its layer wrapped: outputs and each row's own final
    state (an LSTM's cell state too)."""

    def __init__(self, cell: type[nn.RNNBase], batch_first: bool, hidden: int = 10) -> None:
        super().__init__()
        self.batch_first = batch_first
        self.embedding = nn.Embedding(VOCAB, 8)
        self.rnn = seqserve.pack.length_aware(cell(8, hidden, num_layers=2,
                                                   batch_first=batch_first))

    def forward(self, ids: Tensor, lengths: Tensor) -> tuple[Tensor, ...]:
        embedded = self.embedding(ids if self.batch_first else ids.t())
        outputs, hidden = self.rnn(embedded, lengths)
        outputs = outputs if self.batch_first else outputs.transpose(0, 1)
        return (outputs, *(hidden if isinstance(hidden, tuple) else (hidden,)))


LABELS = ["neg", "neu", "pos"]
TEXTS = ["a", "no", "not bad", "quite good really", "z",
         "the longest of these sentences here"]


class BiRNNClassifier(nn.Module):
    """The sentiment tutorial's classifier (time-major unless batch_first), both final
    hidden states concatenated into a linear head, its layer wrapped."""

    def __init__(self, cell: type[nn.RNNBase], batch_first: bool = False, hidden: int = 12,
                 **kwargs: Any) -> None:
        super().__init__()
        self.batch_first = batch_first
        self.embedding = nn.Embedding(VOCAB, 8, padding_idx=0)
        self.rnn = seqserve.pack.bidirectional(cell(8, hidden, bidirectional=True,
                                                    batch_first=batch_first, **kwargs))
        self.fc = nn.Linear(2 * hidden, len(LABELS))

    def forward(self, text: Tensor, text_lengths: Tensor) -> Tensor:
        embedded = self.embedding(text if self.batch_first else text.t())
        _, hidden = self.rnn(embedded, text_lengths)
        if isinstance(hidden, tuple):
            hidden = hidden[0]
        return self.fc(torch.cat((hidden[-2], hidden[-1]), dim=1))


def _batch(lengths: list[int], seed: int) -> tuple[Tensor, Tensor]:
    gen = torch.Generator().manual_seed(seed)
    n = torch.tensor(lengths)
    ids = torch.randint(2, VOCAB, (len(lengths), max(lengths)), generator=gen)
    return ids.masked_fill(torch.arange(max(lengths))[None] >= n[:, None], 0), n


def _default_export(model: nn.Module, path: Path) -> ort.InferenceSession:
    """`model` exported as a user would with the default exporter: a Dim for batch and
    sequence."""
    batch, seq = torch.export.Dim("batch"), torch.export.Dim("seq")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model.eval(), _batch(EXAMPLE, 0), str(path), dynamo=True,
                          input_names=["ids", "lengths"],
                          dynamic_shapes=({0: batch, 1: seq}, {0: batch}))
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def _eager(model: nn.Module, ids: Tensor, n: Tensor) -> tuple[Tensor, ...]:
    with torch.no_grad():
        out = model(ids, n)
    return out if isinstance(out, tuple) else (out,)


def _equal_to_eager(run: Callable[[Tensor, Tensor], list[np.ndarray]], model: nn.Module,
                    batch_axes: tuple[int, ...]) -> None:
    """Each output of `run` on every batch equals the eager module's on the same batch and,
    row by row, on the row alone (its first `length` steps where an output has steps)."""
    for seed, lengths in enumerate(BATCHES):
        ids, n = _batch(lengths, seed)
        got, want = run(ids, n), _eager(model, ids, n)
        assert len(got) == len(want) == len(batch_axes)
        for a, b in zip(got, want, strict=True):
            np.testing.assert_allclose(a, b.numpy(), atol=1e-4, err_msg=f"lengths {lengths}")
        for row, length in enumerate(lengths):
            alone = _eager(model, ids[row:row + 1, :length], n[row:row + 1])
            for a, b, axis in zip(got, alone, batch_axes, strict=True):
                b = b.numpy().take(0, axis=axis)
                a = a.take(row, axis=axis)[tuple(slice(0, s) for s in b.shape)]
                np.testing.assert_allclose(a, b, atol=1e-4,
                                           err_msg=f"row {row} of lengths {lengths}")


def _onnx_runner(session: ort.InferenceSession) -> Callable[[Tensor, Tensor], list[np.ndarray]]:
    names = [i.name for i in session.get_inputs()]
    return lambda ids, n: session.run(None, dict(zip(names, (ids.numpy(), n.numpy()),
                                                     strict=True)))


# (LSTM and GRU, each with one batch_first: a default export costs ~10 s on 2 cores)
CELLS = [(nn.LSTM, True), (nn.GRU, False)]


@pytest.mark.parametrize(("cell", "batch_first"), CELLS)
def test_the_bidirectional_wrapper_exports_every_length(
        cell: type[nn.RNNBase], batch_first: bool, tmp_path: Path) -> None:
    """Before, the native layers inside fixed the time axis at the example's 6: ONNX Runtime
    failed at every other length."""
    torch.manual_seed(0)
    model = JointBiRNN(cell, batch_first).eval()
    session = _default_export(model, tmp_path / "joint.onnx")
    _equal_to_eager(_onnx_runner(session), model, (0, 0))


@pytest.mark.parametrize(("cell", "batch_first"), CELLS[::-1])
def test_the_length_aware_wrapper_exports_every_length(
        cell: type[nn.RNNBase], batch_first: bool, tmp_path: Path) -> None:
    torch.manual_seed(1)
    model = LengthAwareEncoder(cell, batch_first).eval()
    session = _default_export(model, tmp_path / "encoder.onnx")
    states = 2 if cell is nn.LSTM else 1
    _equal_to_eager(_onnx_runner(session), model, (0,) + (1,) * states)


def test_eager_results_stay_the_native_layers() -> None:
    """Eagerly the bidirectional wrapper runs the user's native layer: without lengths it
    answers as the layer itself, c_n included."""
    torch.manual_seed(2)
    rnn = nn.LSTM(5, 6, num_layers=2, bidirectional=True).eval()
    x = torch.randn(7, 3, 5)
    with torch.no_grad():
        want, (h, c) = rnn(x)
        got, (h2, c2) = seqserve.pack.bidirectional(rnn)(x)
    for a, b in ((got, want), (h2, h), (c2, c)):
        assert torch.allclose(a, b, atol=1e-6)


def test_a_relu_rnn_falls_back_to_the_torchscript_exporter_saying_so(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The dynamo form runs tanh cells only: pack says so and exports with dynamo=False."""
    torch.manual_seed(3)
    model = BiRNNClassifier(nn.RNN, batch_first=True, nonlinearity="relu").eval()
    path = seqserve.pack.classifier(model, tokenizer=char_tokenizer(tmp_path / "chars.json"),
                                    labels=LABELS, repo=tmp_path / "r", name="relu",
                                    max_tokens=16, torchscript=False)
    assert json.loads((path / "manifest.json").read_text())["source"]["exporter"] == \
        "torchscript"
    said = " ".join(capsys.readouterr().out.split())
    assert "nonlinearity='relu'" in said and "dynamo=False" in said
    session = ort.InferenceSession(str(path / "classifier.onnx"),
                                   providers=["CPUExecutionProvider"])
    _equal_to_eager(_onnx_runner(session), model, (0,))


@pytest.fixture(scope="module")
def packed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    d = tmp_path_factory.mktemp("wrappers")
    tok = char_tokenizer(d / "chars.json")
    torch.manual_seed(4)
    clf = BiRNNClassifier(nn.LSTM).eval()
    tagger = JointBiRNN(nn.GRU, batch_first=True).eval()
    common = {"tokenizer": tok, "repo": d / "repo", "max_tokens": 40, "progress": False}
    seqserve.pack.classifier(clf, labels=LABELS, name="sentiment", **common)
    seqserve.pack.tagger(_Slots(tagger), labels="a,b,c,d", name="slots", **common)
    return {"repo": d / "repo", "tok": tok, "clf": clf, "tagger": tagger}


class _Slots(nn.Module):
    """The joint model's slot scores alone: what a tagger bundle serves."""

    def __init__(self, model: JointBiRNN) -> None:
        super().__init__()
        self.model = model

    def forward(self, ids: Tensor, lengths: Tensor) -> Tensor:
        return self.model(ids, lengths)[0]


@pytest.fixture(scope="module")
def server(packed: dict[str, Any]) -> Iterator[str]:
    from service_fakes import serve_repo

    with serve_repo(packed["repo"], max_wait_ms=20, max_tokens=40) as url:
        yield url


def test_packed_wrappers_go_through_the_default_exporter(packed: dict[str, Any]) -> None:
    for name in ("sentiment", "slots"):
        manifest = json.loads((packed["repo"] / name / "1" / "manifest.json").read_text())
        assert manifest["source"]["exporter"] == "dynamo", name


def test_a_packed_bidirectional_classifier_serves_the_eager_answers(
        packed: dict[str, Any], server: str) -> None:
    tok = load_tokenizer(packed["tok"])
    r = httpx.post(f"{server}/v1/models/sentiment/classify",
                   json={"texts": TEXTS, "top_k": 3}, timeout=60)
    assert r.status_code == 200, r.text
    for text, res in zip(TEXTS, r.json()["results"], strict=True):
        ids = tok.encode(text)
        with torch.no_grad():
            p = torch.softmax(packed["clf"](torch.tensor([ids]), torch.tensor([len(ids)]))[0],
                              -1)
        got = {t["label"]: t["probability"] for t in res["top_k"]}
        assert max(abs(got[lab] - float(p[i])) for i, lab in enumerate(LABELS)) < 1e-4


def test_a_packed_bidirectional_tagger_serves_the_eager_answers(
        packed: dict[str, Any], server: str) -> None:
    tok = load_tokenizer(packed["tok"])
    r = httpx.post(f"{server}/v1/models/slots/tag", json={"texts": TEXTS}, timeout=60)
    assert r.status_code == 200, r.text
    for text, res in zip(TEXTS, r.json()["results"], strict=True):
        ids = tok.encode(text)
        with torch.no_grad():
            lp = torch.log_softmax(packed["tagger"](torch.tensor([ids]),
                                                    torch.tensor([len(ids)]))[0][0], -1)
        assert [w["token"] for w in res["tokens"]] == text.split()
        for w in res["tokens"]:  # a word's label is read at its first character
            assert w["label"] == "abcd"[int(lp[w["start"]].argmax())]
            assert abs(w["probability"] - float(lp[w["start"]].exp().max())) < 1e-4
