"""Real uvicorn on 127.0.0.1 serving the tiny_repo bundles with ONNX Runtime."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from service_fakes import serve_in_thread

from seqserve.service.server.app import create_app
from seqserve.service.web.settings import Settings

MODEL = "tiny-clf"
WORDS = [
    "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "vingt",
    "trente", "cent", "mille", "et",
]


def texts_of_mixed_length(n: int) -> list[str]:
    return [" ".join(WORDS[(i * 3 + k) % len(WORDS)] for k in range(1 + (i * 7) % 30))
            for i in range(n)]


def labels_of(repo: Path) -> list[str]:
    labels: list[str] = json.loads((repo / MODEL / "1" / "manifest.json").read_text())["labels"]
    return labels


@pytest.fixture(scope="module")
def server(tiny_repo: Path) -> Iterator[str]:
    settings = Settings(repo=tiny_repo, max_wait_ms=20, max_batch_size=16, intra_op_threads=1,
                        max_texts=8, max_chars=500, max_tokens=64, max_body_bytes=20_000,
                        max_queue_wait_s=30)  # (answers compared here, not admission: 64
    with serve_in_thread(create_app(settings)) as url:  # at once on a busy box may wait 0.5 s)
        yield url


def test_round_trip_every_endpoint(server: str, tiny_repo: Path) -> None:
    labels = labels_of(tiny_repo)
    with httpx.Client(base_url=server, timeout=30) as c:
        for path in ["/v2", "/v2/health/live", "/v2/health/ready", f"/v2/models/{MODEL}",
                     f"/v2/models/{MODEL}/versions/1", f"/v2/models/{MODEL}/ready",
                     f"/v2/models/{MODEL}/versions/1/ready", "/v1/models", f"/v1/models/{MODEL}",
                     "/metrics", "/docs", "/openapi.json"]:
            r = c.get(path)
            assert r.status_code == 200, (path, r.text)
            assert "queue;dur=" in r.headers["server-timing"]
        listed = c.get("/v1/models").json()["models"]
        clf = next(m for m in listed if m["name"] == MODEL)
        assert clf["default_version"] == 1
        assert clf["versions"][0]["details"]["labels"] == labels
        meta = c.get(f"/v2/models/{MODEL}").json()
        assert meta["inputs"] == [{"name": "text", "datatype": "BYTES", "shape": [-1]}]
        assert meta["outputs"][1] == {"name": "probabilities", "datatype": "FP32",
                                      "shape": [-1, len(labels)]}

        text = "vingt et un, one two"
        body = {"texts": [text, "cent"], "top_k": len(labels), "return_attention": True}
        r = c.post(f"/v1/models/{MODEL}/classify", json=body)
        assert r.status_code == 200, r.text
        timing = dict(part.strip().split(";dur=") for part in
                      r.headers["server-timing"].split(","))
        assert set(timing) == {"queue", "compute", "total"}
        res = r.json()["results"]
        first = res[0]
        assert [t["label"] for t in first["top_k"]][0] == first["label"]
        assert abs(sum(t["probability"] for t in first["top_k"]) - 1) < 1e-6
        assert first["truncated"] is False and first["num_tokens"] == len(first["attention"])
        assert abs(sum(a["weight"] for a in first["attention"]) - 1) < 1e-4
        for a in first["attention"]:  # offsets point into the original text
            piece = a["token"].replace("\u2581", "")
            assert text[a["start"]:a["end"]].strip().lower() == piece.lower()
        same = c.post(f"/v1/models/{MODEL}/versions/1/classify", json=body).json()["results"]
        assert same[0]["score"] == pytest.approx(first["score"], abs=1e-6)
        assert "attention" not in c.post(f"/v1/models/{MODEL}/classify",
                                         json={"texts": [text]}).json()["results"][0]

        infer = {"id": "r1", "inputs": [{"name": "text", "datatype": "BYTES", "shape": [2],
                                         "data": [text, "cent"]}]}
        r = c.post(f"/v2/models/{MODEL}/infer", json=infer)
        assert r.status_code == 200, r.text
        out = r.json()
        assert out["model_name"] == MODEL and out["model_version"] == "1" and out["id"] == "r1"
        by_name = {o["name"]: o for o in out["outputs"]}
        assert by_name["label"]["data"] == [res[0]["label"], res[1]["label"]]
        assert by_name["probabilities"]["shape"] == [2, len(labels)]
        first_row = by_name["probabilities"]["data"][: len(labels)]
        assert max(first_row) == pytest.approx(res[0]["score"], abs=1e-6)


def test_concurrent_mixed_lengths_match_alone(server: str) -> None:
    texts = texts_of_mixed_length(64)

    def scores(res: dict) -> list[float]:  # type: ignore[type-arg]
        return [t["probability"] for t in sorted(res["top_k"], key=lambda t: t["label"])]

    with httpx.Client(base_url=server, timeout=30) as c:
        alone = [c.post(f"/v1/models/{MODEL}/classify",
                        json={"texts": [t], "top_k": 100}).json()["results"][0] for t in texts]

    async def together() -> list[dict]:  # type: ignore[type-arg]
        limits = httpx.Limits(max_connections=64)
        async with httpx.AsyncClient(base_url=server, timeout=30, limits=limits) as c:
            rs = await asyncio.gather(*(c.post(f"/v1/models/{MODEL}/classify",
                                               json={"texts": [t], "top_k": 100}) for t in texts))
        return [r.json()["results"][0] for r in rs]

    batched = asyncio.run(together())
    for a, b in zip(alone, batched, strict=True):
        assert scores(a) == pytest.approx(scores(b), abs=1e-5)
    metrics = httpx.get(f"{server}/metrics").text
    fam = {f.name: f for f in text_string_to_metric_families(metrics)}
    sums = {s.name: s.value for s in fam["seqserve_batch_size"].samples
            if s.labels.get("model") == MODEL}
    assert sums["seqserve_batch_size_sum"] / sums["seqserve_batch_size_count"] > 1


ROUTING = [
    ("get", "/v2/models/nope", 404),
    ("get", "/v2/models/nope/ready", 404),
    ("get", "/v1/models/nope", 404),
    ("get", f"/v1/models/{MODEL}/classify", 405),
    ("get", "/no/such/path", 404),
]


@pytest.mark.parametrize(("method", "path", "status"), ROUTING)
def test_routing_errors_are_json(server: str, method: str, path: str, status: int) -> None:
    """(Bad POST bodies of every route: test_bad_inputs.py.)"""
    r = httpx.request(method.upper(), server + path, timeout=30)
    assert r.status_code == status, r.text
    body = r.json()
    assert isinstance(body["error"], str) and body["error"]
    assert "server-timing" in r.headers


def test_huge_streamed_body_refused_without_content_length(server: str) -> None:
    def chunks() -> Iterator[bytes]:
        for _ in range(100):
            yield b"x" * 1000

    r = httpx.post(f"{server}/v1/models/{MODEL}/classify", content=chunks(), timeout=30)
    assert r.status_code == 413 and "max_body_bytes" in r.json()["error"]


def test_truncate_setting_cuts_and_says_so(tiny_repo: Path) -> None:
    settings = Settings(repo=tiny_repo, max_tokens=5, truncate=True, warmup=False)
    with serve_in_thread(create_app(settings)) as url:
        r = httpx.post(f"{url}/v1/models/{MODEL}/classify",
                       json={"texts": ["one two three four five six seven", "one"]}, timeout=30)
    res = r.json()["results"]
    assert r.status_code == 200
    assert (res[0]["truncated"], res[0]["num_tokens"]) == (True, 5)
    assert res[1]["truncated"] is False and res[1]["num_tokens"] < 5


def test_metrics_counts_equal_requests_sent(tiny_repo: Path) -> None:
    settings = Settings(repo=tiny_repo, warmup=False, max_texts=4)
    with serve_in_thread(create_app(settings)) as url, httpx.Client(base_url=url) as c:
        for i in range(7):
            assert c.post(f"/v1/models/{MODEL}/classify", json={"texts": ["one"] * (1 + i % 3)}
                          ).status_code == 200
        for _ in range(3):
            assert c.post(f"/v1/models/{MODEL}/classify", json={"texts": []}).status_code == 422
        for _ in range(2):
            assert c.post(f"/v1/models/{MODEL}/classify", json={"texts": ["a"] * 5}
                          ).status_code == 400
        infer = {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": ["a"]}]}
        for _ in range(4):
            assert c.post(f"/v2/models/{MODEL}/infer", json=infer).status_code == 200
        text = c.get("/metrics").text
    counts: dict[tuple[str, str, str], float] = {}
    hist: dict[str, float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == "seqserve_requests_total":
                counts[(s.labels["model"], s.labels["endpoint"], s.labels["status"])] = s.value
            if s.name == "seqserve_queue_time_seconds_count" and s.labels["model"] == MODEL:
                hist[s.labels["endpoint"]] = s.value
            if s.name == "seqserve_model_ready" and s.labels["model"] == MODEL:
                assert s.value == 1
    assert counts[(MODEL, "classify", "200")] == 7
    assert counts[(MODEL, "classify", "422")] == 3
    assert counts[(MODEL, "classify", "400")] == 2
    assert counts[(MODEL, "v2_infer", "200")] == 4
    assert hist == {"classify": 7, "v2_infer": 4}


def test_openapi_lists_the_routes(server: str) -> None:
    """The live document: the configured limits, one inference operation per served model
    (v1 and OIP: the body, and which texts have tokens, depend on the model)."""
    spec = json.loads(httpx.get(f"{server}/openapi.json").text)
    paths = set(spec["paths"])
    assert {f"/v1/models/{MODEL}/classify", f"/v1/models/{MODEL}/versions/1/classify",
            f"/v2/models/{MODEL}/infer", f"/v2/models/{MODEL}/versions/1/infer",
            "/v1/models"} <= paths
    assert "/v2/models/{name}/infer" not in paths and "/v1/models/{name}/classify" not in paths
    body = spec["paths"][f"/v1/models/{MODEL}/classify"]["post"]["requestBody"]
    item = body["content"]["application/json"]["schema"]["properties"]["texts"]["items"]
    assert item["maxLength"] == 500 and item["pattern"].startswith("^")
    texts = spec["components"]["schemas"]["ClassifyRequest"]["properties"]["texts"]
    assert (texts["maxItems"], texts["items"]["maxLength"], texts["items"]["minLength"]) == \
        (8, 500, 1)
    infer = spec["paths"][f"/v2/models/{MODEL}/infer"]["post"]
    body = infer["requestBody"]["content"]["application/json"]["schema"]
    output = body["properties"]["outputs"]["anyOf"][0]["items"]
    assert output["properties"]["name"]["enum"] == ["label", "probabilities"]
    assert "text/plain" in spec["paths"]["/metrics"]["get"]["responses"]["200"]["content"]
    assert "HTTPValidationError" not in spec["components"]["schemas"]


def test_mutated_bodies_never_get_500(server: str) -> None:
    import random

    rng = random.Random(0)
    seeds = [json.dumps({"texts": ["one two", "vingt \u00e9t\u00e9"], "top_k": 2}).encode(),
             json.dumps({"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1],
                                     "data": ["un deux"]}]}).encode()]
    paths = [f"/v1/models/{MODEL}/classify", f"/v2/models/{MODEL}/infer"]
    with httpx.Client(base_url=server, timeout=30) as c:
        for k in range(120):
            which = k % 2
            body = bytearray(seeds[which])
            for _ in range(rng.randint(1, 4)):
                pos = rng.randrange(len(body))
                op = rng.random()
                if op < 0.4:
                    body[pos] = rng.randrange(256)
                elif op < 0.7:
                    del body[pos]
                else:
                    body.insert(pos, rng.choice(b'{}[]",:\\0-9eE\xff\xc3u'))
            r = c.post(paths[which], content=bytes(body),
                       headers={"content-type": "application/json"})
            assert r.status_code < 500, (bytes(body), r.text)
            assert "error" in r.json() or r.status_code == 200


def test_json_body_without_a_content_type_is_read_as_json(server: str) -> None:
    """A body with no content type is JSON here (a form content type, what `curl -d` sends
    without `-H`, is a 415: tests/service/api/test_bad_inputs.py)."""
    body = json.dumps({"texts": ["one two three"], "top_k": 2}).encode()
    headers: dict[str, str] = {}
    with httpx.Client(base_url=server, timeout=30) as c:
        r = c.post(f"/v1/models/{MODEL}/classify", content=body, headers=headers)
        assert r.status_code == 200, r.text
        assert len(r.json()["results"][0]["top_k"]) == 2
        bad = c.post(f"/v1/models/{MODEL}/classify", content=b"texts=one", headers=headers)
        assert bad.status_code in (400, 422) and "error" in bad.json()
        metrics = c.get("/metrics").text
    label = 'endpoint="classify",model="tiny-clf",status="200"'  # the route is known
    assert f"seqserve_requests_total{{{label}}}" in metrics


def test_unreadable_text_says_so_and_can_be_refused(tiny_repo: Path) -> None:
    """Characters the model never saw (emoji, zero-width joiners) got a confident answer with
    nothing to say it was unreadable; now every classify, tag and translate result carries
    `unknown_fraction`, and `max_unknown_fraction` refuses such text with a 422."""
    unreadable = "\U0001f99c\u200d\U0001f99c \u0fb3\u0fb3\u0fb3 \U0001f680"
    readable = "vingt et un"
    with serve_in_thread(create_app(Settings(repo=tiny_repo, warmup=False))) as url:
        for model, verb in ((MODEL, "classify"), ("tiny-mt", "translate")):
            r = httpx.post(f"{url}/v1/models/{model}/{verb}",
                           json={"texts": [readable, unreadable]})
            assert r.status_code == 200, r.text
            known, unknown = (x["unknown_fraction"] for x in r.json()["results"])
            assert known == 0.0 and unknown >= 0.5, (verb, known, unknown)
        # only characters it never saw: all unknown, though SentencePiece writes a run of
        # them as one unknown token after a known bare word mark (it said 0.5)
        r = httpx.post(f"{url}/v1/models/{MODEL}/classify",
                       json={"texts": ["\U0001f600" * 2000, "\u200d\U0001f99c" * 50,
                                       f"{readable} \U0001f600"]})
        assert [x["unknown_fraction"] for x in r.json()["results"]][:2] == [1.0, 1.0], r.text
        mixed = r.json()["results"][2]
        assert 0 < mixed["unknown_fraction"] < 0.5, mixed  # 1 of the text's 4-5 tokens
    strict = Settings(repo=tiny_repo, warmup=False, max_unknown_fraction=0.4)
    with serve_in_thread(create_app(strict)) as url:
        ok = httpx.post(f"{url}/v1/models/{MODEL}/classify", json={"texts": [readable]})
        assert ok.status_code == 200
        for path in (f"/v1/models/{MODEL}/classify", "/v1/models/tiny-mt/translate"):
            r = httpx.post(url + path, json={"texts": [readable, unreadable]})
            assert r.status_code == 422 and "texts[1]" in r.json()["error"], r.text
            assert "unknown to this model's tokenizer" in r.json()["error"]
        oip = httpx.post(f"{url}/v2/models/{MODEL}/infer", json={"inputs": [{
            "name": "text", "datatype": "BYTES", "shape": [1], "data": [unreadable]}]})
        assert oip.status_code == 422 and "request_id" in oip.json()
