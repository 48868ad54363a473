"""`seqserve pack` and `seqserve.pack` on models written outside seqserve (foreign_models.py):
packed by the CLI from the user's own ONNX files and by the Python API from nn.Modules, served
by a real server, and compared with the eager module: labels equal, probabilities within 1e-4,
translations equal at beam 1 and beam 5; a naively padded bidirectional model is refused
naming the fix."""

from __future__ import annotations

import json
import warnings
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import torch
from foreign_models import (
    CharGRUClassifier,
    LSTMTagger,
    NaiveBiGRUClassifier,
    Seq2Seq,
    char_tokenizer,
    word_tokenizer,
)

import seqserve.pack
from seqserve.cli import build_parser, main
from seqserve.models.errors import BundleError
from seqserve.models.text.tokenizer_files import load_tokenizer

LABELS = ["en", "fr", "de"]
NAMES = ["anna", "jean pierre", "muller", "o'brien", "zoe", "x", "maximilian von", "li"]
TGT_WORDS = ["un", "deux", "trois", "quatre", "cinq", "six", "sept", "huit", "neuf", "dix"]


def _gain(model: torch.nn.Module, gain: float = 3.0) -> torch.nn.Module:
    torch.manual_seed(0)
    for m in model.modules():
        m.reset_parameters() if hasattr(m, "reset_parameters") else None
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(gain)
    return model.eval()


def _onnx(module: torch.nn.Module, example: tuple[torch.Tensor, ...], path: Path,
          inputs: list[str], outputs: list[str], axes: dict[str, dict[int, str]],
          dynamo: bool = False) -> Path:
    """Export as a user would (torch.onnx.export, their own tensor names)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if dynamo:
            batch, seq = torch.export.Dim("batch", min=1), torch.export.Dim("seq", min=1)
            torch.onnx.export(module, example, str(path), input_names=inputs,
                              output_names=outputs, dynamo=True, external_data=True,
                              dynamic_shapes=({0: batch, 1: seq}, {0: batch}))
        else:
            torch.onnx.export(module, example, str(path), input_names=inputs,
                              output_names=outputs, dynamic_axes=axes, opset_version=17,
                              dynamo=False)
    return path


@pytest.fixture(scope="module")
def packed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    """A repository with foreign models packed by the CLI and by the Python API."""
    d = tmp_path_factory.mktemp("pack")
    repo = d / "repo"
    tok = char_tokenizer(d / "chars.json")
    clf = _gain(CharGRUClassifier(30, len(LABELS)))
    ids = torch.randint(2, 30, (3, 9))
    lengths = torch.tensor([9, 5, 2])
    _onnx(clf, (ids, lengths), d / "clf.onnx", ["tokens", "n"], ["scores"],
          {"tokens": {0: "b", 1: "t"}, "n": {0: "b"}, "scores": {0: "b"}})
    torch.jit.save(torch.jit.trace(clf, (ids, lengths)), str(d / "clf.pt"))
    (d / "labels.txt").write_text("\n".join(LABELS) + "\n")
    assert main(["pack", "classifier", "--onnx", str(d / "clf.onnx"), "--torchscript",
                 str(d / "clf.pt"), "--tokenizer", str(tok), "--labels", str(d / "labels.txt"),
                 "--repo", str(repo), "--name", "names-cli", "--max-tokens", "32"]) == 0
    seqserve.pack.classifier(clf, tokenizer=tok, labels=LABELS, repo=repo, name="names-api",
                             max_tokens=32, progress=False)
    tagger = _gain(LSTMTagger(30, 4))
    seqserve.pack.tagger(tagger, tokenizer=tok, labels="a,b,c,d", repo=repo, name="tags",
                         max_tokens=32, progress=False)
    src = char_tokenizer(d / "src.json", ("<pad>", "<unk>", "</s>"), post=True)
    tgt = word_tokenizer(d / "tgt.json", TGT_WORDS)
    mt = _gain(Seq2Seq(31, 14))
    seqserve.pack.translator(mt, source_tokenizer=src, target_tokenizer=tgt, repo=repo,
                             name="mt-api", max_tokens=32, max_decode_length=12,
                             progress=False)
    _cli_translator(mt, d, src, tgt, repo)
    return {"repo": repo, "dir": d, "clf": clf, "tagger": tagger, "mt": mt, "tok": tok,
            "src": src, "tgt": tgt}


class _Enc(torch.nn.Module):
    def __init__(self, m: Seq2Seq) -> None:
        super().__init__()
        self.m = m

    def forward(self, ids: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return self.m.encode(ids, lengths)


class _Step(torch.nn.Module):
    def __init__(self, m: Seq2Seq) -> None:
        super().__init__()
        self.m = m

    def forward(self, prev: torch.Tensor, hidden: torch.Tensor, memory: torch.Tensor,
                mask: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return self.m.step(prev, hidden, memory, mask)


def _cli_translator(mt: Seq2Seq, d: Path, src: Path, tgt: Path, repo: Path) -> None:
    ids, lengths = torch.randint(3, 31, (3, 7)), torch.tensor([7, 4, 2])
    _onnx(_Enc(mt), (ids, lengths), d / "enc.onnx", ["src", "len"], ["mem", "h"],
          {"src": {0: "b", 1: "s"}, "len": {0: "b"}, "mem": {0: "b", 1: "s"}, "h": {1: "b"}})
    memory, hidden = mt.encode(ids, lengths)
    mask = torch.arange(7)[None] < lengths[:, None]
    _onnx(_Step(mt), (torch.tensor([2, 5, 6]), hidden.detach(), memory.detach(), mask),
          d / "step.onnx", ["prev", "hidden", "memory", "mask"], ["logits", "h2", "att"],
          {"prev": {0: "r"}, "hidden": {1: "r"}, "memory": {0: "r", 1: "s"},
           "mask": {0: "r", 1: "s"}, "logits": {0: "r"}, "h2": {1: "r"},
           "att": {0: "r", 1: "s"}})
    assert main(["pack", "translator", "--encoder", str(d / "enc.onnx"), "--decoder-step",
                 str(d / "step.onnx"), "--source-tokenizer", str(src), "--target-tokenizer",
                 str(tgt), "--repo", str(repo), "--name", "mt-cli", "--max-tokens", "32",
                 "--max-decode-length", "12"]) == 0


@pytest.fixture(scope="module")
def server(packed: dict[str, object]) -> Iterator[str]:
    from service_fakes import serve_repo

    with serve_repo(packed["repo"], max_wait_ms=5, max_tokens=32) as url:
        yield url


def _eager_probs(model: torch.nn.Module, rows: list[list[int]]) -> np.ndarray:
    with torch.no_grad():
        return np.stack([torch.softmax(model(torch.tensor([r]), torch.tensor([len(r)]))[0], -1)
                         .numpy() for r in rows])


def test_packed_classifiers_serve_the_eager_answers(packed: dict[str, object],
                                                    server: str) -> None:
    tok = load_tokenizer(packed["tok"])  # type: ignore[arg-type]
    rows = [tok.encode(t) for t in NAMES]
    assert rows[1][4] == tok.encode(" ")[0]  # spaces are characters of their own
    want = _eager_probs(packed["clf"], rows)  # type: ignore[arg-type]
    with httpx.Client(base_url=server, timeout=30) as c:
        for name in ("names-cli", "names-api"):
            r = c.post(f"/v1/models/{name}/classify", json={"texts": NAMES, "top_k": 3})
            assert r.status_code == 200, r.text
            for res, p in zip(r.json()["results"], want, strict=True):
                got = {t["label"]: t["probability"] for t in res["top_k"]}
                assert res["label"] == LABELS[int(p.argmax())]
                assert max(abs(got[lab] - p[i]) for i, lab in enumerate(LABELS)) < 1e-4
            r = c.post(f"/v1/models/{name}/classify",
                       json={"texts": NAMES[:1], "return_attention": True})
            assert r.status_code == 400 and "attention" in r.json()["error"]
        manifest = json.loads((packed["repo"] / "names-cli" / "1" / "manifest.json")  # type: ignore[operator]
                              .read_text())
        assert manifest["schema_version"] == 4
        assert manifest["graphs"]["classifier"]["tensor_names"] == {
            "input_ids": "tokens", "lengths": "n", "logits": "scores"}
    assert main(["verify", str(packed["repo"] / "names-cli" / "1")]) == 0  # type: ignore[operator]


def test_packed_tagger_serves_the_eager_labels(packed: dict[str, object], server: str) -> None:
    tok = load_tokenizer(packed["tok"])  # type: ignore[arg-type]
    text = "anna o'brien zoe"
    with torch.no_grad():
        ids = tok.encode(text)
        lp = torch.log_softmax(packed["tagger"](torch.tensor([ids]),  # type: ignore[operator]
                                                torch.tensor([len(ids)]))[0], -1)
    with httpx.Client(base_url=server, timeout=30) as c:
        r = c.post("/v1/models/tags/tag", json={"texts": [text]})
    assert r.status_code == 200, r.text
    words = r.json()["results"][0]["tokens"]
    assert [w["token"] for w in words] == text.split()
    for w in words:  # a word's label is read at its first character
        assert w["label"] == "abcd"[int(lp[w["start"]].argmax())]
        assert abs(w["probability"] - float(lp[w["start"]].exp().max())) < 1e-4


def _reference(mt: Seq2Seq, src: list[int], beam: int, bos: int, eos: int) -> list[int]:
    from reference_search import reference_beam_search

    with torch.no_grad():
        memory, hidden = mt.encode(torch.tensor([src]), torch.tensor([len(src)]))

    def step(prev: int, state: np.ndarray, mem: np.ndarray) -> tuple[np.ndarray, ...]:
        with torch.no_grad():
            logits, h, att = mt.step(torch.tensor([prev]), torch.from_numpy(state)[:, None],
                                     torch.from_numpy(mem)[None],
                                     torch.ones(1, len(mem), dtype=torch.bool))
        return torch.log_softmax(logits[0], -1).numpy(), att[0].numpy(), h[:, 0].numpy()

    hyps = reference_beam_search(step, memory[0].numpy(), hidden[:, 0].numpy(), bos=bos,
                                 eos=eos, max_len=12, beam=beam, n_best=1)
    tokens = hyps[0].tokens
    return tokens[:-1] if tokens and tokens[-1] == eos else tokens


def test_packed_translators_translate_as_the_eager_model(packed: dict[str, object],
                                                         server: str) -> None:
    src_tok = load_tokenizer(packed["src"])  # type: ignore[arg-type]
    tgt_tok = load_tokenizer(packed["tgt"])  # type: ignore[arg-type]
    texts = NAMES[:6]
    assert src_tok.encode("ab")[-1] == src_tok.eos_id  # the post-processor's "</s>"
    compared = 0
    with httpx.Client(base_url=server, timeout=60) as c:
        for beam in (1, 5):
            want = [_reference(packed["mt"], src_tok.encode(t), beam,  # type: ignore[arg-type]
                               tgt_tok.bos_id, tgt_tok.eos_id) for t in texts]
            for name in ("mt-cli", "mt-api"):
                r = c.post(f"/v1/models/{name}/translate",
                           json={"texts": texts, "beam_size": beam, "max_length": 12})
                assert r.status_code == 200, r.text
                got = [res["hypotheses"][0]["token_ids"] for res in r.json()["results"]]
                assert got == want, (name, beam)
                assert r.json()["results"][0]["translation"] == tgt_tok.decode(want[0])
                compared += len(texts)
    assert compared == 24


def test_translator_special_token_overrides_apply_to_their_own_side(
        packed: dict[str, object], capsys: pytest.CaptureFixture[str]) -> None:
    d, repo = packed["dir"], packed["repo"]
    files = ["--encoder", str(d / "enc.onnx"), "--decoder-step", str(d / "step.onnx")]  # type: ignore[operator]
    sides = ["--source-tokenizer", str(packed["src"]), "--target-tokenizer", str(packed["tgt"])]
    # the source has no "<s>": before, --bos-token went to both sides and failed there
    assert main(["pack", "translator", *files, *sides, "--repo", str(repo), "--name", "mt-over",
                 "--pad-token", "1", "--target-bos-token", "<s>", "--target-eos-token", "5",
                 "--max-tokens", "16", "--max-decode-length", "12"]) == 0
    manifest = json.loads((repo / "mt-over" / "1" / "manifest.json").read_text())  # type: ignore[operator]
    src, tgt = manifest["tokenizer"], manifest["target_tokenizer"]
    assert (src["pad_id"], src["bos_id"], src["eos_id"]) == (1, -1, 2)
    assert (tgt["pad_id"], tgt["bos_id"], tgt["eos_id"]) == (0, 2, 5)
    capsys.readouterr()
    assert main(["pack", "translator", *files, "--tokenizer", str(packed["src"]), "--repo",
                 str(repo), "--name", "mt-joint", "--target-eos-token", "</s>"]) == 2
    assert "--target-tokenizer" in capsys.readouterr().err
    assert not (repo / "mt-joint").exists()  # type: ignore[operator]
    from seqserve.models.errors import UserError

    with pytest.raises(UserError, match="target_tokenizer"):
        seqserve.pack.translator(packed["mt"], tokenizer=packed["src"],  # type: ignore[arg-type]
                                 target_specials={"eos": "</s>"}, repo=repo, name="mt-joint")


def test_naive_bidirectional_model_is_refused_naming_the_fix(tmp_path: Path) -> None:
    tok = char_tokenizer(tmp_path / "chars.json")
    model = _gain(NaiveBiGRUClassifier(30, 3))
    with pytest.raises(BundleError) as err:
        seqserve.pack.classifier(model, tokenizer=tok, labels=LABELS, repo=tmp_path / "r",
                                 name="bi", max_tokens=16, progress=False)
    msg = str(err.value)
    assert "batch invariance of NaiveBiGRUClassifier (your module)'s logits" in msg
    assert "classifier.logits" not in msg and "bidirectional" in msg
    assert "seqserve.pack.bidirectional" in msg
    assert not (tmp_path / "r" / "bi" / "1").exists()
    model.rnn, model.fixed = seqserve.pack.bidirectional(model.rnn), True  # same weights
    path = seqserve.pack.classifier(model, tokenizer=tok, labels=LABELS, repo=tmp_path / "r",
                                    name="bi", max_tokens=16, progress=False)
    assert (path / "classifier.onnx").is_file()


def test_pack_help_documents_every_option(capsys: pytest.CaptureFixture[str]) -> None:
    """Every option of `seqserve pack` and its subcommands has help text that --help shows."""
    import argparse

    pack = next(a for a in build_parser()._actions
                if isinstance(a, argparse._SubParsersAction)).choices["pack"]
    seen = 0
    for task in ("classifier", "tagger", "translator", "lm"):
        sub = next(a for a in pack._actions
                   if isinstance(a, argparse._SubParsersAction)).choices[task]
        with pytest.raises(SystemExit):
            build_parser().parse_args(["pack", task, "--help"])
        out = " ".join(capsys.readouterr().out.split())
        for action in sub._actions:
            if not action.option_strings or action.help == argparse.SUPPRESS:
                continue
            assert action.help and len(action.help) > 10, (task, action.option_strings)
            assert all(o in out for o in action.option_strings), (task, action.option_strings)
            assert " ".join(action.help.split())[:40] in out, (task, action.help)
            seen += 1
    assert seen >= 4 * 10
    with pytest.raises(SystemExit):
        build_parser().parse_args(["pack", "--help"])
    out = capsys.readouterr().out
    assert all(t in out for t in ("classifier", "tagger", "translator", "lm", "bundle-format.md"))


def test_manifest_schema_is_published_and_version_1_still_loads(packed: dict[str, object],
                                                                 tmp_path: Path) -> None:
    import jsonschema

    from seqserve.export.contract import MANIFEST_SCHEMA
    from seqserve.export.manifest import load_bundle, write_manifest

    root = Path(__file__).resolve().parents[2]
    assert json.loads((root / "docs" / "manifest.schema.json").read_text()) == MANIFEST_SCHEMA
    bundle = packed["repo"] / "mt-cli" / "1"  # type: ignore[operator]
    jsonschema.validate(json.loads((bundle / "manifest.json").read_text()), MANIFEST_SCHEMA)
    import shutil

    old = tmp_path / "names" / "1"
    shutil.copytree(packed["repo"] / "names-api" / "1", old)  # type: ignore[operator]
    data = json.loads((old / "manifest.json").read_text())
    data["schema_version"] = 1
    del data["tokenizer"]["kind"]
    (old / "manifest.json").chmod(0o644)
    old.chmod(0o755)
    from seqserve.export.manifest import Manifest

    write_manifest(old, Manifest.from_dict(data))
    assert load_bundle(old).schema_version == 1
    data["graphs"]["classifier"]["outputs"][0]["name"] = "scores"
    write_manifest(old, Manifest.from_dict(data))
    with pytest.raises(BundleError, match="contract"):
        load_bundle(old)  # what serve and verify both check
