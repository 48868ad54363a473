"""A tokenizer.json that fails on a text (issue 37): a backtracking regex in its normalizer or
pre-tokenizer makes the Rust `tokenizers` library panic (pyo3's PanicException, a
BaseException) on a 24-32 character run of one letter, or crawl.

- `JsonTokenizer` turns the panic into `TokenizerFailed` where the library is called, and
  the tokenizer keeps working on other texts;
- a request whose text makes the tokenizer fail is a 422 JSON error naming the tokenizer, with
  one log line (v1 and OIP), never a 500;
- `probe_tokenizer` refuses such a tokenizer (panic, or too slow) naming the text, and so do
  `seqserve verify` and the server's loading: the version is failed with the reason in
  /v1/models instead of failing every request.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from service_fakes import serve_asgi, settings

from seqserve.models.errors import BundleError
from seqserve.models.text.tokenizer import train_tokenizer
from seqserve.models.text.tokenizer_files import (
    JsonTokenizer,
    TokenizerFailed,
    load_tokenizer,
    probe_tokenizer,
)
from seqserve.service.core.errors import TextNotTokenizable
from seqserve.service.workers.base import TextLimits, encode_texts

LETTERS = list("abcdefghijklmnopqrstuvwxyz ")
LIMITS = TextLimits(max_texts=4, max_chars=500, max_tokens=64, truncate=False)


def _tokenizer_json(path: Path, setup: Callable[[Any], None] | None = None) -> Path:
    """A character-level tokenizer.json (<pad> 0, <unk> 1, then one id per letter), with
    `setup(tok)` adding a normalizer or pre-tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    vocab = {"<pad>": 0, "<unk>": 1} | {c: 2 + i for i, c in enumerate(LETTERS)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    tok.decoder = decoders.Fuse()
    tok.add_special_tokens(["<pad>", "<unk>"])
    if setup is not None:
        setup(tok)
    tok.save(str(path))
    return path


def _replace_normalizer(tok: Any) -> None:
    """(x+x+)+y: panics on 24 or more x's."""
    from tokenizers import Regex, normalizers

    tok.normalizer = normalizers.Replace(Regex("(x+x+)+y"), "z")


def _split_pre_tokenizer(pattern: str) -> Callable[[Any], None]:
    def setup(tok: Any) -> None:
        from tokenizers import Regex, pre_tokenizers

        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(pattern), "isolated"),
            pre_tokenizers.Split("", "isolated")])

    return setup


def _load(path: Path) -> JsonTokenizer:
    return JsonTokenizer.load(path, (0, 1, -1, -1))


def test_a_panic_is_tokenizer_failed_and_the_tokenizer_keeps_working(tmp_path: Path) -> None:
    tok = _load(_tokenizer_json(tmp_path / "t.json", _replace_normalizer))
    for call in (tok.encode, tok.encode_with_offsets):
        with pytest.raises(TokenizerFailed, match="PanicException.*retry-limit"):
            call("x" * 31)
    assert tok.decode(tok.encode("hello")) == "hello"
    assert [p.piece for p in tok.encode_with_offsets("ab")] == ["a", "b"]


@pytest.mark.parametrize(("setup", "text", "what"), [
    (_replace_normalizer, "'x' x 32", "fails on"),
    (_split_pre_tokenizer("(a|aa)+$"), "'a' x 31 then 'b'", "fails on"),
    (_split_pre_tokenizer("(a|aa)+c"), "'a' x 32", "ms on"),  # slow, never a panic
], ids=["replace-normalizer-panics", "split-pre-tokenizer-panics", "split-pre-tokenizer-slow"])
def test_the_probe_refuses_a_tokenizer_that_panics_or_crawls(
        tmp_path: Path, setup: Callable[[Any], None], text: str, what: str) -> None:
    tok = _load(_tokenizer_json(tmp_path / "t.json", setup))
    with pytest.raises(BundleError) as info:
        probe_tokenizer(tok, "tokenizer.json")
    message = str(info.value)
    assert message.startswith("tokenizer.json: the tokenizer") and what in message, message
    assert text in message and "backtracking regex" in message, message


def test_the_probe_passes_ordinary_tokenizers(tmp_path: Path) -> None:
    from tokenizers import decoders, normalizers, pre_tokenizers

    def byte_level(tok: Any) -> None:
        tok.normalizer = normalizers.BertNormalizer()
        tok.pre_tokenizer = pre_tokenizers.ByteLevel()
        tok.decoder = decoders.ByteLevel()

    probe_tokenizer(_load(_tokenizer_json(tmp_path / "chars.json")))
    probe_tokenizer(_load(_tokenizer_json(tmp_path / "bytes.json", byte_level)))
    texts = ["one two three", "four five six seven", "eight nine ten"] * 20
    piece = train_tokenizer(texts, tmp_path / "sp.model", vocab_size=30)
    probe_tokenizer(piece)
    probe_tokenizer(load_tokenizer(tmp_path / "sp.model"))


def test_a_text_the_tokenizer_fails_on_is_a_422_with_one_log_line(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    tok = _load(_tokenizer_json(tmp_path / "t.json", _replace_normalizer))
    caplog.set_level(logging.WARNING, logger="seqserve.workers")
    for offsets in (False, True):
        caplog.clear()
        with pytest.raises(TextNotTokenizable) as info:
            encode_texts(tok, ["hello", "x" * 31], LIMITS, offsets=offsets)
        assert info.value.status == 422
        assert info.value.message.startswith(
            "texts[1]: this model's tokenizer could not process the text"), info.value.message
        records = [r for r in caplog.records if r.name == "seqserve.workers"]
        assert len(records) == 1 and "texts[1] (31 characters)" in records[0].getMessage()
        assert records[0].exc_info is None  # one line, no traceback
    assert encode_texts(tok, ["hello"], LIMITS)[0].ids == tok.encode("hello")


# -- a served bundle: refused at load (verify and the server), or 422 per request if let in


def _packed(d: Path, tok: Path) -> None:
    import sys

    export_tests = str(Path(__file__).resolve().parents[1] / "export")  # foreign_models
    if export_tests not in sys.path:
        sys.path.append(export_tests)
    import torch
    from foreign_models import CharGRUClassifier

    import seqserve.pack

    torch.manual_seed(0)
    clf = CharGRUClassifier(len(LETTERS) + 2, 2).eval()
    seqserve.pack.classifier(clf, tokenizer=tok, labels=["yes", "no"], repo=d / "repo",
                             name="regex-clf", max_tokens=48, progress=False)


@pytest.fixture(scope="module")
def bad_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A repository with "regex-clf" v1: a packed character classifier whose tokenizer.json
    was replaced after packing (pack refuses it: `test_pack_refuses_it`) by one with the
    (x+x+)+y normalizer, its hashes rewritten so that the bundle is whole."""
    import hashlib

    from control_support import rewrite_manifest

    d = tmp_path_factory.mktemp("regex-tokenizer")
    _packed(d, _tokenizer_json(d / "tokenizer.json"))
    folder = d / "repo" / "regex-clf" / "1"
    bad = _tokenizer_json(folder / "tokenizer.json", _replace_normalizer)
    files = json.loads((folder / "manifest.json").read_text())["files"]
    rewrite_manifest(folder, files={**files, "tokenizer.json": hashlib.sha256(
        bad.read_bytes()).hexdigest()})
    return d / "repo"


def test_pack_refuses_it(tmp_path: Path) -> None:
    """pack runs the server's own probe: the bundle is never written."""
    with pytest.raises(BundleError, match=r"the tokenizer fails on a short text"):
        _packed(tmp_path, _tokenizer_json(tmp_path / "tokenizer.json", _replace_normalizer))
    assert not (tmp_path / "repo" / "regex-clf" / "1").exists()


def test_verify_refuses_the_bundle_naming_the_tokenizer(bad_repo: Path) -> None:
    from seqserve.export.verify import verify_bundle

    with pytest.raises(BundleError, match=r"tokenizer\.json: the tokenizer fails on"):
        verify_bundle(bad_repo / "regex-clf" / "1", parity=False)


def test_the_server_refuses_the_bundle_with_its_reason(bad_repo: Path) -> None:
    async def go() -> None:
        async with serve_asgi(create_app(settings(bad_repo))) as c:
            info = (await c.get("/v1/models/regex-clf")).json()
            (version,) = info["versions"]
            assert version["state"] == "failed", version
            assert "tokenizer.json: the tokenizer fails on" in version["reason"], version
            r = await c.post("/v1/models/regex-clf/classify", json={"texts": ["hello"]})
            assert r.status_code == 503 and "tokenizer" in r.json()["error"]

    from seqserve.service.server.app import create_app

    asyncio.run(go())


def test_a_served_tokenizer_that_panics_answers_422_json(
        bad_repo: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import seqserve.service.repository.entries as repository
    from seqserve.service.server.app import create_app

    monkeypatch.setattr(repository, "probe_tokenizer", lambda *a, **k: None)  # let it in

    async def go() -> None:
        async with serve_asgi(create_app(settings(bad_repo))) as c:
            path = "/v1/models/regex-clf/classify"
            oip = "/v2/models/regex-clf/infer"
            for url, body in ((path, {"texts": ["x" * 31]}),
                              (oip, {"inputs": [{"name": "text", "datatype": "BYTES",
                                                 "shape": [1], "data": ["x" * 31]}]})):
                r = await c.post(url, json=body)
                assert r.status_code == 422, (url, r.status_code, r.text)
                error = r.json()["error"]
                assert "tokenizer could not process the text" in error, error
                assert "request_id" in r.json()
            ok = await c.post(path, json={"texts": ["hello"]})
            assert ok.status_code == 200, ok.text
            assert (await c.get("/v2/health/ready")).status_code == 200

    asyncio.run(go())
