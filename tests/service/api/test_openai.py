"""OpenAI-compatible completions as clients and harnesses send them, on a real in-process server
(uvicorn on 127.0.0.1) with tiny LMs, through the real `openai` client where it can say it:
echo with log-probs equal to /score's (lm-eval's loglikelihood request, token-id prompts
included), max_tokens 0, streamed log-probs and include_usage, penalties, logit_bias,
ignore_eos and best_of changing what is drawn, OpenAI's error shapes, GET /v1/models/{id},
GET /health, the tokenizer endpoints, and the model's name in the metrics and access log."""

from __future__ import annotations

import json
import logging
import shutil
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families
from service_fakes import serve_in_thread, settings

from seqserve.models.text.tokenizer import Tokenizer
from seqserve.service.server.app import create_app

LIMIT = 300


@pytest.fixture(scope="module")
def lm_repo(tmp_path_factory: pytest.TempPathFactory, tiny_lm_repo: Path,
            endless_lm_repo: Path) -> Path:
    repo = tmp_path_factory.mktemp("openai") / "repo"
    shutil.copytree(tiny_lm_repo, repo)
    shutil.copytree(endless_lm_repo / "endless-lm", repo / "endless-lm")
    return repo


@pytest.fixture(scope="module")
def url(lm_repo: Path) -> Iterator[str]:
    app = create_app(settings(lm_repo, max_new_tokens=LIMIT, max_texts=8))
    with serve_in_thread(app) as base:
        yield base


@pytest.fixture(scope="module")
def client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def ids_of(lm_repo: Path) -> dict[str, int]:
    """Token id of each piece as the server writes it (SentencePiece's space as a space)."""
    tok = Tokenizer.load(lm_repo / "tiny-lm" / "1" / "tokenizer.model")
    return {tok.id_to_piece(i).replace("\u2581", " "): i for i in range(tok.vocab_size)}


def post(url: str, path: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(url + path, json=body, timeout=60)


def scored(url: str, text: str, model: str = "tiny-lm") -> dict[str, Any]:
    r = post(url, f"/v1/models/{model}/score", {"texts": [text]})
    assert r.status_code == 200, r.text
    result: dict[str, Any] = r.json()["results"][0]
    return result


def tokens(url: str, text: str, model: str = "tiny-lm") -> list[int]:
    r = post(url, "/tokenize", {"model": model, "prompt": text, "add_special_tokens": False})
    assert r.status_code == 200, r.text
    ids: list[int] = r.json()["tokens"]
    return ids


def test_echo_logprobs_are_the_scores(url: str, client: openai.OpenAI) -> None:
    text = "one two three four"
    score = scored(url, text)
    done = client.completions.create(model="tiny-lm", prompt=text, echo=True, max_tokens=0,
                                     logprobs=3)
    choice = done.choices[0]
    assert choice.text == text and choice.finish_reason == "length"
    lp = choice.logprobs
    assert lp is not None and lp.tokens == score["tokens"]
    assert lp.token_logprobs is not None and lp.token_logprobs[0] is None
    assert lp.token_logprobs[1:] == pytest.approx(score["logprobs"][1:], abs=1e-6)
    assert lp.top_logprobs is not None and lp.top_logprobs[0] is None
    for own, top in zip(lp.token_logprobs[1:], lp.top_logprobs[1:], strict=True):
        assert top is not None and len(top) == 3
        assert own is not None and own <= max(top.values()) + 1e-6
        assert list(top.values()) == sorted(top.values(), reverse=True)
    assert lp.text_offset == [0, 3, 7, 13]  # where each piece starts in the prompt
    assert done.usage is not None and done.usage.completion_tokens == 0
    assert done.usage.prompt_tokens == score["num_tokens"]
    # echo with generation: the text starts with the prompt, the generated tokens follow
    more = client.completions.create(model="tiny-lm", prompt=text, echo=True, max_tokens=3,
                                     logprobs=1, temperature=0)
    plain = client.completions.create(model="tiny-lm", prompt=text, max_tokens=3, logprobs=1,
                                      temperature=0)
    assert more.choices[0].text == text + plain.choices[0].text
    echoed, alone = more.choices[0].logprobs, plain.choices[0].logprobs
    assert echoed is not None and alone is not None and alone.text_offset is not None
    assert echoed.tokens == score["tokens"] + (alone.tokens or [])
    assert (echoed.token_logprobs or [])[len(score["tokens"]):] == alone.token_logprobs
    assert (echoed.text_offset or [])[len(score["tokens"]):] == [
        len(text) + at for at in alone.text_offset]
    # without logprobs the prompt is not scored, only echoed
    bare = client.completions.create(model="tiny-lm", prompt=text, echo=True, max_tokens=0)
    assert bare.choices[0].text == text and bare.choices[0].logprobs is None


def test_harness_loglikelihood_requests(url: str) -> None:
    """lm-eval's `local-completions` loglikelihood and loglikelihood_rolling requests as it
    sends them (token ids, echo, max_tokens 1, logprobs 1) read as it reads them equal the
    sums of /score's log-probs."""
    context, continuation = "one two", " three four"
    score = scored(url, context + continuation)
    whole, ctx = tokens(url, context + continuation), tokens(url, context)
    assert whole[: len(ctx)] == ctx and [len(score["tokens"])] == [len(whole)]
    body = {"model": "tiny-lm", "prompt": [whole], "temperature": 0, "max_tokens": 1,
            "logprobs": 1, "seed": 1234, "echo": True}
    r = post(url, "/v1/completions", body)
    assert r.status_code == 200, r.text
    lp = r.json()["choices"][0]["logprobs"]
    assert len(lp["tokens"]) == len(whole) + 1  # the prompt, then the one generated token
    ctxlen = len(ctx)
    got = sum(lp["token_logprobs"][ctxlen:-1])
    assert got == pytest.approx(sum(score["logprobs"][ctxlen:]), abs=1e-5)
    greedy = all(t == max(top.values()) for t, top in
                 zip(lp["token_logprobs"][ctxlen:-1], lp["top_logprobs"][ctxlen:-1],
                     strict=True))
    assert isinstance(greedy, bool)
    # rolling: bos (lm-eval's prefix token, read from /tokenizer_info) and the document
    info = httpx.get(f"{url}/tokenizer_info", params={"model": "tiny-lm"}, timeout=30).json()
    bos = tokens(url, info["bos_token"])
    assert bos == [info["bos_token_id"]]
    rolling = post(url, "/v1/completions", {**body, "prompt": [bos + whole]}).json()
    lp = rolling["choices"][0]["logprobs"]
    assert lp["tokens"][0] == info["bos_token"] and lp["token_logprobs"][0] is None
    assert lp["token_logprobs"][1:-1] == pytest.approx(score["logprobs"], abs=1e-6)
    # several prompts in one request (batch_size > 1): one choice each, in order
    two = post(url, "/v1/completions", {**body, "prompt": [whole, ctx]}).json()["choices"]
    assert [c["index"] for c in two] == [0, 1]
    assert two[0]["logprobs"]["token_logprobs"][1:-1] == pytest.approx(
        score["logprobs"][1:], abs=1e-6)


def test_special_token_strings_read_one_way_everywhere(url: str) -> None:
    """`<s>` / `</s>` in a text prompt are those tokens in /tokenize, completions (echo) and
    /score alike (Hugging Face's convention, which lm-eval's text requests assume): lm-eval's
    rolling request sent as text (`tokenized_requests=False`: bos string + document) scores
    as its token-id request does; `split_special_tokens` reads them as ordinary text."""
    info = httpx.get(f"{url}/tokenizer_info", params={"model": "tiny-lm"}, timeout=30).json()
    bos, eos = info["bos_token"], info["eos_token"]
    text = f"one two{eos} three {bos}four"
    ids = tokens(url, text)
    assert info["eos_token_id"] in ids and info["bos_token_id"] in ids
    body = {"model": "tiny-lm", "temperature": 0, "max_tokens": 0, "logprobs": 0,
            "echo": True}
    as_text = post(url, "/v1/completions", {**body, "prompt": text}).json()
    as_ids = post(url, "/v1/completions", {**body, "prompt": ids}).json()
    lp_text, lp_ids = (r["choices"][0]["logprobs"] for r in (as_text, as_ids))
    assert lp_text["tokens"] == lp_ids["tokens"] and bos in lp_text["tokens"]
    assert lp_text["token_logprobs"][1:] == pytest.approx(lp_ids["token_logprobs"][1:],
                                                          abs=1e-6)
    assert lp_text["text_offset"][lp_text["tokens"].index(eos)] == text.index(eos)
    score = scored(url, text)
    assert score["logprobs"][1:] == pytest.approx(lp_ids["token_logprobs"][1:], abs=1e-6)
    assert len(score["logprobs"]) == len(ids)
    # lm-eval's rolling window as text: the bos string, then the document
    doc = "one two three four five"
    rolling_text = post(url, "/v1/completions", {**body, "prompt": bos + doc}).json()
    rolling_ids = post(url, "/v1/completions",
                       {**body, "prompt": [info["bos_token_id"], *tokens(url, doc)]}).json()
    assert rolling_text["choices"][0]["logprobs"]["token_logprobs"] == pytest.approx(
        rolling_ids["choices"][0]["logprobs"]["token_logprobs"], abs=1e-6)
    # asked otherwise: the strings are text (more tokens, none of them special)
    split = post(url, "/tokenize", {"model": "tiny-lm", "prompt": text,
                                    "add_special_tokens": False,
                                    "split_special_tokens": True}).json()["tokens"]
    assert len(split) > len(ids) and info["eos_token_id"] not in split
    plain = post(url, "/v1/completions", {**body, "prompt": text,
                                          "split_special_tokens": True}).json()
    assert len(plain["choices"][0]["logprobs"]["tokens"]) == len(split)  # (echo: no bos)


def test_token_id_prompts(url: str, client: openai.OpenAI) -> None:
    ids = tokens(url, "one two three")
    by_text = client.completions.create(model="tiny-lm", prompt="one two three",
                                        max_tokens=5, temperature=0)
    by_ids = client.completions.create(model="tiny-lm", prompt=ids, max_tokens=5,
                                       temperature=0)
    assert by_ids.choices[0].text == by_text.choices[0].text
    assert by_ids.usage is not None and by_ids.usage.prompt_tokens == len(ids)
    several = client.completions.create(model="tiny-lm", prompt=[ids, ids[:1]], max_tokens=5,
                                        temperature=0)
    assert [c.index for c in several.choices] == [0, 1]
    assert several.choices[0].text == by_text.choices[0].text
    for prompt, where in (([ids, [5, 60]], "prompt[1][1]"), ([5, -1], "prompt[1]")):
        r = post(url, "/v1/completions", {"model": "tiny-lm", "prompt": prompt})
        assert r.status_code == 400, r.text
        error = r.json()["error"]
        assert error["message"].startswith(f"{where}: token id") and error["param"] == "prompt"
    for prompt in ([], [[]], [1, "a"], [[1], "a"]):
        r = post(url, "/v1/completions", {"model": "tiny-lm", "prompt": prompt})
        assert r.status_code == 400 and r.json()["error"]["param"] == "prompt", r.text


def test_max_tokens_zero_and_the_limit(url: str, client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as bad:
        client.completions.create(model="tiny-lm", prompt="one", max_tokens=0)
    assert bad.value.param == "max_tokens" and "echo" in bad.value.message  # type: ignore[attr-defined]
    # the server's limit, said one way wherever it is asked for (the field's own name)
    for path, body, field in (
            ("/v1/completions", {"model": "tiny-lm", "prompt": "one", "max_tokens": LIMIT + 1},
             "max_tokens"),
            ("/v1/completions", {"model": "tiny-lm", "prompt": "one",
                                 "max_tokens": 10**9}, "max_tokens"),
            ("/v1/models/tiny-lm/generate", {"prompt": "one", "max_new_tokens": LIMIT + 1},
             "max_new_tokens"),
            ("/v2/models/tiny-lm/generate", {"text_input": "one",
                                             "parameters": {"max_tokens": LIMIT + 1}},
             "max_tokens")):
        r = post(url, path, body)
        assert r.status_code == 400, r.text
        error = r.json()["error"]
        message = error["message"] if isinstance(error, dict) else error
        n = body.get("max_tokens", body.get("max_new_tokens", LIMIT + 1))
        assert message == f"{field} {n} > the server's limit {LIMIT}", message
        if isinstance(error, dict):
            assert error["param"] == field


def test_streamed_logprobs_and_usage(url: str, client: openai.OpenAI) -> None:
    args: dict[str, Any] = {"model": "tiny-lm", "prompt": ["one two", "six"], "max_tokens": 6,
                            "temperature": 0, "logprobs": 2, "n": 2}
    whole = client.completions.create(**args)
    chunks = list(client.completions.create(**args, stream=True,
                                            stream_options={"include_usage": True}))
    last = chunks[-1]
    assert last.choices == [] and last.usage is not None
    streamed, answered = last.usage.model_dump(), whole.usage.model_dump()  # type: ignore[union-attr]
    assert streamed["prompt_tokens_details"]["cached_tokens"] > 0  # asked before: cached
    for usage in (streamed, answered):
        usage.pop("prompt_tokens_details")
    assert streamed == answered
    assert all(c.usage is None for c in chunks[:-1])
    texts: dict[int, str] = {}
    told: dict[int, dict[str, list[Any]]] = {}
    for c in chunks[:-1]:
        for choice in c.choices:
            texts[choice.index] = texts.get(choice.index, "") + choice.text
            if choice.logprobs is not None:
                got = told.setdefault(choice.index, {"tokens": [], "token_logprobs": [],
                                                     "top_logprobs": [], "text_offset": []})
                for key in got:
                    got[key] += getattr(choice.logprobs, key)
    assert len(whole.choices) == 4
    for choice in whole.choices:
        assert texts[choice.index] == choice.text
        assert choice.logprobs is not None
        assert told[choice.index] == choice.logprobs.model_dump()
    # streamed echo: each choice's prompt first, then its generated text
    echoed = list(client.completions.create(**{**args, "n": 1}, echo=True, stream=True))
    first = {c.choices[0].index: c.choices[0] for c in reversed(echoed) if c.choices}
    assert first[0].text == "one two" and first[1].text == "six"
    assert first[0].logprobs is not None and first[0].logprobs.token_logprobs[0] is None  # type: ignore[index]


def test_penalties_bias_and_ignore_eos_change_what_is_drawn(
        url: str, client: openai.OpenAI, ids_of: dict[str, int]) -> None:
    base: dict[str, Any] = {"model": "endless-lm", "prompt": "one two", "max_tokens": 40,
                            "temperature": 0, "logprobs": 0}

    def drawn(**more: Any) -> list[str]:
        lp = client.completions.create(**{**base, **more}).choices[0].logprobs
        assert lp is not None and lp.tokens is not None
        return lp.tokens

    greedy = drawn()
    repeats = max(Counter(greedy).values())
    assert repeats > 2, greedy  # greedy decoding of random weights repeats itself
    penalized = drawn(frequency_penalty=2.0)
    assert max(Counter(penalized).values()) < repeats and len(set(penalized)) > len(set(greedy))
    assert drawn(presence_penalty=2.0) != greedy
    banned = ids_of[greedy[0]]
    assert drawn(logit_bias={str(banned): -100})[0] != greedy[0]
    forced = ids_of[" three"]
    assert drawn(logit_bias={str(forced): 100}, max_tokens=5) == [" three"] * 5
    assert drawn(frequency_penalty=0.0, presence_penalty=0.0, logit_bias={}) == greedy
    bad = post(url, "/v1/completions", {**base, "logit_bias": {"9999": 5}})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "logit_bias", bad.text
    bad = post(url, "/v1/completions", {**base, "logit_bias": {"x": 5}})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "logit_bias", bad.text
    for field, value in (("frequency_penalty", 2.5), ("logit_bias", {"5": 101})):
        r = post(url, "/v1/completions", {**base, field: value})
        assert r.status_code == 400 and r.json()["error"]["param"] == field, r.text
    # ignore_eos: the tiny LM ends its documents; with ignore_eos it runs to max_tokens
    short = {"model": "tiny-lm", "prompt": "one two three", "max_tokens": 60,
             "temperature": 0}
    ended = client.completions.create(**short, logprobs=1)
    assert ended.choices[0].finish_reason == "stop"
    assert ended.usage is not None and ended.usage.completion_tokens < 60
    # the eos it drew is its last token (OpenAI's and vLLM's way: lm-eval drops the last one)
    lp = ended.choices[0].logprobs
    assert lp is not None and lp.tokens is not None and lp.tokens[-1] == "</s>"
    assert len(lp.tokens) == ended.usage.completion_tokens  # the eos drawn counts (vLLM)
    assert "</s>" not in ended.choices[0].text
    streamed = [t for c in client.completions.create(**short, logprobs=1, stream=True)
                for choice in c.choices if choice.logprobs for t in choice.logprobs.tokens or []]
    assert streamed == lp.tokens
    endless = client.completions.create(**short, extra_body={"ignore_eos": True})
    assert endless.choices[0].finish_reason == "length"
    assert endless.usage is not None and endless.usage.completion_tokens == 60
    assert endless.choices[0].text.startswith(ended.choices[0].text)


def test_best_of_returns_the_most_likely_samples(url: str, client: openai.OpenAI) -> None:
    args: dict[str, Any] = {"model": "tiny-lm", "prompt": "one", "max_tokens": 8,
                            "temperature": 1.0, "seed": 11, "logprobs": 0}
    every = client.completions.create(**args, n=4)  # the same 4 sequences (seed, index)

    def total(c: Any) -> float:
        return float(sum(c.logprobs.token_logprobs))

    best = sorted((total(c) for c in every.choices), reverse=True)[:2]
    picked = client.completions.create(**args, n=2, best_of=4)
    assert [c.index for c in picked.choices] == [0, 1]
    assert [total(c) for c in picked.choices] == pytest.approx(best)
    assert picked.usage is not None and every.usage is not None
    assert picked.usage.completion_tokens == every.usage.completion_tokens
    for more, field in (({"n": 3, "best_of": 2}, "best_of"),
                        ({"best_of": 2, "stream": True}, "best_of")):
        r = post(url, "/v1/completions", {**args, **more})
        assert r.status_code == 400 and r.json()["error"]["param"] == field, r.text
    # what changes nothing is accepted: best_of equal to n with stream, stream_options
    # without stream (a whole answer has its usage anyway)
    for more in ({"best_of": 1, "stream": True}, {"stream_options": {"include_usage": True}}):
        assert post(url, "/v1/completions", {**args, **more}).status_code == 200
    assert client.completions.create(**args, user="someone").choices  # accepted, unused


def test_openai_error_shapes(url: str, client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as refused:  # no chat template (test_chat.py)
        client.chat.completions.create(model="tiny-lm",
                                       messages=[{"role": "user", "content": "hi"}])
    assert "has no chat_template" in refused.value.message
    r = post(url, "/v1/chat/completions", {"model": "tiny-lm"})
    error = r.json()["error"]
    assert r.status_code == 400 and set(error) == {"message", "type", "param", "code"}
    r = httpx.get(f"{url}/v1/embeddings", timeout=10)
    assert r.status_code == 404 and r.json()["error"]["type"] == "invalid_request_error"
    assert "embeddings are not served" in r.json()["error"]["message"]
    r = post(url, "/v1/completions", {"model": "tiny-lm", "prompt": "one", "suffix": "x"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "suffix"
    assert "unsupported field(s): suffix" in r.json()["error"]["message"]
    r = post(url, "/v1/completions", {"model": "no-such", "prompt": "one"})
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
    # the native routes keep their own shape
    native = httpx.get(f"{url}/v1/models/no-such", timeout=10)
    assert native.status_code == 404 and isinstance(native.json()["error"], str)
    native = post(url, "/v1/models/tiny-lm/nothing", {})
    assert native.status_code == 404 and isinstance(native.json()["error"], str)


def test_models_health_and_the_model_in_metrics_and_log(
        url: str, client: openai.OpenAI, caplog: pytest.LogCaptureFixture) -> None:
    model = client.models.retrieve("tiny-lm")
    assert (model.id, model.object, model.owned_by) == ("tiny-lm", "model", "seqserve")
    assert model.created > 1_600_000_000
    native = httpx.get(f"{url}/v1/models/tiny-lm", timeout=10).json()
    assert native["name"] == "tiny-lm" and native["versions"][0]["version"] == 1
    listed = {m.id: m.created for m in client.models.list()}
    assert listed["tiny-lm"] == model.created
    assert httpx.get(f"{url}/health", timeout=10).json() == {"ready": True}

    def completions(model: str) -> float:
        text = httpx.get(f"{url}/metrics", timeout=10).text
        return sum(s.value for f in text_string_to_metric_families(text) for s in f.samples
                   if s.name == "seqserve_requests_total" and s.labels.get("model") == model
                   and s.labels.get("endpoint") == "completions")

    before = completions("tiny-lm")
    caplog.set_level(logging.INFO, logger="seqserve.access")
    client.completions.create(model="tiny-lm", prompt="one", max_tokens=2)
    assert completions("tiny-lm") == before + 1
    lines = [r.fields for r in caplog.records  # type: ignore[attr-defined]
             if r.name == "seqserve.access"]
    assert any(f["route"] == "/v1/completions" and f["model"] == "tiny-lm" for f in lines)


def test_tokenizer_endpoints_round_trip(url: str) -> None:
    info = httpx.get(f"{url}/tokenizer_info", params={"model": "tiny-lm"}, timeout=10)
    assert info.status_code == 200, info.text
    i = info.json()
    assert (i["bos_token"], i["eos_token"]) == ("<s>", "</s>")
    assert i["bos_token_id"] == 2 and i["eos_token_id"] == 3
    several = httpx.get(f"{url}/tokenizer_info", timeout=10)  # two language models here
    assert several.status_code == 400 and "name one" in several.json()["error"]
    text = "one two three"
    plain = tokens(url, text)
    got = post(url, "/tokenize", {"model": "tiny-lm", "prompt": text}).json()
    assert got["tokens"] == [2, *plain] and got["count"] == len(plain) + 1
    special = tokens(url, "<s>one two</s>")
    assert special[0] == 2 and special[-1] == 3
    back = post(url, "/detokenize", {"model": "tiny-lm", "tokens": special}).json()["prompt"]
    assert back == "<s>one two</s>" and tokens(url, back) == special
    assert post(url, "/detokenize", {"model": "tiny-lm", "tokens": plain}).json()["prompt"] \
        == text
    bad = post(url, "/detokenize", {"model": "tiny-lm", "tokens": [1, 10_000]})
    assert bad.status_code == 400 and "tokens[1]" in bad.json()["error"]
    assert post(url, "/tokenize", {"model": "no-such", "prompt": "a"}).status_code == 404


def test_tokenize_checks_text_as_every_route_does(url: str) -> None:
    """A lone surrogate (which JSON carries) or a NUL is a 400 naming the prompt, as on
    /generate, not the tokenizer's 500; an empty text is bos alone (vLLM's)."""
    for text, fault in (("a\ud800", "not valid Unicode"), ("one\x00two", "NUL")):
        body = json.dumps({"model": "tiny-lm", "prompt": text}).encode()
        for path, field in (("/tokenize", "prompt"), ("/v1/models/tiny-lm/generate", "prompts")):
            sent = body if path == "/tokenize" else json.dumps(
                {field: [text], "max_new_tokens": 1}).encode()
            r = httpx.post(f"{url}{path}", content=sent, timeout=10,
                           headers={"content-type": "application/json"})
            assert r.status_code == 400 and fault in r.json()["error"], (path, r.text)
    assert post(url, "/tokenize", {"model": "tiny-lm", "prompt": ""}).json()["tokens"] == [2]


def test_continuous_usage_stats_as_guidellm_asks(url: str) -> None:
    """guidellm sends `stream_options.continuous_usage_stats` on every request: each chunk
    then carries the usage so far (vLLM's), the counts only growing to the final ones."""
    body = {"model": "tiny-lm", "prompt": "one two", "max_tokens": 5, "temperature": 0,
            "stream": True, "ignore_eos": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
    chunks = []
    with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=60) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunks.append(json.loads(line[6:]))
    made = [c["usage"]["completion_tokens"] for c in chunks]
    assert all(c["usage"] is not None for c in chunks)
    assert made == sorted(made) and made[-1] == 5 and chunks[-1]["choices"] == []
