"""Language models through the engine process (`seqserve serve --layout engine --api-workers
1`): generate (JSON and streamed token events over the ZeroMQ frames), score, stop strings, a
client that hangs up freeing its rows in the engine, and the real `openai` client listing
models and streaming completions from /v1/completions (echo scores and tuned draws
included)."""

from __future__ import annotations

import json
import shutil
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from process_support import Server, counts, serve


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, tiny_lm_repo: Path,
           endless_lm_repo: Path) -> Iterator[Server]:
    repo = tmp_path_factory.mktemp("lm-engine") / "repo"
    shutil.copytree(tiny_lm_repo, repo)
    shutil.copytree(endless_lm_repo / "endless-lm", repo / "endless-lm")
    with serve(repo, "--layout", "engine", "--api-workers", "1", "--max-new-tokens",
               "4000") as s:
        yield s


def live(url: str) -> float:
    text = httpx.get(f"{url}/metrics", timeout=5).text
    return counts(text, "seqserve_live_sequences", "model").get("endless-lm", 0.0)


def generated(url: str) -> float:
    text = httpx.get(f"{url}/metrics", timeout=10).text
    return counts(text, "seqserve_generated_tokens_total", "model").get("endless-lm", 0.0)


def test_generate_score_and_stream_through_the_engine(server: Server) -> None:
    url = server.url
    body = {"prompts": ["one two", "six"], "temperature": 0, "max_new_tokens": 6, "n": 2}
    whole = httpx.post(f"{url}/v1/models/endless-lm/generate", json=body, timeout=30)
    assert whole.status_code == 200, whole.text
    results = whole.json()["results"]
    assert len(results) == 4 and all(r["finish_reason"] == "length" for r in results)
    timing = dict(part.strip().split(";dur=") for part in whole.headers["server-timing"].split(","))
    assert float(timing["queue"]) > 0  # the engine's admission wait, carried by its frames
    texts: dict[tuple[int, int], str] = {}
    with httpx.stream("POST", f"{url}/v1/models/endless-lm/generate",
                      json={**body, "stream": True}, timeout=30) as r:
        lines = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    for data in lines[:-2]:
        ev = json.loads(data)
        if "text" in ev:
            key = (ev["prompt_index"], ev["index"])
            texts[key] = texts.get(key, "") + ev["text"]
    assert {(r["prompt_index"], r["index"]): r["text"] for r in results} == texts
    stop = results[0]["text"][3:5]
    stopped = httpx.post(f"{url}/v1/models/endless-lm/generate",
                         json={"prompt": "one two", "temperature": 0, "max_new_tokens": 6,
                               "stop": stop}, timeout=30).json()["results"][0]
    assert stopped["finish_reason"] == "stop"
    assert stopped["text"] == results[0]["text"][: results[0]["text"].find(stop)]
    scored = httpx.post(f"{url}/v1/models/tiny-lm/score", json={"texts": ["one two"]},
                        timeout=30)
    assert scored.status_code == 200 and scored.json()["results"][0]["num_tokens"] > 0


def test_a_stream_the_engine_refuses_is_a_429_not_a_200(server: Server) -> None:
    """The engine admits a generation by its expected wait and measured cost per request; a
    stream it refuses is answered with the refusal's status and Retry-After (the 200 waits
    for the first events), never a 200 whose body is an error event."""
    url = server.url
    long = {"prompt": "one", "temperature": 0, "max_new_tokens": 400}
    for _ in range(3):  # measured: a generation of 400 tokens costs ~0.1 s or more
        assert httpx.post(f"{url}/v1/models/endless-lm/generate", json=long,
                          timeout=60).status_code == 200
    with httpx.stream("POST", f"{url}/v1/models/endless-lm/generate",
                      json={**long, "stream": True}, headers={"X-Request-Timeout": "0.02"},
                      timeout=30) as r:
        r.read()
    assert r.status_code == 429, r.text
    assert r.headers["content-type"].startswith("application/json")
    assert float(r.headers["retry-after"]) > 0
    assert "cannot take it in time" in r.json()["error"]


def test_hanging_up_frees_rows_in_the_engine(server: Server) -> None:
    host, port = server.url.removeprefix("http://").split(":")
    # many more tokens than a client that hangs up after three of them lets it make
    body = json.dumps({"prompt": "one", "max_new_tokens": 4000, "stream": True}).encode()
    before = generated(server.url)
    sock = socket.create_connection((host, int(port)), timeout=30)
    sock.sendall(b"POST /v1/models/endless-lm/generate HTTP/1.1\r\nhost: x\r\ncontent-type: "
                 b"application/json\r\ncontent-length: " + str(len(body)).encode()
                 + b"\r\n\r\n" + body)
    seen = b""
    while seen.count(b"data: ") < 3:
        seen += sock.recv(4096)
    sock.close()
    deadline = time.monotonic() + 20
    while live(server.url) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert live(server.url) == 0
    made = generated(server.url) - before
    assert 3 <= made < 4000, made  # its rows were freed long before max_new_tokens


def test_the_openai_client_lists_and_streams(server: Server) -> None:
    import openai

    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)
    ids = [m.id for m in client.models.list()]
    assert ids == ["endless-lm", "tiny-lm"]
    done = client.completions.create(model="endless-lm", prompt="one two", max_tokens=5,
                                     temperature=0, logprobs=2)
    choice = done.choices[0]
    assert choice.finish_reason == "length" and choice.text
    assert choice.logprobs is not None and len(choice.logprobs.tokens or []) == 5
    assert done.usage is not None and done.usage.completion_tokens == 5
    chunks = list(client.completions.create(model="endless-lm", prompt="one two",
                                            max_tokens=5, temperature=0, stream=True))
    assert "".join(c.choices[0].text for c in chunks) == choice.text
    assert chunks[-1].choices[0].finish_reason == "length"
    with pytest.raises(openai.BadRequestError) as bad:
        client.completions.create(model="endless-lm", prompt="one", max_tokens=5,
                                  extra_body={"suffix": "x"})
    assert "suffix" in str(bad.value)
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="no-such-model", prompt="one", max_tokens=5)


def test_echo_scores_and_tuned_draws_through_the_engine(server: Server) -> None:
    """The prompt's scores with their alternatives (the score call's `top`) and the draw's
    logit bias and penalties (`GenerateOptions` fields) cross the engine's frames."""
    import openai

    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)
    text = "one two three"
    score = httpx.post(f"{server.url}/v1/models/tiny-lm/score", json={"texts": [text]},
                       timeout=30).json()["results"][0]
    echoed = client.completions.create(model="tiny-lm", prompt=text, echo=True,
                                       max_tokens=0, logprobs=2).choices[0].logprobs
    assert echoed is not None and echoed.token_logprobs is not None
    assert echoed.token_logprobs[1:] == pytest.approx(score["logprobs"][1:], abs=1e-6)
    assert echoed.top_logprobs is not None and all(len(t or {}) == 2
                                                   for t in echoed.top_logprobs[1:])
    forced = httpx.post(f"{server.url}/tokenize", json={"model": "endless-lm", "prompt": "two",
                                                        "add_special_tokens": False},
                        timeout=30).json()["tokens"][0]
    done = client.completions.create(model="endless-lm", prompt="one", max_tokens=4,
                                     temperature=0, logit_bias={str(forced): 100},
                                     frequency_penalty=0.5)
    assert done.choices[0].text == " two two two two"


def test_concurrent_streams_share_frames_and_each_gets_its_own_text(server: Server) -> None:
    """Generations of one API process in flight together: every step's tokens of all of them
    travel in one frame, and each stream still gets exactly its own text."""
    import concurrent.futures

    url = server.url
    prompts = ["one", "one two", "six", "two six one", "seven"]

    def stream(prompt: str) -> str:
        body = {"prompt": prompt, "temperature": 0, "max_new_tokens": 40, "stream": True}
        text = ""
        with httpx.stream("POST", f"{url}/v1/models/endless-lm/generate", json=body,
                          timeout=60) as r:
            for line in r.iter_lines():
                if line.startswith("data: {") and '"text"' in line:
                    text += json.loads(line[6:])["text"]
        return text

    with concurrent.futures.ThreadPoolExecutor(len(prompts)) as pool:
        streamed = list(pool.map(stream, prompts * 2))
    alone = [httpx.post(f"{url}/v1/models/endless-lm/generate",
                        json={"prompt": p, "temperature": 0, "max_new_tokens": 40},
                        timeout=60).json()["results"][0]["text"] for p in prompts]
    assert streamed == alone * 2
    assert len(set(alone)) > 1


def test_one_frame_carries_a_loop_turns_messages_in_order() -> None:
    from seqserve.service.engine import protocol as p

    replies = [p.Tokens(1, [(0, 5, -0.5, [(5, -0.5), (7, -1.0)], None)], 0.25),
               p.Tokens(2, [(1, 2, -0.1, [], "eos")], None),
               p.Failure(1, "InferenceFailed", "boom", None, 0.1)]
    assert p.api_decoder.decode(p.encoder.encode(replies)) == replies
    requests = [p.Cancel(3), p.Hello(), p.StopSeq(4, 1)]
    assert p.engine_decoder.decode(p.encoder.encode(requests)) == requests
