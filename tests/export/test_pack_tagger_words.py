"""A tagger's word unit (`seqserve pack tagger --words whitespace|tokenizer`): a WordPiece
tagger with a BERT pre-tokenizer packed both ways (CLI and Python API), served by a real
server: with `tokenizer` "Hello," is two words ("Hello" and ","), each labelled at its first
token as the eager module labels it; with the default, whitespace words as before. A
SentencePiece tokenizer (no pre-tokenizer of its own) is refused for `tokenizer`."""

from __future__ import annotations

import json
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from foreign_models import LSTMTagger

import seqserve.pack
from seqserve.cli import main
from seqserve.export.manifest import read_manifest
from seqserve.models.errors import UserError

TEXT = "Hello, worlds! The cat's hat."
WORDS = ["[PAD]", "[UNK]", "hello", ",", "world", "##s", "!", "the", "cat", "'", "s", "hat",
         "."]
LABELS = ["a", "b", "c", "d"]


class MaskedTagger(LSTMTagger):
    """The tutorial's tagger with logits zeroed past each row's length (so its graph keeps
    the lengths input)."""

    def forward(self, ids: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        out = super().forward(ids, lengths)
        keep = torch.arange(ids.shape[1])[None, :] < lengths[:, None]
        return out * keep[..., None].to(out.dtype)


def _bert_tokenizer(path: Path) -> Path:
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers

    tok = Tokenizer(models.WordPiece({w: i for i, w in enumerate(WORDS)}, unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece()
    tok.add_special_tokens(["[PAD]", "[UNK]"])
    tok.save(str(path))
    return path


@pytest.fixture(scope="module")
def bundles(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    d = tmp_path_factory.mktemp("words")
    repo = d / "repo"
    tok = _bert_tokenizer(d / "bert.json")
    torch.manual_seed(0)
    tagger = MaskedTagger(len(WORDS), len(LABELS)).eval()
    with torch.no_grad():
        for p in tagger.parameters():
            p.mul_(3.0)
    ids, lengths = torch.randint(2, len(WORDS), (2, 6)), torch.tensor([6, 3])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(tagger, (ids, lengths), str(d / "plain.onnx"),
                          input_names=["tokens", "n"], output_names=["tag_scores"],
                          dynamic_axes={"tokens": {0: "b", 1: "t"}, "n": {0: "b"},
                                        "tag_scores": {0: "b", 1: "t"}},
                          opset_version=17, dynamo=False)
    common = ["--onnx", str(d / "plain.onnx"), "--tokenizer", str(tok), "--labels",
              ",".join(LABELS), "--repo", str(repo), "--max-tokens", "32"]
    assert main(["pack", "tagger", *common, "--name", "bert-words", "--words",
                 "tokenizer"]) == 0
    assert main(["pack", "tagger", *common, "--name", "spaced"]) == 0
    seqserve.pack.tagger(tagger, tokenizer=tok, labels=LABELS, repo=repo, name="bert-api",
                         max_tokens=32, progress=False, words="tokenizer")
    return {"repo": repo, "dir": d, "tok": tok, "tagger": tagger}


@pytest.fixture(scope="module")
def server(bundles: dict[str, Any]) -> Iterator[str]:
    from service_fakes import serve_repo

    with serve_repo(bundles["repo"], max_wait_ms=5, max_tokens=32) as url:
        yield url


def _eager(bundles: dict[str, Any], text: str) -> tuple[list[str], list[int | None]]:
    """The eager module's label per token and each token's word id (tokenizers' own)."""
    from tokenizers import Tokenizer

    enc = Tokenizer.from_file(str(bundles["tok"])).encode(text)
    with torch.no_grad():
        logits = bundles["tagger"](torch.tensor([enc.ids]), torch.tensor([len(enc.ids)]))[0]
    return [LABELS[int(i)] for i in logits.argmax(-1)], list(enc.word_ids)


@pytest.mark.parametrize("name", ["bert-words", "bert-api"])
def test_tokenizer_words_are_the_pre_tokenizers(bundles: dict[str, Any], server: str,
                                                name: str) -> None:
    version = bundles["repo"] / name / "1"
    assert read_manifest(version).words == "tokenizer"
    r = httpx.post(f"{server}/v1/models/{name}/tag", json={"texts": [TEXT]}, timeout=30)
    assert r.status_code == 200, r.text
    tokens = r.json()["results"][0]["tokens"]
    assert [t["token"] for t in tokens] == ["Hello", ",", "worlds", "!", "The", "cat", "'",
                                            "s", "hat", "."]
    assert all(TEXT[t["start"]:t["end"]] == t["token"] for t in tokens)
    labels, word_ids = _eager(bundles, TEXT)
    first = [word_ids.index(w) for w in sorted({w for w in word_ids if w is not None})]
    assert [t["label"] for t in tokens] == [labels[i] for i in first]
    described = httpx.get(f"{server}/v1/models/{name}", timeout=30).json()
    assert json.dumps(described).count('"words": "tokenizer"') >= 1


def test_whitespace_words_stay_the_default(bundles: dict[str, Any], server: str) -> None:
    assert read_manifest(bundles["repo"] / "spaced" / "1").words == \
        "whitespace"
    r = httpx.post(f"{server}/v1/models/spaced/tag", json={"texts": [TEXT]}, timeout=30)
    assert r.status_code == 200, r.text
    tokens = r.json()["results"][0]["tokens"]
    assert [t["token"] for t in tokens] == TEXT.split()
    labels, _ = _eager(bundles, TEXT)
    # "Hello," -> its first token "hello"; "worlds!" -> "world"; ...
    assert [t["label"] for t in tokens] == [labels[i] for i in (0, 2, 5, 6, 9)]


def test_tokenizer_words_need_a_tokenizer_json(bundles: dict[str, Any],
                                               tiny_lm_repo: Path) -> None:
    bundle = tiny_lm_repo / "tiny-lm" / "1"  # shared: only its tokenizer file is read
    assert read_manifest(bundle).tokenizer.kind == "sentencepiece"
    spm = bundle / "tokenizer.model"
    tagger = LSTMTagger(127, 2)
    with pytest.raises(UserError, match=r"--words tokenizer .* tokenizer\.model is a "
                                        "SentencePiece model.*--words whitespace"):
        seqserve.pack.tagger(tagger, tokenizer=spm, labels="x,y", repo=bundles["dir"] / "r2",
                             name="spm", progress=False, words="tokenizer")
    assert not (bundles["dir"] / "r2" / "spm").exists()
