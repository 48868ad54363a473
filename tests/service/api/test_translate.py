"""Translate endpoints end to end: the tiny-mt bundle through ONNX Runtime in the real app.

The server's beam output must equal the plain reference search (reference_search.py) run
over the same ONNX graphs one row at a time with the whole vocabulary.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from fake_translator import FakeTranslator
from fastapi import FastAPI
from reference_search import onnx_reference
from service_fakes import run_bounded, serve_asgi, served, settings

from seqserve.export.manifest import Manifest, load_bundle
from seqserve.service.api.translate import TranslateOptions
from seqserve.service.runtimes import load_runtime
from seqserve.service.runtimes.base import RuntimeSpec
from seqserve.service.scheduling.decoding import DecodeLoop
from seqserve.service.scheduling.models import DecodedModel
from seqserve.service.server.app import create_app
from seqserve.service.workers.translator import TranslatorWorker

TEXTS = ["one two three", "twenty", "forty fifty hundred thousand and un deux",
         "six seven", "cinq six sept huit neuf dix vingt", "eleven twelve twenty thirty"]


def worker_of(app: FastAPI, name: str = "tiny-mt") -> TranslatorWorker:
    _, worker = app.state.seqserve.repository.worker(name, None, TranslatorWorker)
    return worker


def engine_of(app: FastAPI, name: str = "tiny-mt") -> DecodeLoop:
    model = served(app, name)
    assert isinstance(model, DecodedModel)
    return model.loop


OPTIONS: list[dict[str, Any]] = [
    {"beam_size": 1},
    {"beam_size": 5, "n_best": 2},
    {"beam_size": 5, "n_best": 3, "length_penalty": 0.6, "coverage_penalty": 0.2,
     "no_repeat_ngram_size": 2, "min_length": 2, "max_length_ratio": 1.5},
]


def test_server_equals_reference_and_is_batch_invariant(tiny_repo: Path) -> None:
    app = create_app(settings(tiny_repo))

    async def scenario() -> list[dict[str, Any]]:
        async with serve_asgi(app) as client:
            posts = [client.post("/v1/models/tiny-mt/translate", json={"texts": TEXTS, **o})
                     for o in OPTIONS]  # every option set at once: batched together
            answers = await asyncio.gather(*posts)
            assert max(engine_of(app).stats.calls) > 5  # rows of several requests
        return [a.json() for a in answers]

    for opts, body in zip(OPTIONS, run_bounded(scenario()), strict=True):
        options = TranslateOptions.model_validate(opts).search_options()
        for text, result in zip(TEXTS, body["results"], strict=True):
            ref = onnx_reference(tiny_repo, text, options)
            got = result["hypotheses"]
            assert len(got) == len(ref) == options.n_best
            for h, r in zip(got, ref, strict=True):
                ids = r.tokens[:-1] if r.tokens and r.tokens[-1] == 3 else r.tokens
                assert h["token_ids"] == ids
                assert h["score"] == pytest.approx(r.score, rel=1e-4, abs=1e-4)
            assert result["translation"] == got[0]["translation"]
            assert [h["score"] for h in got] == sorted((h["score"] for h in got), reverse=True)


def test_a_bundle_without_projected_keys_answers_the_same(
        tiny_repo: Path, tiny_translator_run: Path, tmp_path: Path) -> None:
    """The same model exported as schema 2 wrote it (no `keys` from the encoder: the step
    projects the memory at every call, as packed translators do) serves the answers of the
    keyed bundle: token ids equal, scores within 1e-4, in one batch of every option set."""
    from seqserve.export.bundle import export_run

    plain = export_run(tiny_translator_run, tmp_path, "tiny-mt", version=1, progress=False,
                       attention_keys=False)
    manifest = load_bundle(plain)
    assert "keys" not in [t.name for t in manifest.graphs["encoder"].outputs]
    assert "keys" not in [t.name for t in manifest.graphs["decoder_step"].inputs]
    keyed = load_bundle(tiny_repo / "tiny-mt" / "1")
    assert [t.name for t in keyed.graphs["decoder_step"].inputs][-1] == "keys"
    app = create_app(settings(tmp_path))

    async def scenario() -> list[dict[str, Any]]:
        async with serve_asgi(app) as client:
            answers = await asyncio.gather(*(
                client.post("/v1/models/tiny-mt/translate", json={"texts": TEXTS, **o})
                for o in OPTIONS))
        return [a.json() for a in answers]

    for opts, body in zip(OPTIONS, run_bounded(scenario()), strict=True):
        options = TranslateOptions.model_validate(opts).search_options()
        for text, result in zip(TEXTS, body["results"], strict=True):
            ref = onnx_reference(tiny_repo, text, options)  # the keyed graphs
            for h, r in zip(result["hypotheses"], ref, strict=True):
                ids = r.tokens[:-1] if r.tokens and r.tokens[-1] == 3 else r.tokens
                assert h["token_ids"] == ids
                assert h["score"] == pytest.approx(r.score, rel=1e-4, abs=1e-4)


def test_attention_rows_sum_to_one(tiny_repo: Path) -> None:
    app = create_app(settings(tiny_repo))

    async def scenario() -> dict[str, Any]:
        async with serve_asgi(app) as client:
            r = await client.post("/v1/models/tiny-mt/versions/1/translate", json={
                "texts": TEXTS[:3], "beam_size": 3, "n_best": 3, "return_attention": True})
            assert r.status_code == 200, r.text
            return r.json()

    for result in run_bounded(scenario())["results"]:
        att = result["attention"]
        weights = np.array(att["weights"])
        assert weights.shape == (len(att["target_tokens"]), len(att["source_tokens"]))
        np.testing.assert_allclose(weights.sum(axis=1), 1.0, atol=1e-4)
        assert att["target_tokens"][: len(result["tokens"])] == result["tokens"]


def test_v2_infer_translates_with_parameters(tiny_repo: Path) -> None:
    app = create_app(settings(tiny_repo))
    params = {"beam_size": 3, "length_penalty": 0.5}

    async def scenario() -> tuple[dict[str, Any], dict[str, Any], httpx.Response]:
        async with serve_asgi(app) as client:
            v2 = await client.post("/v2/models/tiny-mt/infer", json={
                "parameters": params,
                "inputs": [{"name": "text", "datatype": "BYTES", "shape": [2],
                            "data": TEXTS[:2]}]})
            v1 = await client.post("/v1/models/tiny-mt/translate",
                                   json={"texts": TEXTS[:2], **params})
            bad = await client.post("/v2/models/tiny-mt/infer", json={
                "parameters": {"beam_size": 2, "n_best": 3},
                "inputs": [{"name": "text", "datatype": "BYTES", "shape": [1],
                            "data": TEXTS[:1]}]})
            return v2.json(), v1.json(), bad

    v2, v1, bad = run_bounded(scenario())
    outputs = {o["name"]: o for o in v2["outputs"]}
    assert outputs["translation"]["datatype"] == "BYTES" and outputs["score"]["datatype"] == "FP32"
    assert outputs["translation"]["data"] == [r["translation"] for r in v1["results"]]
    np.testing.assert_allclose(outputs["score"]["data"], [r["score"] for r in v1["results"]],
                               rtol=1e-5)
    assert bad.status_code == 400 and "n_best" in bad.json()["error"]


def fake_factory(delay: float) -> Any:
    def factory(spec: RuntimeSpec, path: Path, manifest: Manifest) -> Any:
        if manifest.task != "translator":
            return load_runtime(spec, path, manifest)
        return FakeTranslator(vocab_size=manifest.tokenizer.vocab_size, delay=delay,
                              eos_slope=0.0)  # EOS never gets likelier: long decodes

    return factory


def test_overload_429_and_cancel_frees_rows(tiny_repo: Path) -> None:
    app = create_app(settings(tiny_repo, queue_size=2, max_texts=2, max_live_hypotheses=16),
                     fake_factory(delay=0.003))
    long = {"beam_size": 16, "n_best": 1, "min_length": 30, "max_length": 40}

    async def scenario() -> None:
        async with serve_asgi(app) as client:
            engine = engine_of(app)
            url = "/v1/models/tiny-mt/translate"
            first = asyncio.ensure_future(client.post(url, json={"texts": TEXTS[:1], **long}))
            while engine.live_rows == 0:  # the first fills the 16-row budget
                await asyncio.sleep(0.002)
            queued = asyncio.ensure_future(client.post(url, json={"texts": TEXTS[1:3], **long}))
            while engine.queued < 2:
                await asyncio.sleep(0.002)
            over = await client.post(url, json={"texts": TEXTS[3:4]})
            assert over.status_code == 429 and "Retry-After" in over.headers
            assert "queue" in over.json()["error"]
            first.cancel()  # the client goes away mid-decode
            queued.cancel()
            for f in (first, queued):
                with contextlib.suppress(asyncio.CancelledError):
                    await f
            for _ in range(500):
                if engine.live_rows == 0 and engine.queued == 0:
                    break
                await asyncio.sleep(0.002)
            assert engine.live_rows == 0 and engine.queued == 0
            steps = engine.stats.steps
            assert steps < 30  # nobody decoded to min_length 30
            ok = await client.post(url, json={"texts": TEXTS[3:4], "beam_size": 2})
            assert ok.status_code == 200 and ok.json()["results"][0]["hypotheses"]
            metrics = (await client.get("/metrics")).text
            for name in ("seqserve_decode_steps_total", "seqserve_generated_tokens_total",
                         "seqserve_decoder_step_time_seconds_count",
                         "seqserve_encoder_time_seconds_count", "seqserve_live_hypotheses",
                         "seqserve_time_per_token_seconds_count"):
                found = re.search(rf'^{name}{{model="tiny-mt"}} (\S+)', metrics, re.M)
                assert found, name
            for name in ("seqserve_queue_time_seconds_count",
                         "seqserve_compute_time_seconds_count",
                         "seqserve_request_duration_seconds_count"):
                assert re.search(rf'^{name}{{endpoint="translate",model="tiny-mt"}} [1-9]',
                                 metrics, re.M), name
            steps_total = re.search(r'^seqserve_decode_steps_total{model="tiny-mt"} (\S+)',
                                    metrics, re.M)
            assert steps_total and float(steps_total.group(1)) == engine.stats.steps

    run_bounded(scenario())


def test_describe_lists_translator_limits(tiny_repo: Path) -> None:
    app = create_app(settings(tiny_repo))

    async def scenario() -> dict[str, Any]:
        async with serve_asgi(app) as client:
            for name in ("tiny-clf", "no-such-model"):  # not a translator: 404 with a reason
                r = await client.post(f"/v1/models/{name}/translate", json={"texts": ["one"]})
                assert r.status_code == 404 and name in r.json()["error"]
            return (await client.get("/v1/models/tiny-mt")).json()

    info = run_bounded(scenario())
    details = info["versions"][0]["details"]
    manifest = load_bundle(tiny_repo / "tiny-mt" / "1")
    assert details["limits"]["max_decode_length"] == manifest.limits["max_decode_length"]
    assert details["limits"]["max_live_hypotheses"] >= 16
    assert json.dumps(details)


def test_disconnect_and_deadline_stop_decoding(tiny_repo: Path) -> None:
    """The worker's path for a client that left (499) or a deadline that passed (504)."""
    import time

    from seqserve.service.core.errors import ClientGone, DeadlineExceeded
    from seqserve.service.scheduling.base import BatchCost, CostEstimate
    from seqserve.service.workers.base import RequestContext

    app = create_app(settings(tiny_repo), fake_factory(delay=0.003))
    long = TranslateOptions(beam_size=4, min_length=30, max_length=40).search_options()

    async def scenario() -> None:
        async with serve_asgi(app):
            worker, engine = worker_of(app), engine_of(app)
            call = RequestContext(deadline=time.monotonic() + 30)
            task = asyncio.ensure_future(worker.translate(TEXTS[:2], long, call))
            while engine.live_rows < 8:
                await asyncio.sleep(0.002)
            call.disconnected.set()
            with pytest.raises(ClientGone):
                await task
            # admission now knows 30 steps cannot fit 50 ms (429); with its costs unknown it
            # cannot know, takes the request, and the deadline stops it (504)
            engine.scheduler.step_cost = BatchCost()
            engine.scheduler.decode_cost = CostEstimate()
            late = RequestContext(deadline=time.monotonic() + 0.05)
            with pytest.raises(DeadlineExceeded):
                await worker.translate(TEXTS[:2], long, late)
            for _ in range(500):
                if engine.live_rows == 0:
                    break
                await asyncio.sleep(0.002)
            assert engine.live_rows == 0 and engine.stats.steps < 60

    run_bounded(scenario())
