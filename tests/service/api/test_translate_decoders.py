"""Translator decoders in the service: the manifest's `decoder` tells the worker and the CLI
whether there is attention. A fixed-context bundle (decoder none) translates, but asking it
for attention (return_attention, coverage_penalty, `translate --plot`) is a clear 400 / CLI
error instead of a matrix of zeros; a Bahdanau bundle returns and plots its alignments."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from service_fakes import run_bounded, serve_asgi, settings

from seqserve.cli import main
from seqserve.export.bundle import export_run
from seqserve.service.server.app import create_app

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")  # torch.jit.load

TEXTS = ["one two three", "forty fifty hundred"]


@pytest.fixture(scope="module")
def decoder_repo(make_run: Callable[..., Path], tmp_path_factory: pytest.TempPathFactory
                 ) -> Path:
    """mt-none/1 (fixed context) and mt-bahdanau/1, tiny untrained GRU translators."""
    repo = tmp_path_factory.mktemp("decoder-repo")
    grid = {"batch_sizes": (1, 3), "lengths": (1, 7)}
    for decoder in ("none", "bahdanau"):
        run = make_run("translator", seed=5, decoder=decoder,
                       attention="none" if decoder == "none" else "additive")
        export_run(run, repo, f"mt-{decoder}", version=1, progress=False, grid=grid)
    return repo


def _post(repo: Path, model: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    app = create_app(settings(repo))

    async def scenario() -> tuple[int, dict[str, Any]]:
        async with serve_asgi(app) as client:
            r = await client.post(f"/v1/models/{model}/translate", json=body)
            return r.status_code, r.json()

    return run_bounded(scenario())  # type: ignore[no-any-return]


def test_fixed_context_bundle_translates_and_refuses_attention(decoder_repo: Path) -> None:
    status, body = _post(decoder_repo, "mt-none", {"texts": TEXTS, "beam_size": 3})
    assert status == 200 and len(body["results"]) == 2
    assert all("attention" not in r for r in body["results"])
    for extra, field in (({"return_attention": True}, "return_attention"),
                         ({"coverage_penalty": 0.2}, "coverage_penalty")):
        status, body = _post(decoder_repo, "mt-none", {"texts": TEXTS, **extra})
        assert status == 400
        assert "has no attention" in body["error"] and "decoder 'none'" in body["error"]
        assert f"drop {field}" in body["error"]


def test_bahdanau_bundle_returns_alignments(decoder_repo: Path) -> None:
    status, body = _post(decoder_repo, "mt-bahdanau",
                         {"texts": TEXTS, "beam_size": 3, "return_attention": True,
                          "coverage_penalty": 0.2})
    assert status == 200
    for result in body["results"]:
        weights = np.array(result["attention"]["weights"])
        assert weights.shape[0] == len(result["attention"]["target_tokens"])
        np.testing.assert_allclose(weights.sum(axis=1), 1.0, atol=1e-4)


def test_models_list_names_the_decoder(decoder_repo: Path) -> None:
    app = create_app(settings(decoder_repo))

    async def scenario() -> dict[str, Any]:
        async with serve_asgi(app) as client:
            return (await client.get("/v1/models")).json()  # type: ignore[no-any-return]

    text = json.dumps(run_bounded(scenario()))
    assert '"decoder": "none"' in text and '"decoder": "bahdanau"' in text


def test_translate_command_plots_bahdanau_and_refuses_none(
        decoder_repo: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plot = tmp_path / "bahdanau.png"
    rc = main(["translate", "--repo", str(decoder_repo), "--model", "mt-bahdanau", *TEXTS,
               "--json", "--plot", str(plot)])
    assert rc == 0 and plot.read_bytes()[:4] == b"\x89PNG"
    assert json.loads(capsys.readouterr().out)["decoder"] == "bahdanau"
    rc = main(["translate", "--repo", str(decoder_repo), "--model", "mt-none", *TEXTS,
               "--plot", str(tmp_path / "none.png")])
    assert rc == 2 and not (tmp_path / "none.png").exists()
    err = capsys.readouterr().err
    assert "has no attention" in err and "drop --plot" in err
    assert main(["translate", "--repo", str(decoder_repo), "--model", "mt-none", *TEXTS]) == 0
