"""lm-eval (EleutherAI's harness, 0.4) `local-completions` against a real server, as its users
run it: `tokenizer_backend=remote` (our /tokenizer_info, /tokenize), prompts sent as token
ids with echo, max_tokens 1 and logprobs 1, on a local loglikelihood task and a
loglikelihood_rolling task. Its numbers equal the sums of /v1/models/{m}/score's log-probs,
and its is_greedy what a greedy generation says. Before issue 35 every loglikelihood request
was a 400 (`unsupported field(s): echo`).

lm-eval runs in its own environment (`.client-venvs/lm-eval`, made once from the registry:
about 30 s to 2 min, 750 MB), as a subprocess, offline: the tasks read a local JSON-lines
file (no dataset download) and the tokenizer is the server's (no tokenizer download)."""

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

VENV_NAME = "lm-eval"
PAIRS = [("one two", " three four"), ("six seven", " eight"), ("one two", " ten")]
DOCS = ["one two three four five", "ten eleven twelve"]
TASKS = {
    "seqserve_tiny_ll": {"output_type": "loglikelihood", "doc_to_text": "{{context}}",
                         "doc_to_target": "{{continuation}}", "metric_list": [
                             {"metric": "acc", "aggregation": "mean",
                              "higher_is_better": True}]},
    "seqserve_tiny_rolling": {"output_type": "loglikelihood_rolling", "doc_to_text": "",
                              "doc_to_target": "{{text}}", "metric_list": [
                                  {"metric": "word_perplexity",
                                   "aggregation": "weighted_perplexity",
                                   "higher_is_better": False}]},
}

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def lm_eval_python() -> Path:
    return client_python(VENV_NAME)


@pytest.fixture(scope="module")
def url(tiny_lm_repo: Path) -> Iterator[str]:
    # one language model: lm-eval's remote tokenizer names none
    with serve_in_thread(create_app(settings(tiny_lm_repo))) as base:
        yield base


def tasks(folder: Path) -> Path:
    """The two tasks' YAML files, each over its own local JSON-lines file."""
    folder.mkdir()
    rows = {"seqserve_tiny_ll": [{"context": c, "continuation": t} for c, t in PAIRS],
            "seqserve_tiny_rolling": [{"text": d} for d in DOCS]}
    for name, spec in TASKS.items():
        data = folder / f"{name}.jsonl"
        data.write_text("".join(json.dumps(r) + "\n" for r in rows[name]))
        doc = {"task": name, "dataset_path": "json", "test_split": "test",
               "dataset_kwargs": {"data_files": {"test": str(data)}}, **spec}
        (folder / f"{name}.yaml").write_text(json.dumps(doc))  # YAML reads JSON
    return folder


def score(url: str, text: str) -> dict[str, Any]:
    r = httpx.post(f"{url}/v1/models/tiny-lm/score", json={"texts": [text]}, timeout=30)
    assert r.status_code == 200, r.text
    got: dict[str, Any] = r.json()["results"][0]
    return got


def tokenize(url: str, text: str) -> list[int]:
    r = httpx.post(f"{url}/tokenize", json={"prompt": text, "add_special_tokens": False},
                   timeout=30)
    assert r.status_code == 200, r.text
    ids: list[int] = r.json()["tokens"]
    return ids


def run_lm_eval(python: Path, url: str, folder: Path, tokenized: bool = True
                ) -> dict[str, list[dict[str, Any]]]:
    """lm-eval's samples of the two tasks, its requests sent as token ids (`tokenized`, its
    default) or as text (`tokenized_requests=False`)."""
    folder.mkdir(parents=True, exist_ok=True)
    tasks_dir = tasks(folder / "tasks")
    out = folder / "out"
    env = {**os.environ, "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1",
           "HF_HOME": str(folder / "hf"), "TOKENIZERS_PARALLELISM": "false"}
    args = (f"model=tiny-lm,base_url={url}/v1/completions,tokenizer_backend=remote,"
            f"num_concurrent=1,max_retries=1,max_length=48,tokenized_requests={tokenized}")
    done = subprocess.run(
        [str(python), "-m", "lm_eval", "--model", "local-completions",
         "--model_args", args, "--tasks", ",".join(TASKS), "--include_path", str(tasks_dir),
         "--log_samples", "--output_path", str(out)],
        cwd=folder, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    samples: dict[str, list[dict[str, Any]]] = {}
    for name in TASKS:
        (path,) = out.rglob(f"samples_{name}_*.jsonl")
        rows = [json.loads(line) for line in path.read_text().splitlines()]
        samples[name] = sorted(rows, key=lambda s: s["doc_id"])
    return samples


def test_lm_eval_local_completions_equals_score(lm_eval_python: Path, url: str,
                                                tmp_path: Path) -> None:
    samples = run_lm_eval(lm_eval_python, url, tmp_path)
    pairs = samples["seqserve_tiny_ll"]
    assert len(pairs) == len(PAIRS)
    greedy_seen = set()
    for (context, continuation), sample in zip(PAIRS, pairs, strict=True):
        (ll, is_greedy), = sample["filtered_resps"]
        scored = score(url, context + continuation)
        ctxlen = len(tokenize(url, context))
        assert float(ll) == pytest.approx(sum(scored["logprobs"][ctxlen:]), abs=1e-5)
        cont = scored["tokens"][ctxlen:]
        drawn = httpx.post(f"{url}/v1/completions", json={
            "model": "tiny-lm", "prompt": tokenize(url, context), "max_tokens": len(cont),
            "temperature": 0, "logprobs": 0}, timeout=30).json()
        greedy = drawn["choices"][0]["logprobs"]["tokens"][: len(cont)] == cont
        assert str(is_greedy) == str(greedy), (context, continuation)
        greedy_seen.add(greedy)
    assert greedy_seen == {True, False}  # both answers were exercised
    rolling = samples["seqserve_tiny_rolling"]
    assert len(rolling) == len(DOCS)
    for doc, sample in zip(DOCS, rolling, strict=True):
        (ll,) = sample["filtered_resps"]
        assert float(ll) == pytest.approx(sum(score(url, doc)["logprobs"]), abs=1e-5)


def test_lm_eval_text_requests_score_as_token_requests(lm_eval_python: Path, url: str,
                                                      tmp_path: Path) -> None:
    """`tokenized_requests=False`: lm-eval sends text (the rolling task's windows start with
    the bos string) and the server reads special-token strings as /tokenize does, so both
    request modes give the same numbers (before: 2.16 bits/byte against 1.87)."""
    as_text = run_lm_eval(lm_eval_python, url, tmp_path / "text", tokenized=False)
    for doc, sample in zip(DOCS, as_text["seqserve_tiny_rolling"], strict=True):
        (ll,) = sample["filtered_resps"]
        assert float(ll) == pytest.approx(sum(score(url, doc)["logprobs"]), abs=1e-5)
    for (context, continuation), sample in zip(PAIRS, as_text["seqserve_tiny_ll"], strict=True):
        (ll, _), = sample["filtered_resps"]
        scored = score(url, context + continuation)
        ctxlen = len(tokenize(url, context))
        assert float(ll) == pytest.approx(sum(scored["logprobs"][ctxlen:]), abs=1e-5)
