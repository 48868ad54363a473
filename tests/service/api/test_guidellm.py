"""guidellm 0.8.1 (vLLM's benchmark client) against a real server's /v1/completions, as its
users run it: `--backend kind=openai_http,...,request_format=/v1/completions`, streaming with
`stream_options: {include_usage, continuous_usage_stats}` on every request (a 400 on each
before issue 35), a synchronous and a concurrent profile over a local text file of prompts.
Every request succeeds, and each one's output text and token counts equal what the server
answers for the same body unstreamed; their sum is what /metrics says was generated.

Greedy (`extras.body.temperature=0`) and `max_tokens` go through guidellm's backend
options, so the replay is deterministic; tiny-lm draws eos, so lengths vary. A generation
whose first draw is eos has text "" and, as vLLM counts it, `completion_tokens` 1 (with 0,
guidellm took it for an error: "[UNUSABLE_BACKEND_RESPONSE] backend resolved with empty
response payload"); `test_guidellm_eos_first` pins that case.

Its default run, chat (`/v1/chat/completions`), against a language model whose bundle carries
the demo's chat template (`tiny_chat_repo`), with the tokenizer the server serves
(`/v1/models/{name}/tokenizer.json` and `tokenizer_config.json` saved in a folder, given as
`--tokenizer kind=huggingface_auto,model=FOLDER`: offline, guidellm cannot start without
one): every request succeeds and equals the server's unstreamed chat answer. transformers'
`AutoTokenizer` loaded from those files (guidellm's environment has transformers) encodes
held-out texts to /tokenize's ids and renders the conversation as the server does.

guidellm runs in its own environment (`.client-venvs/guidellm`, made once from the registry),
as a subprocess, offline (its token counts are the server's usage)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from client_venvs import client_python
from service_fakes import serve_in_thread, settings

from seqserve.service.server.app import create_app

VENV_NAME = "guidellm"
MODEL = "tiny-lm"
CHAT_MODEL = "tiny-chat"
MAX_TOKENS = 12
CANDIDATES = ["one two three", "four five six", "seven eight", "nine ten eleven twelve",
              "two three", "five six seven", "three four", "eight nine ten", "six seven"]

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def guidellm_bin() -> Path:
    return client_python(VENV_NAME).parent / "guidellm"


@pytest.fixture(scope="module")
def url(tiny_lm_repo: Path, tiny_chat_repo: Path, tmp_path_factory: pytest.TempPathFactory
        ) -> Iterator[str]:
    repo = tmp_path_factory.mktemp("guidellm") / "repo"
    shutil.copytree(tiny_lm_repo, repo)
    shutil.copytree(tiny_chat_repo / CHAT_MODEL, repo / CHAT_MODEL)
    with serve_in_thread(create_app(settings(repo))) as base:
        yield base


def complete(url: str, body: dict[str, Any], path: str = "/v1/completions") -> dict[str, Any]:
    r = httpx.post(url + path, json=body, timeout=30)
    assert r.status_code == 200, r.text
    got: dict[str, Any] = r.json()
    return got


@pytest.fixture(scope="module")
def prompts(url: str) -> list[str]:
    """The candidates whose greedy answer has text (as guidellm's text file sends them)."""
    kept = [p for p in CANDIDATES if complete(url, {
        "model": MODEL, "prompt": p + "\n", "max_tokens": MAX_TOKENS,
        "temperature": 0})["choices"][0]["text"].strip()]
    assert len(kept) >= 6, kept
    return kept[:6]


def metric(url: str, name: str, **labels: str) -> float:
    """The sum of `name`'s samples whose labels include `labels` (0 when none)."""
    text = httpx.get(f"{url}/metrics", timeout=30).text
    want = [f'{k}="{v}"' for k, v in labels.items()]
    total = 0.0
    for line in text.splitlines():
        head, _, value = line.rpartition(" ")
        if head.split("{")[0] == name and all(w in head for w in want):
            total += float(value)
    return total


def run_guidellm(guidellm_bin: Path, url: str, folder: Path, lines: list[str], profile: str,
                 count: int, extras: str = "", tokenizer: Path | None = None
                 ) -> dict[str, Any]:
    """One guidellm run over `lines` (a text file); its JSON output's only benchmark. With
    `tokenizer` (a folder of Hugging Face files): its default request format, chat, to
    CHAT_MODEL, counting with that tokenizer."""
    folder.mkdir()
    data = folder / "prompts.txt"
    data.write_text("".join(line + "\n" for line in lines))
    out = folder / "out.json"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           "HF_HOME": str(folder / "hf"), "TOKENIZERS_PARALLELISM": "false"}
    backend = (f"kind=openai_http,target={url},model={MODEL},request_format=/v1/completions,"
               f"max_tokens={MAX_TOKENS},extras.body.temperature=0{extras}")
    chat: list[str] = []
    if tokenizer is not None:  # guidellm's defaults: chat
        backend = (f"kind=openai_http,target={url},model={CHAT_MODEL},max_tokens={MAX_TOKENS},"
                   f"extras.body.temperature=0{extras}")
        chat = ["--tokenizer", f"kind=huggingface_auto,model={tokenizer}"]
    done = subprocess.run(
        [str(guidellm_bin), "run", "--backend", backend, *chat, "--profile", profile,
         "--constraint", f"kind=max_requests,count={count}",
         "--data", f"kind=text_file,path={data}", "--output", f"kind=json,path={out}",
         "--disable-console-interactive"],
        cwd=folder, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    (benchmark,) = json.loads(out.read_text())["benchmarks"]
    got: dict[str, Any] = benchmark
    return got


def errors(benchmark: dict[str, Any]) -> list[str]:
    requests = benchmark["requests"]
    return [str(r["info"]["error"]) for r in requests["errored"] + requests["incomplete"]]


@pytest.mark.parametrize(("profile", "count"), [("kind=synchronous", 3),
                                                ("kind=concurrent,streams=3", 6)])
def test_guidellm_completions_equal_server(guidellm_bin: Path, url: str, prompts: list[str],
                                           tmp_path: Path, profile: str, count: int) -> None:
    before = metric(url, "seqserve_generated_tokens_total", model=MODEL)
    benchmark = run_guidellm(guidellm_bin, url, tmp_path / "run", prompts, profile, count)
    generated = metric(url, "seqserve_generated_tokens_total", model=MODEL) - before
    assert errors(benchmark) == []
    done = benchmark["requests"]["successful"]
    assert len(done) == count
    sent_prompts = []
    for request in done:
        assert request["info"]["error"] is None and request["info"]["status"] == "completed"
        sent = json.loads(request["request_args"])["body"]
        assert sent["stream"] is True and sent["stream_options"] == {
            "include_usage": True, "continuous_usage_stats": True}
        assert sent["max_tokens"] == MAX_TOKENS and sent["temperature"] == 0
        sent_prompts.append(sent["prompt"])
        replay = {k: v for k, v in sent.items() if k not in ("stream", "stream_options")}
        answer = complete(url, replay)
        assert request["output"] == answer["choices"][0]["text"]
        assert request["output_tokens"] == answer["usage"]["completion_tokens"]
        assert request["prompt_tokens"] == answer["usage"]["prompt_tokens"]
        assert request["output_metrics"]["text_tokens"] == request["output_tokens"]
    assert sorted(sent_prompts) == sorted(p + "\n" for p in prompts[:count])
    assert generated == sum(r["output_tokens"] for r in done)
    metrics = benchmark["metrics"]
    assert metrics["request_totals"] == {"successful": count, "incomplete": 0, "errored": 0,
                                         "total": count}


UNUSABLE = ("ValueError('[UNUSABLE_BACKEND_RESPONSE] backend resolved with empty response "
            "payload')")


def test_guidellm_eos_first(guidellm_bin: Path, url: str, tmp_path: Path) -> None:
    """eos drawn first (a logit bias): the server answers text "" with completion_tokens 1
    (the eos drawn counts, as vLLM counts it; guidellm 0.8.1 takes a completion with no text
    and 0 tokens for an error)."""
    eos = httpx.get(f"{url}/tokenizer_info", params={"model": MODEL}, timeout=30).json()[
        "eos_token_id"]
    body = {"model": MODEL, "prompt": "one two three\n", "max_tokens": MAX_TOKENS,
            "temperature": 0, "logit_bias": {str(eos): 100}}
    answer = complete(url, body)
    assert answer["choices"][0]["text"] == "" and answer["choices"][0]["finish_reason"] == "stop"
    assert answer["usage"]["completion_tokens"] == 1
    benchmark = run_guidellm(guidellm_bin, url, tmp_path / "run", ["one two three"],
                             "kind=synchronous", 1, f",extras.body.logit_bias.{eos}=100")
    assert errors(benchmark) == [], UNUSABLE
    (request,) = benchmark["requests"]["successful"]
    assert json.loads(request["request_args"])["body"]["logit_bias"] == {str(eos): 100}
    assert request["output"] == ""
    assert request["output_tokens"] == answer["usage"]["completion_tokens"]


def chat(url: str, body: dict[str, Any]) -> dict[str, Any]:
    return complete(url, body, "/v1/chat/completions")


@pytest.fixture(scope="module")
def tokenizer_dir(url: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The chat model's tokenizer as the server serves it, saved as Hugging Face tools load
    one (a folder with tokenizer.json and tokenizer_config.json)."""
    folder = tmp_path_factory.mktemp("served-tokenizer")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        r = httpx.get(f"{url}/v1/models/{CHAT_MODEL}/{name}", timeout=30)
        assert r.status_code == 200, r.text
        (folder / name).write_bytes(r.content)
    return folder


@pytest.mark.parametrize(("profile", "count"), [("kind=synchronous", 3),
                                                ("kind=concurrent,streams=3", 6)])
def test_guidellm_default_chat_run_equals_server(guidellm_bin: Path, url: str,
                                                 tokenizer_dir: Path, prompts: list[str],
                                                 tmp_path: Path, profile: str,
                                                 count: int) -> None:
    benchmark = run_guidellm(guidellm_bin, url, tmp_path / "run", prompts, profile, count,
                             tokenizer=tokenizer_dir)
    assert errors(benchmark) == []
    done = benchmark["requests"]["successful"]
    assert len(done) == count
    for request in done:
        assert request["info"]["error"] is None and request["info"]["status"] == "completed"
        sent = json.loads(request["request_args"])["body"]
        assert sent["stream"] is True and sent["model"] == CHAT_MODEL
        assert sent["max_completion_tokens"] == MAX_TOKENS and sent["temperature"] == 0
        (message,) = sent["messages"]
        assert message["role"] == "user"
        replay = {k: v for k, v in sent.items() if k not in ("stream", "stream_options")}
        answer = chat(url, replay)
        assert request["output"] == answer["choices"][0]["message"]["content"]
        assert request["output_tokens"] == answer["usage"]["completion_tokens"]
        assert request["prompt_tokens"] == answer["usage"]["prompt_tokens"]
    assert benchmark["metrics"]["request_totals"] == {"successful": count, "incomplete": 0,
                                                      "errored": 0, "total": count}


HELD_OUT = ["one two three", "Zebras quagga xylophone!", "  spaced   out  ", "twenty-one, 42.",
            "naïve café über straße", "日本語 🙂 emoji", "<s>", "one <s> two </s> three",
            "<unk><pad>x", "tab\tand\nnewline\r\n", "ALL CAPS", "½ ﬁ Ｆｕｌｌ",
            "émigré's \"quotes\" — dash", "word<s>word", ""]
TRANSFORMERS = """
import json, sys
from transformers import AutoTokenizer
tok = AutoTokenizer.from_pretrained(sys.argv[1], local_files_only=True)
texts, conversation = json.loads(sys.stdin.read())
print(json.dumps({"ids": [tok(t)["input_ids"] for t in texts],
                  "bare": [tok(t, add_special_tokens=False)["input_ids"] for t in texts],
                  "prompt": tok.apply_chat_template(conversation, tokenize=False,
                                                    add_generation_prompt=True),
                  "max": tok.model_max_length, "eos": tok.eos_token_id}))
"""


def test_transformers_loads_the_served_tokenizer(guidellm_bin: Path, url: str,
                                                 tokenizer_dir: Path) -> None:
    """AutoTokenizer from the served files: /tokenize's ids for held-out texts (with and
    without bos), the conversation rendered as the server renders it (its prompt tokens
    are the chat answer's usage), the limits and specials /tokenizer_info names."""
    conversation = [{"role": "user", "content": "one two"},
                    {"role": "assistant", "content": "three"}, {"role": "user", "content": "four"}]
    python = guidellm_bin.parent / "python"
    done = subprocess.run([str(python), "-c", TRANSFORMERS, str(tokenizer_dir)],
                          input=json.dumps([HELD_OUT, conversation]), capture_output=True,
                          text=True, timeout=120,
                          env={**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    for text, ids, bare in zip(HELD_OUT, got["ids"], got["bare"], strict=True):
        for add, mine in ((True, ids), (False, bare)):
            want = httpx.post(f"{url}/tokenize", json={"model": CHAT_MODEL, "prompt": text,
                                                       "add_special_tokens": add},
                              timeout=30).json()["tokens"]
            assert mine == want, (text, add)
    answer = chat(url, {"model": CHAT_MODEL, "messages": conversation, "max_tokens": 2})
    prompt_ids = httpx.post(f"{url}/tokenize", json={"model": CHAT_MODEL, "prompt": got[
        "prompt"], "add_special_tokens": False}, timeout=30).json()["tokens"]
    assert got["prompt"] == "<s>user: one two\nassistant: three\nuser: four\nassistant:"
    assert len(prompt_ids) == answer["usage"]["prompt_tokens"]
    info = httpx.get(f"{url}/tokenizer_info", params={"model": CHAT_MODEL}, timeout=30).json()
    assert (got["max"], got["eos"]) == (info["model_max_length"], info["eos_token_id"])
