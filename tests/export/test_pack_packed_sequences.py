"""Tutorial RNN code that packs its batches, packed by `seqserve.pack` without a changed line.

The models are written as the PyTorch tutorials write them: `pack_padded_sequence(...,
enforce_sorted=False)` before the recurrent layer and `pad_packed_sequence` after it, imported
by name into this module or called as `torch.nn.utils.rnn.X`. `seqserve.pack` replaces the
packing during export by length-aware equivalents; the bundle's ONNX graph is then run with
ONNX Runtime and must equal the eager module (real packing) within 1e-4, each row alone and
in mixed batches."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import torch
from foreign_models import char_tokenizer
from torch import Tensor, nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

import seqserve.pack
from seqserve.export.pack.packing import export_friendly_packing

LABELS = ["en", "fr", "de"]
VOCAB = 30  # char_tokenizer: <pad>, <unk> and 28 characters


class BiLSTMClassifier(nn.Module):
    """Embedding, packed BiLSTM, both final hidden states concatenated into a linear head."""

    def __init__(self, vocab: int = VOCAB, labels: int = 3, hidden: int = 12) -> None:
        super().__init__()
        self.embedding = nn.Embedding(vocab, 8, padding_idx=0)
        self.lstm = nn.LSTM(8, hidden, batch_first=True, bidirectional=True)
        self.fc = nn.Linear(2 * hidden, labels)

    def forward(self, text: Tensor, text_lengths: Tensor) -> Tensor:
        embedded = self.embedding(text)
        packed = pack_padded_sequence(embedded, text_lengths.cpu(), batch_first=True,
                                      enforce_sorted=False)
        packed_output, (hidden, cell) = self.lstm(packed)
        output, output_lengths = pad_packed_sequence(packed_output, batch_first=True)
        hidden = torch.cat((hidden[-2, :, :], hidden[-1, :, :]), dim=1)
        return self.fc(hidden)


class GRUEncoderTagger(nn.Module):
    """The seq2seq tutorial's encoder (time-major GRU over packed embeddings), its outputs
    tagged per token."""

    def __init__(self, vocab: int = VOCAB, tags: int = 3, hidden: int = 10) -> None:
        super().__init__()
        self.embedding = nn.Embedding(vocab, 8)
        self.gru = nn.GRU(8, hidden, num_layers=2)
        self.out = nn.Linear(hidden, tags)

    def forward(self, input_seq: Tensor, input_lengths: Tensor) -> Tensor:
        embedded = self.embedding(input_seq.t())  # (T, B, E)
        packed = torch.nn.utils.rnn.pack_padded_sequence(embedded, input_lengths,
                                                         enforce_sorted=False)
        outputs, hidden = self.gru(packed)
        outputs, _ = torch.nn.utils.rnn.pad_packed_sequence(outputs)  # (T, B, H)
        return self.out(outputs).transpose(0, 1)  # (B, T, C)


def _batch(lengths: list[int], seed: int) -> tuple[Tensor, Tensor]:
    gen = torch.Generator().manual_seed(seed)
    n = torch.tensor(lengths)
    ids = torch.randint(2, VOCAB, (len(lengths), max(lengths)), generator=gen)
    return ids.masked_fill(torch.arange(max(lengths))[None] >= n[:, None], 0), n


BATCHES = [[1], [3], [7], [7, 3, 1], [3, 7, 1, 3], [1, 1], [7, 7, 2]]


@pytest.mark.parametrize("cell", [nn.LSTM, nn.GRU, nn.RNN])
@pytest.mark.parametrize("bidirectional", [False, True])
@pytest.mark.parametrize("batch_first", [False, True])
def test_the_replacement_equals_real_packing(cell: type[nn.RNNBase], bidirectional: bool,
                                             batch_first: bool) -> None:
    torch.manual_seed(0)
    rnn = cell(5, 6, num_layers=2, bidirectional=bidirectional, batch_first=batch_first).eval()
    holder = nn.Sequential(rnn)
    for lengths, sort in (([7, 3, 1, 5], False), ([7, 5, 3, 1], True)):
        x = torch.randn(len(lengths), 7, 5)
        if not batch_first:
            x = x.transpose(0, 1)
        n = torch.tensor(lengths)
        runs = []
        for patched in (False, True):
            with torch.no_grad():
                if patched:
                    with export_friendly_packing(holder):
                        runs.append(_packed_run(rnn, x, n, batch_first, sort))
                else:
                    runs.append(_packed_run(rnn, x, n, batch_first, sort))
        for a, b in zip(runs[0], runs[1], strict=True):
            assert a.shape == b.shape
            assert torch.allclose(a, b, atol=1e-5), (a - b).abs().max()
    # everything is put back
    assert torch.nn.utils.rnn.pack_padded_sequence is pack_padded_sequence
    assert "forward" not in rnn.__dict__


def _packed_run(rnn: nn.RNNBase, x: Tensor, n: Tensor, batch_first: bool,
                sort: bool) -> list[Tensor]:
    packed = torch.nn.utils.rnn.pack_padded_sequence(x, n, batch_first=batch_first,
                                                     enforce_sorted=sort)
    out, state = rnn(packed)
    padded, lengths = torch.nn.utils.rnn.pad_packed_sequence(out, batch_first=batch_first)
    states = list(state) if isinstance(state, tuple) else [state]
    return [padded, lengths.to(torch.int64), *states]


def _bundle_graph(path: Path, graph: str) -> tuple[ort.InferenceSession, dict[str, object]]:
    manifest = json.loads((path / "manifest.json").read_text())
    session = ort.InferenceSession(str(path / manifest["graphs"][graph]["onnx"]),
                                   providers=["CPUExecutionProvider"])
    return session, manifest


def _equal_to_eager(session: ort.InferenceSession, model: nn.Module, output: int,
                    log_softmax: bool) -> None:
    for seed, lengths in enumerate(BATCHES):
        ids, n = _batch(lengths, seed)
        got = session.run(None, {"input_ids": ids.numpy(), "lengths": n.numpy()})[output]
        with torch.no_grad():
            want = model(ids, n)
            if log_softmax:
                want = torch.log_softmax(want, dim=-1)
        for row, length in enumerate(lengths):  # rows alone, as the eager module runs them
            with torch.no_grad():
                alone = model(ids[row:row + 1, :length], n[row:row + 1])[0]
                if log_softmax:
                    alone = torch.log_softmax(alone, dim=-1)
            valid = slice(0, length if log_softmax else None)  # a tagger's valid positions
            np.testing.assert_allclose(got[row][valid], alone[valid].numpy(), atol=1e-4)
            # and as the eager module runs it in the same padded batch
            np.testing.assert_allclose(got[row][valid], want[row][valid].numpy(), atol=1e-4)


def test_a_packed_bilstm_classifier_is_packed_unchanged(tmp_path: Path) -> None:
    torch.manual_seed(1)
    model = BiLSTMClassifier().eval()
    tok = char_tokenizer(tmp_path / "chars.json")
    path = seqserve.pack.classifier(model, tokenizer=tok, labels=LABELS, repo=tmp_path / "r",
                                    name="langs", max_tokens=16, torchscript=False,
                                    progress=False)
    session, manifest = _bundle_graph(path, "classifier")
    assert manifest["source"]["exporter"] == "dynamo"
    _equal_to_eager(session, model, 0, False)


def test_a_packed_gru_encoder_is_packed_unchanged(tmp_path: Path) -> None:
    torch.manual_seed(2)
    model = GRUEncoderTagger().eval()
    tok = char_tokenizer(tmp_path / "chars.json")
    path = seqserve.pack.tagger(model, tokenizer=tok, labels="a,b,c", repo=tmp_path / "r",
                                name="tags", max_tokens=16, torchscript=False, progress=False)
    session, manifest = _bundle_graph(path, "tagger")
    assert manifest["source"]["exporter"] == "dynamo"
    _equal_to_eager(session, model, 0, True)
