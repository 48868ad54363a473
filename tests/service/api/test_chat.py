"""POST /v1/chat/completions and the Hugging Face tokenizer files against a real server, with
the openai client and Hugging Face `tokenizers`: a chat answer is the completion of the
conversation as the bundle's template renders it (plain, streamed, with log-probs); a model
without a template and a model of another task are refused as the docs say; templates run
in jinja2's sandbox; every text model's served tokenizer.json encodes unseen texts (unknown
words, punctuation, unicode, special-token strings) to the ids the server's own tokenizer
gives."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from service_fakes import serve_in_thread, settings
from tokenizers import Tokenizer as HFTokenizer

from seqserve.models.text.chat_template import (
    DEFAULT_CHAT_TEMPLATE,
    TemplateFailed,
    check_template,
    read_template,
    render,
)
from seqserve.models.text.tokenizer_files import load_tokenizer
from seqserve.service.server.app import create_app

CHAT = "tiny-chat"
CONVERSATION = [{"role": "user", "content": "one two"},
                {"role": "assistant", "content": "three"},
                {"role": "user", "content": "four"}]
HELD_OUT = ["one two three", "Zebras quagga xylophone!", "  spaced   out  ", "twenty-one, 42.",
            "naïve café über straße", "日本語 🙂 emoji", "<s>", "one <s> two </s> three",
            "<unk><pad>x", "tab\tand\nnewline\r\n", "ALL CAPS", "½ ﬁ Ｆｕｌｌ", "x" * 40,
            "émigré's \"quotes\" — dash", "</s></s>", "word<s>word", "", " "]
"""Texts none of the tiny models saw in training (theirs are lower-case number words)."""


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory, tiny_chat_repo: Path, tiny_lm_repo: Path,
         tiny_repo: Path) -> Path:
    repo = tmp_path_factory.mktemp("chat") / "repo"
    shutil.copytree(tiny_chat_repo, repo)
    for source, name in ((tiny_lm_repo, "tiny-lm"), (tiny_repo, "tiny-clf"),
                         (tiny_repo, "tiny-mt")):
        shutil.copytree(source / name, repo / name)
    return repo


@pytest.fixture(scope="module")
def url(repo: Path) -> Iterator[str]:
    with serve_in_thread(create_app(settings(repo, max_new_tokens=40))) as base:
        yield base


@pytest.fixture(scope="module")
def client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)


def post(url: str, path: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(url + path, json=body, timeout=60)


def completion(url: str, messages: list[dict[str, Any]], **options: Any) -> dict[str, Any]:
    """What /v1/completions answers for the conversation as the template renders it."""
    prompt = render(DEFAULT_CHAT_TEMPLATE, messages, "<s>", "</s>")
    r = post(url, "/v1/completions", {"model": CHAT, "prompt": prompt, **options})
    assert r.status_code == 200, r.text
    got: dict[str, Any] = r.json()
    return got


def test_chat_is_the_completion_of_the_rendered_conversation(client: openai.OpenAI,
                                                            url: str) -> None:
    answer = client.chat.completions.create(model=CHAT, messages=CONVERSATION,  # type: ignore[arg-type]
                                            max_tokens=12, temperature=0)
    want = completion(url, CONVERSATION, max_tokens=12, temperature=0)
    assert answer.object == "chat.completion" and answer.id.startswith("chatcmpl-")
    (choice,) = answer.choices
    assert choice.message.role == "assistant"
    assert choice.message.content == want["choices"][0]["text"]
    assert choice.finish_reason == want["choices"][0]["finish_reason"]
    assert answer.usage is not None
    assert answer.usage.prompt_tokens == want["usage"]["prompt_tokens"]
    assert answer.usage.completion_tokens == want["usage"]["completion_tokens"]
    # max_completion_tokens, n, seed and stop as completions reads them
    sampled = client.chat.completions.create(
        model=CHAT, messages=CONVERSATION, max_completion_tokens=10, n=3, seed=7,  # type: ignore[arg-type]
        temperature=1.0, stop=["nine"])
    want = completion(url, CONVERSATION, max_tokens=10, n=3, seed=7, temperature=1.0,
                      stop=["nine"])
    assert [c.message.content for c in sampled.choices] == [c["text"] for c in want["choices"]]
    assert [c.index for c in sampled.choices] == [0, 1, 2]
    # no length asked: the server's max_new_tokens
    endless = post(url, "/v1/chat/completions", {
        "model": CHAT, "messages": CONVERSATION, "temperature": 0, "ignore_eos": True})
    assert endless.status_code == 200, endless.text
    assert endless.json()["usage"]["completion_tokens"] == 40
    assert endless.json()["choices"][0]["finish_reason"] == "length"


def test_streamed_chat_opens_with_the_role_and_ends_with_usage(client: openai.OpenAI) -> None:
    whole = client.chat.completions.create(model=CHAT, messages=CONVERSATION,  # type: ignore[arg-type]
                                           max_tokens=12, temperature=0, n=2)
    chunks = list(client.chat.completions.create(
        model=CHAT, messages=CONVERSATION, max_tokens=12, temperature=0, n=2,  # type: ignore[arg-type]
        stream=True, stream_options={"include_usage": True}))
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    assert len({c.id for c in chunks}) == 1
    *content, last = chunks
    assert last.choices == [] and last.usage is not None
    assert last.usage.model_dump() == whole.usage.model_dump()  # type: ignore[union-attr]
    for index in (0, 1):
        mine = [c.choices[0] for c in content if c.choices[0].index == index]
        assert mine[0].delta.role == "assistant" and mine[0].delta.content == ""
        assert all(c.delta.role is None for c in mine[1:])
        assert "".join(c.delta.content or "" for c in mine) == \
            whole.choices[index].message.content
        assert [c.finish_reason for c in mine if c.finish_reason] == \
            [whole.choices[index].finish_reason]


def test_chat_logprobs_are_the_completions(client: openai.OpenAI, url: str) -> None:
    answer = client.chat.completions.create(model=CHAT, messages=CONVERSATION,  # type: ignore[arg-type]
                                            max_tokens=6, temperature=0, logprobs=True,
                                            top_logprobs=2)
    want = completion(url, CONVERSATION, max_tokens=6, temperature=0, logprobs=2)
    got = answer.choices[0].logprobs
    assert got is not None and got.content is not None
    given = want["choices"][0]["logprobs"]
    assert [t.token for t in got.content] == given["tokens"]
    assert [t.logprob for t in got.content] == pytest.approx(given["token_logprobs"])
    assert all(len(t.top_logprobs) == 2 and t.bytes == list(t.token.encode())
               for t in got.content)
    r = post(url, "/v1/chat/completions", {"model": CHAT, "messages": CONVERSATION,
                                           "top_logprobs": 2, "max_tokens": 2})
    assert r.status_code == 200 and r.json()["choices"][0]["logprobs"] is None  # ignored


def test_content_parts_are_joined_and_other_parts_refused(url: str) -> None:
    parts = [{"role": "user", "content": [{"type": "text", "text": "one two"},
                                          {"type": "text", "text": "three"}]}]
    r = post(url, "/v1/chat/completions", {"model": CHAT, "messages": parts, "max_tokens": 8,
                                           "temperature": 0})
    assert r.status_code == 200, r.text
    joined = [{"role": "user", "content": "one two\nthree"}]
    want = completion(url, joined, max_tokens=8, temperature=0)
    assert r.json()["choices"][0]["message"]["content"] == want["choices"][0]["text"]
    image = [{"role": "user", "content": [{"type": "image_url",
                                           "image_url": {"url": "http://x/y.png"}}]}]
    r = post(url, "/v1/chat/completions", {"model": CHAT, "messages": image})
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages"
    assert "text parts" in r.json()["error"]["message"]


def test_models_without_a_template_or_of_another_task_are_refused(
        client: openai.OpenAI, url: str) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model="tiny-lm",
                                       messages=[{"role": "user", "content": "one"}])
    error = refused.value.body
    assert isinstance(error, dict) and error["param"] == "model"
    assert "has no chat_template" in error["message"]
    assert "pack lm --chat-template" in error["message"]
    for other in ("tiny-clf", "no-such-model"):
        chat = post(url, "/v1/chat/completions", {
            "model": other, "messages": [{"role": "user", "content": "one"}]})
        text = post(url, "/v1/completions", {"model": other, "prompt": "one"})
        assert chat.status_code == text.status_code == 404
        assert chat.json()["error"] == {**text.json()["error"]}
    r = post(url, "/v1/chat/completions", {"model": CHAT, "messages": [], "tools": []})
    assert r.status_code == 400 and "unsupported field(s): tools" in r.json()["error"]["message"]
    r = post(url, "/v1/chat/completions", {"model": CHAT, "messages": [{"role": "robot",
                                                                         "content": "x"}]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages"


def test_templates_run_in_the_sandbox() -> None:
    """A bundle is untrusted: its template reaches no Python internals and mutates nothing;
    a template's own refusal (raise_exception) or failure is a TemplateFailed (the route's
    400), and a template that cannot render a plain conversation is refused when packed."""
    escape = "{{ ''.__class__.__mro__[1].__subclasses__() }}"
    with pytest.raises(TemplateFailed, match="unsafe|access"):
        render(escape, CONVERSATION, "<s>", "</s>")
    with pytest.raises(TemplateFailed):
        render("{% set _ = messages.append({'role': 'x'}) %}ok", CONVERSATION, "<s>", "</s>")
    alternate = ("{% for m in messages %}{% if m['role'] == 'tool' %}"
                 "{{ raise_exception('no tools here') }}{% endif %}{{ m['content'] }}"
                 "{% endfor %}")
    check_template(alternate, "<s>", "</s>")  # renders the example conversation
    with pytest.raises(TemplateFailed, match="no tools here"):
        render(alternate, [{"role": "tool", "content": "x"}], "<s>", "</s>")
    assert render(DEFAULT_CHAT_TEMPLATE, CONVERSATION[:2], "<s>", "</s>") == \
        "<s>user: one two\nassistant: three\nassistant:"
    with pytest.raises(Exception, match="does not compile"):
        read_template("{% for %}")
    with pytest.raises(Exception, match="empty"):
        read_template("   ")


def test_template_served_in_the_tokenizer_config(url: str, repo: Path) -> None:
    config = httpx.get(f"{url}/v1/models/{CHAT}/tokenizer_config.json", timeout=30).json()
    assert config["chat_template"] == DEFAULT_CHAT_TEMPLATE
    assert (config["bos_token"], config["eos_token"]) == ("<s>", "</s>")
    assert config["model_max_length"] == json.loads(
        (repo / CHAT / "1" / "manifest.json").read_text())["limits"]["max_tokens"]
    plain = httpx.get(f"{url}/v1/models/tiny-lm/tokenizer_config.json", timeout=30).json()
    assert "chat_template" not in plain
    pinned = httpx.get(f"{url}/v1/models/{CHAT}/versions/1/tokenizer_config.json", timeout=30)
    assert pinned.json() == config
    for path in (f"/v1/models/{CHAT}/versions/9/tokenizer.json",
                 "/v1/models/no-such/tokenizer.json"):
        r = httpx.get(url + path, timeout=30)
        assert r.status_code == 404 and r.json()["error"]


def served_tokenizer(url: str, model: str, folder: Path) -> HFTokenizer:
    folder.mkdir(parents=True, exist_ok=True)
    r = httpx.get(f"{url}/v1/models/{model}/tokenizer.json", timeout=30)
    assert r.status_code == 200 and r.headers["content-type"] == "application/json"
    (folder / "tokenizer.json").write_bytes(r.content)
    return HFTokenizer.from_file(str(folder / "tokenizer.json"))


def test_the_served_tokenizer_encodes_as_the_server(url: str, tmp_path: Path) -> None:
    """A language model's: every held-out text to /tokenize's ids, with and without the bos
    the server adds (special-token strings as those tokens), and back."""
    hf = served_tokenizer(url, CHAT, tmp_path)
    for text in HELD_OUT:
        for add in (True, False):
            want = post(url, "/tokenize", {"model": CHAT, "prompt": text,
                                           "add_special_tokens": add}).json()["tokens"]
            assert hf.encode(text, add_special_tokens=add).ids == want, (text, add)
    ids = hf.encode("one two three").ids
    assert hf.decode(ids) == post(url, "/detokenize", {"model": CHAT, "tokens": ids}
                                  ).json()["prompt"].replace("<s>", "").strip()


def one_unknown_per_run(ids: list[int], unk: int) -> list[int]:
    return [i for k, i in enumerate(ids) if not (i == unk and k and ids[k - 1] == unk)]


def test_every_text_model_serves_its_tokenizer(url: str, repo: Path, tmp_path: Path) -> None:
    """A classifier's (a SentencePiece unigram) and a translator's (a SentencePiece word
    model) encode as the bundle's own tokenizer (texts read without bos; special-token
    strings are text there: held-out texts without them). A word model reads unknown words
    in a row as one unknown token, WordLevel as one each (docs/api.md): the same ids once
    such runs are one."""
    for model, word_level in (("tiny-clf", False), ("tiny-mt", True)):
        hf = served_tokenizer(url, model, tmp_path / model)
        manifest = json.loads((repo / model / "1" / "manifest.json").read_text())
        spec = manifest["tokenizer"]
        own = load_tokenizer(repo / model / "1" / spec["file"], spec["kind"])
        assert (json.loads(hf.to_str())["model"]["type"] == "WordLevel") is word_level
        for text in [t for t in HELD_OUT if "<" not in t] + ["one zebra two", "zebra"]:
            got = hf.encode(text).ids
            if word_level:
                got = one_unknown_per_run(got, own.unk_id)
            assert got == own.encode(text), (model, text)
