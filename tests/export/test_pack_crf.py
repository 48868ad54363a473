"""CRF taggers as their authors write them, packed and served by a real server: the PyTorch
tutorial's BiLSTM_CRF (START / STOP tags in its `transitions`, a one-sentence
`_get_lstm_features`, `_viterbi_decode` in Python loops, a word-to-index dict) and a
torchcrf-style layer (`transitions`, `start_transitions`, `end_transitions`, `decode`) on a
BiLSTM that packs its batches, each trained for a few steps on a small synthetic task in which
a word's tag depends on the tag before it. Held-out sentences of different lengths, sent in
one request, are tagged as the module's own Viterbi tags them (the tutorial's differs from
each token's best emission on some), with its path score; the CLI packs the same emissions with a
--crf file; what pack cannot serve is refused, naming why."""

from __future__ import annotations

import random
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from torch import Tensor, nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

import seqserve.pack
from seqserve.cli import main
from seqserve.export.manifest import read_manifest
from seqserve.models.errors import UserError

START_TAG = "<START>"
STOP_TAG = "<STOP>"
TAGS = ["B", "I", "O"]
NAMES = ["anna", "bob", "carl", "dora", "emil"]
OTHERS = ["met", "saw", "and", "the", "cat", "today", "with"]
AMBIGUOUS = ["jr", "van"]  # I after a name, O elsewhere: only the previous tag says which


def _sentence(rng: random.Random, length: int) -> tuple[list[str], list[str]]:
    words, tags = [], []
    for _ in range(length):
        kind = rng.random()
        if kind < 0.35:
            words.append(rng.choice(NAMES))
            tags.append("I" if tags and tags[-1] in ("B", "I") and rng.random() < 0.3 else "B")
        elif kind < 0.55 and tags:
            words.append(rng.choice(AMBIGUOUS))
            tags.append("I" if tags[-1] in ("B", "I") else "O")
        else:
            words.append(rng.choice(OTHERS))
            tags.append("O")
    return words, tags


def _data(seed: int, count: int) -> list[tuple[list[str], list[str]]]:
    rng = random.Random(seed)
    return [_sentence(rng, rng.randint(2, 9)) for _ in range(count)]


WORD_TO_IX = {w: i for i, w in enumerate(["<unk>", *NAMES, *OTHERS, *AMBIGUOUS])}
TAG_TO_IX = {"B": 0, "I": 1, "O": 2, START_TAG: 3, STOP_TAG: 4}


def _tokenizer(path: Path) -> Path:
    """The word-to-index dict as a tokenizer.json (whitespace words, one id each)."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel(WORD_TO_IX, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.save(str(path))
    return path


def _ids(words: list[str]) -> Tensor:
    return torch.tensor([WORD_TO_IX.get(w, 0) for w in words], dtype=torch.long)


def argmax(vec: Tensor) -> int:
    _, idx = torch.max(vec, 1)
    return int(idx.item())


def log_sum_exp(vec: Tensor) -> Tensor:
    max_score = vec[0, argmax(vec)]
    max_score_broadcast = max_score.view(1, -1).expand(1, vec.size()[1])
    return max_score + torch.log(torch.sum(torch.exp(vec - max_score_broadcast)))


class BiLSTM_CRF(nn.Module):  # noqa: N801 (the tutorial's name)
    """The PyTorch tutorial's BiLSTM-CRF ("Advanced: Making Dynamic Decisions and the
    Bi-LSTM CRF"), as written there but for `init_hidden`, which starts from zeros (the
    tutorial draws it with torch.randn at every call: see the refusal test)."""

    def __init__(self, vocab_size: int, tag_to_ix: dict[str, int], embedding_dim: int,
                 hidden_dim: int, random_hidden: bool = False) -> None:
        super().__init__()
        self.embedding_dim = embedding_dim
        self.hidden_dim = hidden_dim
        self.vocab_size = vocab_size
        self.tag_to_ix = tag_to_ix
        self.tagset_size = len(tag_to_ix)
        self.random_hidden = random_hidden
        self.word_embeds = nn.Embedding(vocab_size, embedding_dim)
        self.lstm = nn.LSTM(embedding_dim, hidden_dim // 2, num_layers=1, bidirectional=True)
        self.hidden2tag = nn.Linear(hidden_dim, self.tagset_size)
        self.transitions = nn.Parameter(torch.randn(self.tagset_size, self.tagset_size))
        self.transitions.data[tag_to_ix[START_TAG], :] = -10000
        self.transitions.data[:, tag_to_ix[STOP_TAG]] = -10000
        self.hidden = self.init_hidden()

    def init_hidden(self) -> tuple[Tensor, Tensor]:
        draw = torch.randn if self.random_hidden else torch.zeros
        return (draw(2, 1, self.hidden_dim // 2), draw(2, 1, self.hidden_dim // 2))

    def _forward_alg(self, feats: Tensor) -> Tensor:
        init_alphas = torch.full((1, self.tagset_size), -10000.)
        init_alphas[0][self.tag_to_ix[START_TAG]] = 0.
        forward_var = init_alphas
        for feat in feats:
            # the tutorial's loop over next tags, as one broadcast (same sums)
            scores = forward_var + self.transitions + feat.view(-1, 1)  # (next, prev)
            forward_var = torch.logsumexp(scores, dim=1).view(1, -1)
        terminal_var = forward_var + self.transitions[self.tag_to_ix[STOP_TAG]]
        return log_sum_exp(terminal_var)

    def _get_lstm_features(self, sentence: Tensor) -> Tensor:
        self.hidden = self.init_hidden()
        embeds = self.word_embeds(sentence).view(len(sentence), 1, -1)
        lstm_out, self.hidden = self.lstm(embeds, self.hidden)
        lstm_out = lstm_out.view(len(sentence), self.hidden_dim)
        lstm_feats = self.hidden2tag(lstm_out)
        return lstm_feats

    def _score_sentence(self, feats: Tensor, tags: Tensor) -> Tensor:
        score = torch.zeros(1)
        tags = torch.cat([torch.tensor([self.tag_to_ix[START_TAG]], dtype=torch.long), tags])
        for i, feat in enumerate(feats):
            score = score + self.transitions[tags[i + 1], tags[i]] + feat[tags[i + 1]]
        score = score + self.transitions[self.tag_to_ix[STOP_TAG], tags[-1]]
        return score

    def _viterbi_decode(self, feats: Tensor) -> tuple[Tensor, list[int]]:
        backpointers = []
        init_vvars = torch.full((1, self.tagset_size), -10000.)
        init_vvars[0][self.tag_to_ix[START_TAG]] = 0
        forward_var = init_vvars
        for feat in feats:
            bptrs_t = []
            viterbivars_t = []
            for next_tag in range(self.tagset_size):
                next_tag_var = forward_var + self.transitions[next_tag]
                best_tag_id = argmax(next_tag_var)
                bptrs_t.append(best_tag_id)
                viterbivars_t.append(next_tag_var[0][best_tag_id].view(1))
            forward_var = (torch.cat(viterbivars_t) + feat).view(1, -1)
            backpointers.append(bptrs_t)
        terminal_var = forward_var + self.transitions[self.tag_to_ix[STOP_TAG]]
        best_tag_id = argmax(terminal_var)
        path_score = terminal_var[0][best_tag_id]
        best_path = [best_tag_id]
        for bptrs_t in reversed(backpointers):
            best_tag_id = bptrs_t[best_tag_id]
            best_path.append(best_tag_id)
        start = best_path.pop()
        assert start == self.tag_to_ix[START_TAG]
        best_path.reverse()
        return path_score, best_path

    def neg_log_likelihood(self, sentence: Tensor, tags: Tensor) -> Tensor:
        feats = self._get_lstm_features(sentence)
        forward_score = self._forward_alg(feats)
        gold_score = self._score_sentence(feats, tags)
        return forward_score - gold_score

    def forward(self, sentence: Tensor) -> tuple[Tensor, list[int]]:
        lstm_feats = self._get_lstm_features(sentence)
        score, tag_seq = self._viterbi_decode(lstm_feats)
        return score, tag_seq


class CRF(nn.Module):
    """A CRF layer written as torchcrf's: transitions [previous, next], start and end scores,
    batch_first, forward -> log-likelihood, decode -> best tags per sentence."""

    def __init__(self, num_tags: int, batch_first: bool = False) -> None:
        super().__init__()
        self.num_tags = num_tags
        self.batch_first = batch_first
        self.start_transitions = nn.Parameter(torch.empty(num_tags).uniform_(-0.1, 0.1))
        self.end_transitions = nn.Parameter(torch.empty(num_tags).uniform_(-0.1, 0.1))
        self.transitions = nn.Parameter(torch.empty(num_tags, num_tags).uniform_(-0.1, 0.1))

    def forward(self, emissions: Tensor, tags: Tensor, mask: Tensor) -> Tensor:
        if self.batch_first:
            emissions, tags, mask = (emissions.transpose(0, 1), tags.transpose(0, 1),
                                     mask.transpose(0, 1))
        mask = mask.float()
        steps, batch = tags.shape
        rows = torch.arange(batch)
        score = self.start_transitions[tags[0]] + emissions[0, rows, tags[0]]
        for i in range(1, steps):
            score = score + (self.transitions[tags[i - 1], tags[i]]
                             + emissions[i, rows, tags[i]]) * mask[i]
        ends = mask.long().sum(0) - 1
        score = score + self.end_transitions[tags[ends, rows]]
        alpha = self.start_transitions + emissions[0]
        for i in range(1, steps):
            nxt = torch.logsumexp(alpha.unsqueeze(2) + self.transitions
                                  + emissions[i].unsqueeze(1), dim=1)
            alpha = torch.where(mask[i].unsqueeze(1).bool(), nxt, alpha)
        return (score - torch.logsumexp(alpha + self.end_transitions, dim=1)).sum()

    def decode(self, emissions: Tensor, mask: Tensor) -> list[list[int]]:
        if self.batch_first:
            emissions, mask = emissions.transpose(0, 1), mask.transpose(0, 1)
        steps, batch, _ = emissions.shape
        score = self.start_transitions + emissions[0]
        history = []
        for i in range(1, steps):
            nxt, indices = (score.unsqueeze(2) + self.transitions
                            + emissions[i].unsqueeze(1)).max(dim=1)
            score = torch.where(mask[i].unsqueeze(1), nxt, score)
            history.append(indices)
        score = score + self.end_transitions
        ends = mask.long().sum(0) - 1
        best = []
        for b in range(batch):
            tag = int(score[b].argmax())
            tags = [tag]
            for hist in reversed(history[: int(ends[b])]):
                tag = int(hist[b][tag])
                tags.append(tag)
            best.append(tags[::-1])
        return best


class PackedBiLSTMCRF(nn.Module):
    """A batched BiLSTM-CRF as blog posts write it: packing, a torchcrf-style CRF, the loss
    as forward and `emissions` for decoding."""

    def __init__(self, vocab: int, tags: int) -> None:
        super().__init__()
        self.embedding = nn.Embedding(vocab, 12)
        self.lstm = nn.LSTM(12, 10, batch_first=True, bidirectional=True)
        self.fc = nn.Linear(20, tags)
        self.crf = CRF(tags, batch_first=True)

    def emissions(self, ids: Tensor, lengths: Tensor) -> Tensor:
        packed = pack_padded_sequence(self.embedding(ids), lengths.cpu(), batch_first=True,
                                      enforce_sorted=False)
        out, _ = self.lstm(packed)
        out, _ = pad_packed_sequence(out, batch_first=True, total_length=ids.shape[1])
        return self.fc(out)

    def forward(self, ids: Tensor, tags: Tensor, mask: Tensor) -> Tensor:
        lengths = mask.long().sum(1)
        return -self.crf(self.emissions(ids, lengths), tags, mask)


TRAIN = _data(1, 120)
HELD_OUT = _data(99, 12)


def _train_tutorial() -> BiLSTM_CRF:
    torch.manual_seed(0)
    model = BiLSTM_CRF(len(WORD_TO_IX), TAG_TO_IX, 8, 12)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, weight_decay=1e-4)
    for words, tags in TRAIN[:80]:  # a few steps: one sentence each, as the tutorial trains
        model.zero_grad()
        loss = model.neg_log_likelihood(_ids(words), torch.tensor([TAG_TO_IX[t] for t in tags]))
        loss.backward()
        optimizer.step()
    return model.eval()


def _batch(data: list[tuple[list[str], list[str]]]) -> tuple[Tensor, Tensor, Tensor]:
    lengths = torch.tensor([len(w) for w, _ in data])
    ids = torch.zeros(len(data), int(lengths.max()), dtype=torch.long)
    tags = torch.zeros_like(ids)
    for i, (words, labels) in enumerate(data):
        ids[i, : len(words)] = _ids(words)
        tags[i, : len(words)] = torch.tensor([TAGS.index(t) for t in labels])
    return ids, tags, lengths


def _train_packed() -> PackedBiLSTMCRF:
    torch.manual_seed(1)
    model = PackedBiLSTMCRF(len(WORD_TO_IX), len(TAGS))
    optimizer = torch.optim.Adam(model.parameters(), lr=0.02)
    for step in range(12):
        ids, tags, lengths = _batch(TRAIN[step * 10 : step * 10 + 10])
        optimizer.zero_grad()
        model(ids, tags, torch.arange(ids.shape[1])[None] < lengths[:, None]).backward()
        optimizer.step()
    return model.eval()


@pytest.fixture(scope="module")
def packed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    d = tmp_path_factory.mktemp("crf")
    repo = d / "repo"
    tok = _tokenizer(d / "words.json")
    tutorial, batched = _train_tutorial(), _train_packed()
    common = {"tokenizer": tok, "labels": TAGS, "repo": repo, "max_tokens": 16,
              "progress": False}
    seqserve.pack.tagger(tutorial, name="tutorial", **common)
    seqserve.pack.tagger(batched, name="torchcrf", emissions=batched.emissions, **common)
    seqserve.pack.tagger(batched, name="no-crf", emissions=batched.emissions, crf=False,
                         **common)
    # the CLI: the same emissions exported by hand, the CRF's scores as a JSON file
    ids, _, lengths = _batch(TRAIN[:3])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(_EmissionsOnly(batched), (ids, lengths), str(d / "em.onnx"),
                          input_names=["tokens", "n"], output_names=["emissions"],
                          dynamic_axes={"tokens": {0: "b", 1: "t"}, "n": {0: "b"},
                                        "emissions": {0: "b", 1: "t"}},
                          opset_version=17, dynamo=False)
    crf = batched.crf
    (d / "crf.json").write_text(json_crf(crf))
    assert main(["pack", "tagger", "--onnx", str(d / "em.onnx"), "--tokenizer", str(tok),
                 "--labels", ",".join(TAGS), "--repo", str(repo), "--name", "cli",
                 "--max-tokens", "16", "--crf", str(d / "crf.json")]) == 0
    return {"repo": repo, "tutorial": tutorial, "batched": batched, "dir": d, "tok": tok}


class _EmissionsOnly(nn.Module):
    """The batched model's emissions as a module to export by hand, each row's scores past
    its length zeroed (bidirectional within lengths: seqserve.pack.bidirectional)."""

    def __init__(self, model: PackedBiLSTMCRF) -> None:
        super().__init__()
        self.model = model
        self.rnn = seqserve.pack.bidirectional(model.lstm)

    def forward(self, ids: Tensor, lengths: Tensor) -> Tensor:
        out, _ = self.rnn(self.model.embedding(ids), lengths)
        return self.model.fc(out)


def json_crf(crf: CRF) -> str:
    import json

    return json.dumps({"transitions": crf.transitions.tolist(),
                       "start": crf.start_transitions.tolist(),
                       "end": crf.end_transitions.tolist()})


@pytest.fixture(scope="module")
def server(packed: dict[str, Any]) -> Iterator[str]:
    from service_fakes import serve_repo

    with serve_repo(packed["repo"], max_wait_ms=20, max_tokens=16) as url:
        yield url


def _tag(url: str, name: str, texts: list[str]) -> list[dict[str, Any]]:
    r = httpx.post(f"{url}/v1/models/{name}/tag", json={"texts": texts, "return_score": True},
                   timeout=60)
    assert r.status_code == 200, r.text
    return list(r.json()["results"])


def test_the_tutorials_bilstm_crf_is_served_as_its_own_viterbi(packed: dict[str, Any],
                                                              server: str) -> None:
    model: BiLSTM_CRF = packed["tutorial"]
    manifest = read_manifest(packed["repo"] / "tutorial" / "1")
    assert manifest.schema_version == 4 and manifest.crf is not None
    assert manifest.crf.file in manifest.files and manifest.crf.unit == "tokens"
    assert manifest.source["crf"].startswith("BiLSTM_CRF.transitions (START 3, STOP 4)")
    assert manifest.source["crf_checked_sentences"] == 3
    texts = [" ".join(words) for words, _ in HELD_OUT]
    assert len({len(w) for w, _ in HELD_OUT}) > 3  # different lengths in one batch
    results = _tag(server, "tutorial", texts)
    differs = 0
    for (words, _), result in zip(HELD_OUT, results, strict=True):
        with torch.no_grad():
            score, path = model(_ids(words))
            feats = model._get_lstm_features(_ids(words))
        got = [t["label"] for t in result["tokens"]]
        assert [t["token"] for t in result["tokens"]] == words
        assert got == [TAGS[i] for i in path]
        assert result["score"] == pytest.approx(float(score), rel=1e-4, abs=1e-4)
        assert all(0.0 < t["probability"] <= 1.0 for t in result["tokens"])
        differs += [TAGS[int(i)] for i in feats[:, :3].argmax(-1)] != got
    assert differs >= 1  # the CRF decides some sentences' tags, not the emissions alone


def _torchcrf_decode(model: PackedBiLSTMCRF, data: list[tuple[list[str], list[str]]]
                     ) -> tuple[list[list[int]], Tensor, Tensor, Tensor]:
    ids, _, lengths = _batch(data)
    mask = torch.arange(ids.shape[1])[None] < lengths[:, None]
    with torch.no_grad():
        em = model.emissions(ids, lengths)
        return model.crf.decode(em, mask), em, lengths, mask


@pytest.mark.parametrize("name", ["torchcrf", "cli"])
def test_a_torchcrf_style_layer_is_served_as_its_own_decode(packed: dict[str, Any],
                                                            server: str, name: str) -> None:
    model: PackedBiLSTMCRF = packed["batched"]
    manifest = read_manifest(packed["repo"] / name / "1")
    assert manifest.crf is not None
    paths, em, lengths, mask = _torchcrf_decode(model, HELD_OUT)
    results = _tag(server, name, [" ".join(w) for w, _ in HELD_OUT])
    for i, ((words, _), result) in enumerate(zip(HELD_OUT, results, strict=True)):
        assert [t["label"] for t in result["tokens"]] == [TAGS[j] for j in paths[i]]
        n = len(words)
        crf = model.crf
        with torch.no_grad():
            tags = torch.tensor(paths[i])
            score = (crf.start_transitions[tags[0]] + crf.end_transitions[tags[-1]]
                     + em[i, torch.arange(n), tags].sum()
                     + crf.transitions[tags[:-1], tags[1:]].sum())
        assert result["score"] == pytest.approx(float(score), rel=1e-4, abs=1e-4)


def test_without_a_crf_nothing_changes_but_the_score_on_request(packed: dict[str, Any],
                                                                 server: str) -> None:
    """crf=False packs the emissions alone: each token's best label, as before; its score is
    the sum of the chosen labels' log-probs."""
    model: PackedBiLSTMCRF = packed["batched"]
    manifest = read_manifest(packed["repo"] / "no-crf" / "1")
    assert manifest.crf is None and "crf.npy" not in manifest.files
    _, em, lengths, _ = _torchcrf_decode(model, HELD_OUT[:3])
    results = _tag(server, "no-crf", [" ".join(w) for w, _ in HELD_OUT[:3]])
    for i, result in enumerate(results):
        lp = torch.log_softmax(em[i, : int(lengths[i])], -1)
        best = lp.max(-1)
        assert [t["label"] for t in result["tokens"]] == [TAGS[j] for j in best.indices]
        assert result["score"] == pytest.approx(float(best.values.sum()), rel=1e-4, abs=1e-4)


def test_what_pack_cannot_serve_is_refused(packed: dict[str, Any]) -> None:
    common = {"tokenizer": packed["tok"], "labels": TAGS, "repo": packed["dir"] / "refused",
              "progress": False}
    torch.manual_seed(0)
    drawn = BiLSTM_CRF(len(WORD_TO_IX), TAG_TO_IX, 8, 12, random_hidden=True)
    with pytest.raises(UserError, match=r"init_hidden\(\) returns a different state.*zeros"):
        seqserve.pack.tagger(drawn, name="drawn", **common)
    batched = packed["batched"]
    with pytest.raises(UserError, match=r"forward often decodes or returns its loss: give "
                                        "emissions="):
        seqserve.pack.tagger(batched, name="loss", **common)
    unnamed = BiLSTM_CRF(len(WORD_TO_IX), TAG_TO_IX, 8, 12)
    unnamed.tag_to_ix = {"B": 0, "I": 1, "O": 2, "first": 3, "last": 4}
    with pytest.raises(UserError, match="no tag_to_ix with START and STOP"):
        seqserve.pack.tagger(unnamed, name="unnamed", **common)
    given = {"transitions": batched.crf.transitions.detach().numpy(),
             "start": batched.crf.start_transitions, "end": batched.crf.end_transitions}
    with pytest.raises(UserError, match="the CRF scores 3 tags but 2 labels were given"):
        seqserve.pack.tagger(batched, name="two", emissions=batched.emissions, crf=given,
                             **{**common, "labels": TAGS[:2]})
    assert not (packed["dir"] / "refused").exists()
