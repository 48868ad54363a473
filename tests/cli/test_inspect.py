"""`seqserve inspect BUNDLE`: what a bundle expects and returns, for the demo's bundles and a
packed one that keeps its own tensor names; the request bodies it prints answer 200 from a
real server (native route and OIP infer); it never imports torch; a folder that is no bundle
is a clear error. (A packed bundle's own tensor names: tests/export/test_inspect_packed.py.)"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from seqserve.cli import main

DEMO = Path(__file__).resolve().parents[2] / "model_repository"


def _inspect(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    assert main(["inspect", *args]) == 0
    return capsys.readouterr().out


def test_text_output_names_tensors_specials_limits_labels_and_curl(
        capsys: pytest.CaptureFixture[str]) -> None:
    out = _inspect(capsys, str(DEMO / "numbers-tags"))  # a model folder: its highest version
    assert "numbers-tags/1: tagger numbers-tags v1" in out
    assert "input  input_ids: int64 [batch*, seq*]" in out
    assert "output log_probs: float32 [batch*, seq*, labels]" in out
    assert "bos 2 '<s>'" in out and "eos 3 '</s>'" in out and "pad 0 '<pad>'" in out
    assert '"max_tokens": 64' in out and "serve --max-tokens" in out
    assert "labels (13): article, cents" in out and "words: whitespace" in out
    assert ("curl -s -X POST http://localhost:8000/v1/models/numbers-tags/tag -H "
            "'content-type: application/json' -d '{\"texts\": [\"your text here\"]}'") in out
    mt = _inspect(capsys, str(DEMO / "numbers-en-fr" / "1"), "--url", "http://mt:9000/")
    assert "decoder_step (decoder_step.onnx, decoder_step.pt)" in mt
    assert "input  src_mask: bool [batch*, src_len*]" in mt
    assert "curl -s -X POST http://mt:9000/v1/models/numbers-en-fr/translate" in mt


def test_json_bodies_are_answered_by_a_real_server(capsys: pytest.CaptureFixture[str],
                                                   tmp_path: Path) -> None:
    from service_fakes import serve_in_thread, settings

    from seqserve.service.server.app import create_app

    repo = tmp_path / "repo"
    for name in ("co2-forecast", "numbers-tags"):
        shutil.copytree(DEMO / name, repo / name)
    infos = {name: json.loads(_inspect(capsys, str(repo / name), "--json"))
             for name in ("co2-forecast", "numbers-tags")}
    series = infos["co2-forecast"]
    assert series["features"] == 1 and series["sessions"] is True
    state = series["graphs"]["sequence_tagger"]["inputs"][2]
    assert state["name"] == "state" and state["dynamic"] == ["batch"]
    assert state["contract"] == ["batch", "state_dim"]  # state_dim: a size of the model
    assert infos["numbers-tags"]["tokenizer"]["specials"]["unk"] == {"id": 1, "token": "<unk>"}
    with serve_in_thread(create_app(settings(repo))) as url:
        for info in infos.values():
            for route in (info["request"], info["oip"]):
                r = httpx.post(url + route["path"], json=route["body"], timeout=60)
                assert r.status_code == 200, (route, r.text)


def test_inspect_never_imports_torch() -> None:
    code = ("import sys\nfrom seqserve.cli import main\n"
            f"assert main(['inspect', {str(DEMO / 'text-lm')!r}, '--json']) == 0\n"
            "assert 'torch' not in sys.modules, 'torch was imported'\n")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout)["request"]["path"] == "/v1/models/text-lm/generate"


def test_a_folder_that_is_no_bundle_is_a_clear_error(tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "empty").mkdir()
    assert main(["inspect", str(tmp_path / "empty")]) == 2
    err = capsys.readouterr().err
    assert "not a bundle: no manifest.json in it nor in a version folder" in err
    assert main(["inspect", str(tmp_path / "missing")]) == 2
    assert "no such folder" in capsys.readouterr().err
