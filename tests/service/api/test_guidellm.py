"""guidellm 0.8.1 (vLLM's benchmark client) against a real server's /v1/completions, as its
users run it: `--backend kind=openai_http,...,request_format=/v1/completions` (its default
route, /v1/chat/completions, is not served: our LMs are completion models), streaming with
`stream_options: {include_usage, continuous_usage_stats}` on every request (a 400 on each
before issue 35), a synchronous and a concurrent profile over a local text file of prompts.
Every request succeeds, and each one's output text and token counts equal what the server
answers for the same body unstreamed; their sum is what /metrics says was generated.

Greedy (`extras.body.temperature=0`) and `max_tokens` go through guidellm's backend
options, so the replay is deterministic; tiny-lm draws eos, so lengths vary. A generation
whose first draw is eos has text "" and, as vLLM counts it, `completion_tokens` 1 (with 0,
guidellm took it for an error: "[UNUSABLE_BACKEND_RESPONSE] backend resolved with empty
response payload"); `test_guidellm_eos_first` pins that case.

guidellm runs in its own environment (`.client-venvs/guidellm`, made once from the registry),
as a subprocess, offline: no tokenizer (its token counts are the server's usage)."""

from __future__ import annotations

import json
import os
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
MAX_TOKENS = 12
CANDIDATES = ["one two three", "four five six", "seven eight", "nine ten eleven twelve",
              "two three", "five six seven", "three four", "eight nine ten", "six seven"]

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def guidellm_bin() -> Path:
    return client_python(VENV_NAME).parent / "guidellm"


@pytest.fixture(scope="module")
def url(tiny_lm_repo: Path) -> Iterator[str]:
    with serve_in_thread(create_app(settings(tiny_lm_repo))) as base:
        yield base


def complete(url: str, body: dict[str, Any]) -> dict[str, Any]:
    r = httpx.post(f"{url}/v1/completions", json=body, timeout=30)
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
                 count: int, extras: str = "") -> dict[str, Any]:
    """One guidellm run over `lines` (a text file); its JSON output's only benchmark."""
    folder.mkdir()
    data = folder / "prompts.txt"
    data.write_text("".join(line + "\n" for line in lines))
    out = folder / "out.json"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           "HF_HOME": str(folder / "hf"), "TOKENIZERS_PARALLELISM": "false"}
    backend = (f"kind=openai_http,target={url},model={MODEL},request_format=/v1/completions,"
               f"max_tokens={MAX_TOKENS},extras.body.temperature=0{extras}")
    done = subprocess.run(
        [str(guidellm_bin), "run", "--backend", backend, "--profile", profile,
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
    eos = httpx.get(f"{url}/tokenizer_info", timeout=30).json()["eos_token_id"]
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
