"""`seqserve inspect BUNDLE`: what a bundle expects and returns, for the session's tiny
bundles (tests/conftest.py) and a packed one that keeps its own tensor names; the request
bodies it prints answer 200 from a real server (native route and OIP infer); it never imports
torch; a folder that is no bundle is a clear error. (A packed bundle's own tensor names:
tests/export/test_inspect_packed.py.)"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from seqserve.cli import main
from seqserve.export.manifest import read_manifest


def _inspect(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    assert main(["inspect", *args]) == 0
    return capsys.readouterr().out


def test_text_output_names_tensors_specials_limits_labels_and_curl(
        capsys: pytest.CaptureFixture[str], tiny_full_repo: Path) -> None:
    tagger = read_manifest(tiny_full_repo / "tiny-tag" / "1")
    tok = tagger.tokenizer
    out = _inspect(capsys, str(tiny_full_repo / "tiny-tag"))  # a model folder: its highest
    assert "tiny-tag/1: tagger tiny-tag v1" in out
    assert "input  input_ids: int64 [batch*, seq*]" in out
    assert "output log_probs: float32 [batch*, seq*, labels]" in out
    assert (f"bos {tok.bos_id} '<s>'" in out and f"eos {tok.eos_id} '</s>'" in out
            and f"pad {tok.pad_id} '<pad>'" in out)
    max_tokens = tagger.limits["max_tokens"]
    assert f'"max_tokens": {max_tokens}' in out and "serve --max-tokens" in out
    labels = tagger.labels
    assert len(labels) > 2
    assert f"labels ({len(labels)}): {', '.join(labels)}\n" in out and "words: whitespace" in out
    assert ("curl -s -X POST http://localhost:8000/v1/models/tiny-tag/tag -H "
            "'content-type: application/json' -d '{\"texts\": [\"your text here\"]}'") in out
    mt = _inspect(capsys, str(tiny_full_repo / "tiny-mt" / "1"), "--url", "http://mt:9000/")
    assert "decoder_step (decoder_step.onnx, decoder_step.pt)" in mt
    assert "input  src_mask: bool [batch*, src_len*]" in mt
    assert "curl -s -X POST http://mt:9000/v1/models/tiny-mt/translate" in mt


def test_json_bodies_are_answered_by_a_real_server(capsys: pytest.CaptureFixture[str],
                                                   tmp_path: Path, tiny_full_repo: Path,
                                                   tiny_series_repo: Path) -> None:
    from service_fakes import serve_in_thread, settings

    from seqserve.service.server.app import create_app

    repo = tmp_path / "repo"  # a copy of the two bundles: the fixtures are shared
    shutil.copytree(tiny_series_repo / "tiny-series", repo / "tiny-series")
    shutil.copytree(tiny_full_repo / "tiny-tag", repo / "tiny-tag")
    infos = {name: json.loads(_inspect(capsys, str(repo / name), "--json"))
             for name in ("tiny-series", "tiny-tag")}
    series = infos["tiny-series"]
    features = read_manifest(repo / "tiny-series" / "1").features
    assert series["features"] == features and series["sessions"] is True
    state = series["graphs"]["sequence_tagger"]["inputs"][2]
    assert state["name"] == "state" and state["dynamic"] == ["batch"]
    assert state["contract"] == ["batch", "state_dim"]  # state_dim: a size of the model
    unk = read_manifest(repo / "tiny-tag" / "1").tokenizer.unk_id
    assert infos["tiny-tag"]["tokenizer"]["specials"]["unk"] == {"id": unk, "token": "<unk>"}
    with serve_in_thread(create_app(settings(repo))) as url:
        for info in infos.values():
            for route in (info["request"], info["oip"]):
                r = httpx.post(url + route["path"], json=route["body"], timeout=60)
                assert r.status_code == 200, (route, r.text)


def test_inspect_never_imports_torch(tiny_lm_repo: Path) -> None:
    code = ("import sys\nfrom seqserve.cli import main\n"
            f"assert main(['inspect', {str(tiny_lm_repo / 'tiny-lm')!r}, '--json']) == 0\n"
            "assert 'torch' not in sys.modules, 'torch was imported'\n")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout)["request"]["path"] == "/v1/models/tiny-lm/generate"


def test_a_folder_that_is_no_bundle_is_a_clear_error(tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "empty").mkdir()
    assert main(["inspect", str(tmp_path / "empty")]) == 2
    err = capsys.readouterr().err
    assert "not a bundle: no manifest.json in it nor in a version folder" in err
    assert main(["inspect", str(tmp_path / "missing")]) == 2
    assert "no such folder" in capsys.readouterr().err
