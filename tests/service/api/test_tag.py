"""Tag endpoints end to end: a tiny trained tagger bundle through ONNX Runtime in the real app.

Every answered token slices the original text back (`text[start:end] == token`), results do
not depend on the batch, OIP v2 infer returns the same tokens (bad inputs: test_bad_inputs.py).
"""

from __future__ import annotations

import datetime
import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from service_fakes import run_bounded, serve_asgi, settings
from tagger_support import write_untrained_tagger

from seqserve.service.server.app import create_app

TEXTS = [
    "the twenty-first of march nineteen eighty-seven",
    "  Forty-two   thousand and\tsix ",
    "five euros and ten cents",
    "one hundred and twentieth",
    "zzz 12 émigré",
]


@pytest.fixture(scope="module")
def tag_repo(tiny_full_repo: Path) -> Path:
    return tiny_full_repo


@pytest.fixture(scope="module")
def variant_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tiny-var/1: an untrained tagger with every LSTM variant (the "loop" export form)."""
    from seqserve.export.bundle import export_run

    run = write_untrained_tagger(tmp_path_factory.mktemp("var-run"), peephole=True, cifg=True,
                                 proj_size=6)
    repo = tmp_path_factory.mktemp("var-repo")
    export_run(run, repo, "tiny-var", version=1, progress=False,
               grid={"batch_sizes": (1, 4), "lengths": (1, 9)})
    return repo


@pytest.mark.parametrize("runtime", ["onnx", "torchscript"])
def test_tag_round_trip_offsets_and_labels(tag_repo: Path, runtime: str) -> None:
    from seqserve.models.data.tags import TAGS, tagged

    async def go() -> list[httpx.Response]:
        async with serve_asgi(create_app(settings(tag_repo, runtime=runtime))) as c:
            return [await c.post("/v1/models/tiny-tag/tag", json={"texts": TEXTS}),
                    await c.get("/v1/models")]

    r, listing = run_bounded(go())
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["model"] == "tiny-tag" and body["version"] == 1
    assert listing.status_code == 200 and "tiny-tag" in listing.text
    for text, result in zip(TEXTS, body["results"], strict=True):
        tokens = result["tokens"]
        assert [t["token"] for t in tokens] == text.split()
        for t in tokens:
            assert text[t["start"] : t["end"]] == t["token"]
            assert t["label"] in TAGS and 0.0 < t["probability"] <= 1.0
        assert result["num_tokens"] >= len(tokens) and result["truncated"] is False
    gold = tagged("date", datetime.date(1987, 3, 21))[1]
    got = [t["label"] for t in body["results"][0]["tokens"]]
    assert sum(g == p for g, p in zip(gold, got, strict=True)) >= len(gold) - 1


@pytest.mark.parametrize(("repo_name", "runtime"), [
    ("tag_repo", "onnx"), ("variant_repo", "onnx"), ("variant_repo", "torchscript")])
def test_results_do_not_depend_on_the_batch(repo_name: str, runtime: str,
                                            request: pytest.FixtureRequest) -> None:
    repo: Path = request.getfixturevalue(repo_name)
    model = "tiny-tag" if repo_name == "tag_repo" else "tiny-var"

    async def go() -> tuple[dict[str, Any], list[dict[str, Any]]]:
        async with serve_asgi(create_app(settings(repo, max_wait_ms=50, runtime=runtime))) as c:
            url = f"/v1/models/{model}/tag"
            together = (await c.post(url, json={"texts": TEXTS})).json()
            alone = [(await c.post(url, json={"texts": [t]})).json() for t in TEXTS]
            return together, alone

    together, alone = run_bounded(go())
    for i, single in enumerate(alone):
        a, b = together["results"][i]["tokens"], single["results"][0]["tokens"]
        assert [TEXTS[i][t["start"] : t["end"]] for t in a] == TEXTS[i].split()
        assert [t["label"] for t in a] == [t["label"] for t in b]
        assert max(abs(x["probability"] - y["probability"]) for x, y in zip(a, b,
                                                                            strict=True)) <= 1e-5


def test_oip_v2_infer_returns_json_tokens(tag_repo: Path) -> None:
    async def go() -> tuple[httpx.Response, httpx.Response, httpx.Response]:
        async with serve_asgi(create_app(settings(tag_repo))) as c:
            meta = await c.get("/v2/models/tiny-tag")
            infer = await c.post("/v2/models/tiny-tag/infer", json={
                "inputs": [{"name": "text", "datatype": "BYTES", "shape": [2],
                            "data": TEXTS[:2]}]})
            v1 = await c.post("/v1/models/tiny-tag/tag", json={"texts": TEXTS[:2]})
            return meta, infer, v1

    meta, infer, v1 = run_bounded(go())
    assert meta.status_code == 200 and meta.json()["outputs"][0]["name"] == "tags"
    assert infer.status_code == 200, infer.text
    (out,) = infer.json()["outputs"]
    assert out["name"] == "tags" and out["datatype"] == "BYTES" and out["shape"] == [2]
    assert [json.loads(x) for x in out["data"]] == [r["tokens"] for r in v1.json()["results"]]


def test_truncation_marks_words_without_a_label(tag_repo: Path) -> None:
    text = "one two three " * 30

    async def go() -> httpx.Response:
        async with serve_asgi(create_app(settings(tag_repo, truncate=True))) as c:
            return await c.post("/v1/models/tiny-tag/tag", json={"texts": [text]})

    r = run_bounded(go())
    assert r.status_code == 200, r.text
    result = r.json()["results"][0]
    assert result["truncated"] is True and result["num_tokens"] == 40
    tokens = result["tokens"]
    assert len(tokens) == 90 and tokens[0]["label"] is not None and tokens[-1]["label"] is None
