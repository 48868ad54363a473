"""Generate and score on a real in-process server (uvicorn on 127.0.0.1) with a tiny LM:
JSON and server-sent events, greedy and seeded sampling, n, stop strings, logprobs, limits,
scores; a client that hangs up frees its sequences; continuous batching shares steps."""

from __future__ import annotations

import json
import math
import shutil
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from service_fakes import serve_in_thread, settings

from seqserve.service.server.app import create_app


@pytest.fixture(scope="module")
def lm_repo(tmp_path_factory: pytest.TempPathFactory, tiny_lm_repo: Path,
            endless_lm_repo: Path) -> Path:
    repo = tmp_path_factory.mktemp("gen") / "repo"
    shutil.copytree(tiny_lm_repo, repo)
    shutil.copytree(endless_lm_repo / "endless-lm", repo / "endless-lm")
    return repo


@pytest.fixture(scope="module")
def url(lm_repo: Path) -> Iterator[str]:
    app = create_app(settings(lm_repo, max_new_tokens=300, max_texts=8))
    with serve_in_thread(app) as base:
        yield base


def post(url: str, path: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(url + path, json=body, timeout=60)


def events(url: str, path: str, body: dict[str, Any]) -> list[Any]:
    out = []
    with httpx.stream("POST", url + path, json={**body, "stream": True}, timeout=60) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith(
            "text/event-stream")
        for line in r.iter_lines():
            if line.startswith("data: "):
                data = line[len("data: "):]
                out.append(data if data == "[DONE]" else json.loads(data))
    return out


def metric(url: str, name: str, model: str) -> float:
    text = httpx.get(url + "/metrics", timeout=10).text
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name and s.labels.get("model") == model:
                return float(s.value)
    return 0.0


def test_greedy_json_is_deterministic_and_shaped(url: str) -> None:
    body = {"prompts": ["one two", "three four five"], "temperature": 0,
            "max_new_tokens": 12}
    a, b = post(url, "/v1/models/tiny-lm/generate", body), post(
        url, "/v1/models/tiny-lm/versions/1/generate", body)
    assert a.status_code == 200 and b.status_code == 200, a.text
    ra, rb = a.json(), b.json()
    assert ra["model"] == "tiny-lm" and ra["version"] == 1
    assert [r["text"] for r in ra["results"]] == [r["text"] for r in rb["results"]]
    assert [(r["prompt_index"], r["index"]) for r in ra["results"]] == [(0, 0), (1, 0)]
    assert all(r["finish_reason"] in ("length", "eos") for r in ra["results"])
    assert ra["usage"]["prompt_tokens"] > 0 and 0 < ra["usage"]["completion_tokens"] <= 24


def test_seeded_sampling_repeats_and_n_samples(url: str) -> None:
    body = {"prompt": "one", "temperature": 1.5, "top_k": 20, "top_p": 0.95, "seed": 7,
            "n": 4, "max_new_tokens": 10}
    first = post(url, "/v1/models/endless-lm/generate", body).json()["results"]
    again = post(url, "/v1/models/endless-lm/generate", body).json()["results"]
    assert [r["text"] for r in first] == [r["text"] for r in again]
    assert [r["index"] for r in first] == [0, 1, 2, 3]
    assert len({r["text"] for r in first}) > 1  # different samples of one prompt
    other = post(url, "/v1/models/endless-lm/generate", {**body, "seed": 8}).json()["results"]
    assert [r["text"] for r in other] != [r["text"] for r in first]


def test_stream_events_match_the_json_answer(url: str) -> None:
    body = {"prompts": ["one two", "six"], "temperature": 0, "max_new_tokens": 8, "n": 2}
    whole = post(url, "/v1/models/endless-lm/generate", body).json()
    got = events(url, "/v1/models/endless-lm/generate", body)
    assert got[-1] == "[DONE]" and "usage" in got[-2]
    cached = "cached_tokens"  # the second asking hits the prefix cache: what it saved differs
    assert {k: v for k, v in got[-2]["usage"].items() if k != cached} == \
        {k: v for k, v in whole["usage"].items() if k != cached}
    texts: dict[tuple[int, int], str] = {}
    finished = {}
    for ev in got[:-2]:
        key = (ev["prompt_index"], ev["index"])
        assert key not in finished, "no event after a sequence's finish"
        if "text" in ev:
            texts[key] = texts.get(key, "") + ev["text"]
        else:
            finished[key] = ev["finish_reason"]
    for r in whole["results"]:
        key = (r["prompt_index"], r["index"])
        assert texts[key] == r["text"] and finished[key] == r["finish_reason"] == "length"
    token_events = [e for e in got[:-2] if "text" in e]
    assert len(token_events) >= 4 * 4  # tokens arrive one by one, not as one block


def test_stop_strings_end_a_sequence_before_them(url: str) -> None:
    base = {"prompt": "one", "temperature": 0, "max_new_tokens": 30}
    text = post(url, "/v1/models/endless-lm/generate", base).json()["results"][0]["text"]
    stop = text[len(text) // 2 : len(text) // 2 + 2]
    assert stop.strip(), text
    cut = text[: text.find(stop)]
    got = post(url, "/v1/models/endless-lm/generate", {**base, "stop": [stop, "zzzz"]}).json()
    assert got["results"][0] == {**got["results"][0], "text": cut, "finish_reason": "stop"}
    streamed = events(url, "/v1/models/endless-lm/generate", {**base, "stop": stop})
    assert "".join(e.get("text", "") for e in streamed[:-2]) == cut
    assert streamed[-3]["finish_reason"] == "stop"


def test_logprobs_and_score_agree(url: str) -> None:
    got = post(url, "/v1/models/tiny-lm/generate",
               {"prompt": "one two", "temperature": 0, "max_new_tokens": 5, "logprobs": True})
    r = got.json()["results"][0]
    assert len(r["tokens"]) == len(r["logprobs"]) and all(lp <= 0 for lp in r["logprobs"])
    scored = post(url, "/v1/models/tiny-lm/score", {"texts": ["one two three", "ten"]})
    assert scored.status_code == 200, scored.text
    for s in scored.json()["results"]:
        assert s["num_tokens"] == len(s["logprobs"]) == len(s["tokens"]) > 0
        mean = -sum(s["logprobs"]) / s["num_tokens"]
        assert math.isclose(s["perplexity"], math.exp(mean), rel_tol=1e-6)


@pytest.mark.parametrize(("body", "status"), [
    ({"prompt": "one", "max_new_tokens": 301}, 400),  # over the server's max_new_tokens
    ({"prompt": "one", "prompts": ["two"]}, 422),
    ({"max_new_tokens": 3}, 422),
    ({"prompt": "one", "stop": ["a", "b", "c", "d", "e"]}, 422),
    ({"prompt": "one", "n": 3, "prompts": None}, 200),
    ({"prompts": ["one"] * 5, "n": 2}, 400),  # 10 sequences > max_texts 8
    ({"prompt": "one", "stream": "yes"}, 422),
])
def test_limits(url: str, body: dict[str, Any], status: int) -> None:
    body = {"max_new_tokens": 3, **body}
    r = post(url, "/v1/models/tiny-lm/generate", body)
    assert r.status_code == status, r.text
    if status >= 400:
        assert r.json()["error"]


def test_a_client_that_hangs_up_frees_its_rows(url: str) -> None:
    host, port = url.removeprefix("http://").split(":")
    body = json.dumps({"prompt": "one two", "max_new_tokens": 300, "stream": True}).encode()
    sock = socket.create_connection((host, int(port)), timeout=30)
    sock.sendall(b"POST /v1/models/endless-lm/generate HTTP/1.1\r\nhost: x\r\n"
                 b"content-type: application/json\r\ncontent-length: "
                 + str(len(body)).encode() + b"\r\n\r\n" + body)
    seen = b""
    while seen.count(b"data: ") < 3:
        seen += sock.recv(4096)
    assert b" 200 " in seen.split(b"\r\n")[0]
    assert metric(url, "seqserve_live_sequences", "endless-lm") == 1
    before = metric(url, "seqserve_generated_tokens_total", "endless-lm")
    sock.close()
    deadline = time.monotonic() + 20
    while metric(url, "seqserve_live_sequences", "endless-lm") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert metric(url, "seqserve_live_sequences", "endless-lm") == 0
    counted = metric(url, "seqserve_generated_tokens_total", "endless-lm") - before
    assert counted < 300  # stopped early: not generated to the end


def test_concurrent_requests_share_steps(url: str) -> None:
    import concurrent.futures

    body = {"prompt": "one", "temperature": 0, "max_new_tokens": 40}
    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        answers = list(pool.map(lambda _: post(url, "/v1/models/endless-lm/generate", body),
                                range(6)))
    texts = {a.json()["results"][0]["text"] for a in answers}
    assert len(texts) == 1  # greedy: the same text whatever it was batched with
    steps = httpx.get(url + "/metrics", timeout=10).text
    assert "seqserve_time_to_first_token_seconds_bucket" in steps


# -- the Open Inference Protocol's generate extension (Triton's shapes) ----------------------


def test_oip_generate_matches_v1_and_streams_the_same_text(url: str) -> None:
    v1 = post(url, "/v1/models/tiny-lm/generate",
              {"prompt": "one two", "temperature": 0, "max_new_tokens": 8}).json()
    expected = v1["results"][0]
    body = {"id": "req-7", "text_input": "one two",
            "parameters": {"temperature": 0, "max_tokens": 8}}
    for path in ("/v2/models/tiny-lm/generate", "/v2/models/tiny-lm/versions/1/generate"):
        r = post(url, path, body)
        assert r.status_code == 200, r.text
        answer = r.json()
        assert answer["id"] == "req-7" and answer["model_name"] == "tiny-lm"
        assert answer["model_version"] == "1"
        assert answer["text_output"] == expected["text"]
        assert answer["finish_reason"] == expected["finish_reason"]
        assert answer["usage"] == v1["usage"]
    streamed = []
    with httpx.stream("POST", url + "/v2/models/tiny-lm/generate_stream", timeout=60,
                      json={**body, "parameters": {**body["parameters"], "stream": True}}) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith(
            "text/event-stream")
        for line in r.iter_lines():
            if line.startswith("data: "):
                streamed.append(json.loads(line[len("data: "):]))
    *pieces, last = streamed
    assert all(e["model_name"] == "tiny-lm" and e["model_version"] == "1"
               and e["id"] == "req-7" for e in streamed)
    assert len(pieces) >= 1 and all(e["text_output"] for e in pieces)
    assert "".join(e["text_output"] for e in pieces) == expected["text"]
    assert last["text_output"] == "" and last["finish_reason"] == expected["finish_reason"]
    assert last["usage"] == v1["usage"]


def test_oip_generate_stream_runs_to_max_tokens_and_counts_them(url: str) -> None:
    before = metric(url, "seqserve_generated_tokens_total", "endless-lm")
    body = {"text_input": "one", "parameters": {"max_tokens": 12, "seed": 3}}
    events_seen = []
    with httpx.stream("POST", url + "/v2/models/endless-lm/versions/1/generate_stream",
                      json=body, timeout=60) as r:
        assert r.status_code == 200
        events_seen = [json.loads(line[6:]) for line in r.iter_lines()
                       if line.startswith("data: ")]
    assert events_seen[-1]["finish_reason"] == "length"
    assert events_seen[-1]["usage"]["completion_tokens"] == 12
    assert metric(url, "seqserve_generated_tokens_total", "endless-lm") == before + 12


@pytest.mark.parametrize(("path", "body", "status", "needle"), [
    ("generate", {"text_input": "one", "parameters": {"stream": True}}, 422,
     "parameters.stream: Input should be False"),
    ("generate_stream", {"text_input": "one", "parameters": {"stream": False}}, 422,
     "parameters.stream: Input should be True"),
    ("generate", {"text_input": "one", "parameters": {"max_new_tokens": 3}}, 422,
     "parameters.max_new_tokens: Extra inputs"),
    ("generate", {"text_input": "one", "max_tokens": 3}, 422, "body.max_tokens: Extra"),
    ("generate", {"prompt": "one"}, 422, "text_input: Field required"),
    ("generate_stream", {"text_input": ["one", "two"]}, 422, "text_input"),
    ("generate", {"text_input": "one", "parameters": {"max_tokens": 301}}, 400,
     "server's limit 300"),
])
def test_oip_generate_refusals_name_the_problem(url: str, path: str, body: dict[str, Any],
                                                status: int, needle: str) -> None:
    r = post(url, f"/v2/models/tiny-lm/{path}", body)
    assert r.status_code == status and r.headers["content-type"] == "application/json", r.text
    assert needle in r.json()["error"], r.json()


def test_oip_server_metadata_lists_the_generate_extension(url: str) -> None:
    assert "generate" in httpx.get(url + "/v2", timeout=10).json()["extensions"]
