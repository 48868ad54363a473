"""`seqserve translate`: offline through the engine, JSON answer, attention heatmap, errors."""

from __future__ import annotations

import fcntl
import json
import subprocess
import sys
from pathlib import Path

import pytest
from reference_search import onnx_reference

from seqserve.cli import main
from seqserve.service.scheduling.search import SearchOptions


def test_translate_command_equals_reference_and_plots(tiny_repo: Path, tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    plot = tmp_path / "attention.png"
    texts = ["one two three", "forty fifty"]
    rc = main(["translate", "--repo", str(tiny_repo), "--model", "tiny-mt", *texts,
               "--beam-size", "4", "--n-best", "2", "--json", "--plot", str(plot)])
    assert rc == 0
    answer = json.loads(capsys.readouterr().out)
    for text, result in zip(texts, answer["results"], strict=True):
        ref = onnx_reference(tiny_repo, text, SearchOptions(beam_size=4, n_best=2))
        got = [h["token_ids"] for h in result["hypotheses"]]
        assert got == [r.tokens[:-1] if r.tokens[-1:] == [3] else r.tokens for r in ref]
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    weights = answer["results"][0]["attention"]["weights"]
    assert len(weights) == len(answer["results"][0]["attention"]["target_tokens"])


@pytest.mark.parametrize("argv,message", [
    (["--n-best", "9"], "n-best"),
    (["--beam-size", "3", "--temperature", "0.5"], "sampling"),
    (["--length-penalty", "-1"], "length-penalty"),
])
def test_translate_command_bad_options(tiny_repo: Path, argv: list[str], message: str,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["translate", "--repo", str(tiny_repo), "--model", "tiny-mt", "one", *argv])
    assert rc == 2
    assert message in capsys.readouterr().err


def test_translate_command_refuses_a_classifier(tiny_repo: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["translate", "--repo", str(tiny_repo), "--model", "tiny-clf", "one"]) == 2
    assert "not a translator" in capsys.readouterr().err


def test_translate_json_into_a_closed_pipe_exits_quietly(tiny_repo: Path) -> None:
    """`seqserve translate ... --json | head -1`: the reader goes away after one line; the
    command stops with SIGPIPE's status and no BrokenPipeError traceback. The pipe is shrunk to
    one page, so the answer (64 texts, 5 hypotheses each) cannot fit in it."""
    texts = [f"one two three four {i}" for i in range(64)]
    proc = subprocess.Popen(
        [sys.executable, "-m", "seqserve.cli", "translate", "--repo", str(tiny_repo),
         "--model", "tiny-mt", *texts, "--n-best", "5", "--json"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    fcntl.fcntl(proc.stdout.fileno(), fcntl.F_SETPIPE_SZ, 4096)
    try:
        first = proc.stdout.readline()
        proc.stdout.close()  # what `head -1` does after its line
        err = proc.stderr.read().decode()
        rc = proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert first == b"{\n"
    assert rc == 141, err
    assert "Traceback" not in err and "BrokenPipeError" not in err, err
