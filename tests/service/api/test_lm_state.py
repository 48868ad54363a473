"""State as a value for language models on a real server (uvicorn on 127.0.0.1, tiny LMs
exported in the test session): a state token continues a generation exactly (greedy: the same
tokens; seeded sampling: the same text), a scored text's state continues as its prompt would;
tokens are checked (tampered, another model, no secret, several prompts); the prefix cache
answers what recomputing answers and says what it saved."""

from __future__ import annotations

import base64
import json
import shutil
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from service_fakes import serve_in_thread, settings

from seqserve.service.server.app import create_app

PROMPT = "the cat sat on the mat and the dog ran"
LONG = " ".join(["one two three four five six seven"] * 6)  # 42 tokens: over one 32-token block


@pytest.fixture(scope="module")
def lm_repo(tmp_path_factory: pytest.TempPathFactory, tiny_lm_repo: Path,
            endless_lm_repo: Path) -> Path:
    repo = tmp_path_factory.mktemp("lmstate") / "repo"
    shutil.copytree(tiny_lm_repo, repo)
    shutil.copytree(endless_lm_repo / "endless-lm", repo / "endless-lm")
    return repo


@pytest.fixture(scope="module")
def secret(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("secret") / "state.secret"
    path.write_text("new-secret-0123456789abcdef\nold-secret-0123456789abcdef\n")
    return path


def _serve(repo: Path, **extra: Any) -> Iterator[str]:
    app = create_app(settings(repo, max_new_tokens=64, max_texts=8, **extra))
    with serve_in_thread(app) as base:
        yield base


@pytest.fixture(scope="module")
def url(lm_repo: Path, secret: Path) -> Iterator[str]:
    yield from _serve(lm_repo, state_secret_file=secret)


@pytest.fixture(scope="module")
def uncached_url(lm_repo: Path, secret: Path) -> Iterator[str]:
    """The same bundles and secret with the prefix cache off (another replica)."""
    yield from _serve(lm_repo, state_secret_file=secret, prefix_cache_bytes=0)


@pytest.fixture(scope="module")
def no_secret_url(lm_repo: Path) -> Iterator[str]:
    yield from _serve(lm_repo)


def gen(url: str, body: dict[str, Any], model: str = "endless-lm",
        status: int = 200) -> dict[str, Any]:
    r = httpx.post(f"{url}/v1/models/{model}/generate", json=body, timeout=60)
    assert r.status_code == status, r.text
    return r.json()  # type: ignore[no-any-return]


def tokens_of(answer: dict[str, Any]) -> list[str]:
    return answer["results"][0]["tokens"]  # type: ignore[no-any-return]


@pytest.mark.parametrize("sampling", [{"temperature": 0}, {"temperature": 1.0, "seed": 7},
                                      {"temperature": 0.8, "top_k": 20, "seed": 3}])
def test_a_continued_generation_is_the_uninterrupted_one(url: str, uncached_url: str,
                                                         sampling: dict[str, Any]) -> None:
    whole = gen(url, {"prompt": PROMPT, "max_new_tokens": 12, "logprobs": True, **sampling})
    first = gen(url, {"prompt": PROMPT, "max_new_tokens": 5, "logprobs": True,
                      "return_state": True, **sampling})
    token = first["results"][0]["state"]
    # continued on another replica (same bundle and secret), the seed left out or repeated
    second = gen(uncached_url, {"prompt": "", "state": token, "max_new_tokens": 7,
                                "logprobs": True, **sampling})
    assert tokens_of(first) + tokens_of(second) == tokens_of(whole)
    assert first["results"][0]["text"] + second["results"][0]["text"] == \
        whole["results"][0]["text"]
    assert second["results"][0]["logprobs"] == pytest.approx(
        whole["results"][0]["logprobs"][5:], abs=1e-6)
    if "seed" in sampling:
        unseeded = {k: v for k, v in sampling.items() if k != "seed"}
        again = gen(url, {"prompt": "", "state": token, "max_new_tokens": 7, "logprobs": True,
                          **unseeded})
        assert tokens_of(again) == tokens_of(second)


def test_turns_carry_the_state_and_the_stream_ends_with_it(url: str) -> None:
    body = {"prompt": PROMPT, "max_new_tokens": 4, "temperature": 0, "return_state": True}
    events = []
    with httpx.stream("POST", f"{url}/v1/models/tiny-lm/generate",
                      json={**body, "stream": True}, timeout=60) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                events.append(json.loads(line[6:]))
    finish = [e for e in events if "finish_reason" in e]
    assert len(finish) == 1 and finish[0]["state"]
    plain = gen(url, {**body, "seed": 5}, "tiny-lm")
    assert plain["results"][0]["state"] == gen(url, {**body, "seed": 5}, "tiny-lm")[
        "results"][0]["state"]  # seeded and greedy: the same bytes (unseeded: a fresh key)
    turn = gen(url, {"prompt": "and then", "state": finish[0]["state"], "max_new_tokens": 4,
                     "temperature": 0, "return_state": True}, "tiny-lm")
    assert turn["results"][0]["state"] != finish[0]["state"]
    assert turn["usage"]["prompt_tokens"] >= 1


def test_a_scored_text_continues_like_its_prompt(url: str) -> None:
    r = httpx.post(f"{url}/v1/models/endless-lm/score",
                   json={"texts": [PROMPT], "return_state": True}, timeout=60)
    assert r.status_code == 200, r.text
    token = r.json()["results"][0]["state"]
    after = gen(url, {"prompt": "", "state": token, "max_new_tokens": 6, "temperature": 0,
                      "logprobs": True})
    direct = gen(url, {"prompt": PROMPT, "max_new_tokens": 6, "temperature": 0,
                       "logprobs": True})
    assert tokens_of(after) == tokens_of(direct)
    # and scoring after a state equals the same tokens' log-probs in one generation
    first = gen(url, {"prompt": PROMPT, "max_new_tokens": 3, "temperature": 0,
                      "return_state": True, "logprobs": True})
    assert first["results"][0]["tokens"]


@pytest.mark.parametrize("change", ["flip", "cut", "garbage"])
def test_a_tampered_token_is_a_400(url: str, change: str) -> None:
    token = gen(url, {"prompt": PROMPT, "max_new_tokens": 2, "return_state": True,
                      "temperature": 0})["results"][0]["state"]
    raw = bytearray(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
    if change == "flip":
        raw[40] ^= 1
        bad = base64.urlsafe_b64encode(bytes(raw)).decode().rstrip("=")
    elif change == "cut":
        bad = token[:-10]
    else:
        bad = "not a token!"
    answer = gen(url, {"prompt": "", "state": bad, "max_new_tokens": 2}, status=400)
    assert "state" in answer["error"]


def test_tokens_are_checked_against_the_bundle_and_the_request(url: str,
                                                              no_secret_url: str) -> None:
    token = gen(url, {"prompt": PROMPT, "max_new_tokens": 2, "return_state": True,
                      "temperature": 0})["results"][0]["state"]
    other = gen(url, {"prompt": "", "state": token, "max_new_tokens": 2}, "tiny-lm", 409)
    assert "endless-lm" in other["error"]
    gen(url, {"prompts": ["a", "b"], "state": token}, status=400)
    gen(url, {"prompt": "", "state": token, "n": 2}, status=400)
    gen(url, {"prompt": PROMPT, "return_state": True, "stop": ["x"]}, status=400)
    for body in ({"prompt": "", "state": token}, {"prompt": PROMPT, "return_state": True}):
        answer = gen(no_secret_url, body, status=400)
        assert "state-secret-file" in answer["error"]


def test_a_rotated_secret_still_verifies(lm_repo: Path, secret: Path, url: str,
                                         tmp_path: Path) -> None:
    token = gen(url, {"prompt": PROMPT, "max_new_tokens": 2, "return_state": True,
                      "temperature": 0})["results"][0]["state"]
    rotated = tmp_path / "rotated.secret"
    rotated.write_text("newest-secret-0123456789abcdef\n" + secret.read_text())
    for base in _serve(lm_repo, state_secret_file=rotated):
        gen(base, {"prompt": "", "state": token, "max_new_tokens": 2})
        newer = gen(base, {"prompt": PROMPT, "max_new_tokens": 2, "return_state": True,
                           "temperature": 0})["results"][0]["state"]
    gen(url, {"prompt": "", "state": newer, "max_new_tokens": 2}, status=400)


def cache_metric(url: str, event: str) -> float:
    text = httpx.get(url + "/metrics", timeout=10).text
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == "seqserve_prefix_cache_events_total" and \
                    s.labels.get("event") == event and s.labels.get("model") == "endless-lm":
                return float(s.value)
    return 0.0


@pytest.mark.parametrize("sampling", [{"temperature": 0}, {"temperature": 1.0, "seed": 11}])
def test_a_prefix_cache_hit_answers_what_recomputing_answers(
        url: str, uncached_url: str, sampling: dict[str, Any]) -> None:
    prompts = [LONG, LONG + " eight nine", LONG[:40], PROMPT]
    body = {"max_new_tokens": 8, "logprobs": True, **sampling}
    reference = [gen(uncached_url, {"prompt": p, **body}) for p in prompts]
    assert all(a["usage"]["cached_tokens"] == 0 for a in reference)
    hits = cache_metric(url, "hit")
    first = [gen(url, {"prompt": p, **body}) for p in prompts]
    # together (a mixed batch of hits and misses), then one by one
    with ThreadPoolExecutor(4) as pool:
        mixed = list(pool.map(lambda p: gen(url, {"prompt": p, **body}), prompts))
    for answers in (first, mixed):
        assert [tokens_of(a) for a in answers] == [tokens_of(a) for a in reference]
        for a, b in zip(answers, reference, strict=True):
            assert a["results"][0]["logprobs"] == b["results"][0]["logprobs"]
    assert all(a["usage"]["cached_tokens"] > 0 for a in mixed)
    assert first[1]["usage"]["cached_tokens"] >= 32  # the block its prefix shares with LONG
    assert cache_metric(url, "hit") > hits


def test_the_cache_is_per_api_key(lm_repo: Path, secret: Path) -> None:
    keys = lm_repo.parent / "keys"
    keys.write_text("alice-key-0123456789\nbob-key-0123456789\n")
    for base in _serve(lm_repo, api_key_file=keys):
        def ask(key: str, base: str = base) -> dict[str, Any]:
            r = httpx.post(f"{base}/v1/models/endless-lm/generate", timeout=60,
                           headers={"Authorization": f"Bearer {key}"},
                           json={"prompt": LONG, "max_new_tokens": 2, "temperature": 0})
            assert r.status_code == 200, r.text
            return r.json()  # type: ignore[no-any-return]
        assert ask("alice-key-0123456789")["usage"]["cached_tokens"] == 0
        assert ask("alice-key-0123456789")["usage"]["cached_tokens"] > 0
        assert ask("bob-key-0123456789")["usage"]["cached_tokens"] == 0


def test_openai_completions_carry_the_state(url: str) -> None:
    def complete(body: dict[str, Any]) -> dict[str, Any]:
        r = httpx.post(f"{url}/v1/completions", timeout=60,
                       json={"model": "endless-lm", "temperature": 0, **body})
        assert r.status_code == 200, r.text
        return r.json()  # type: ignore[no-any-return]

    whole = complete({"prompt": PROMPT, "max_tokens": 9})
    first = complete({"prompt": PROMPT, "max_tokens": 4, "return_state": True})
    state = first["choices"][0]["state"]
    second = complete({"prompt": "", "state": state, "max_tokens": 5})
    assert first["choices"][0]["text"] + second["choices"][0]["text"] == \
        whole["choices"][0]["text"]
    assert "cached_tokens" in whole["usage"]["prompt_tokens_details"]
    r = httpx.post(f"{url}/v1/completions", timeout=60,
                   json={"model": "endless-lm", "prompt": ["a", "b"], "state": state})
    assert r.status_code == 400 and r.json()["error"]["param"] == "state"


def test_oip_infer_carries_the_state(url: str) -> None:
    def infer(inputs: list[dict[str, Any]], parameters: dict[str, Any]) -> dict[str, Any]:
        r = httpx.post(f"{url}/v2/models/endless-lm/infer", timeout=60,
                       json={"inputs": inputs, "parameters": parameters})
        assert r.status_code == 200, r.text
        return {o["name"]: o["data"] for o in r.json()["outputs"]}

    text = {"name": "text_input", "datatype": "BYTES", "shape": [1]}
    greedy = {"temperature": 0}
    whole = infer([{**text, "data": [PROMPT]}], {**greedy, "max_tokens": 8})
    first = infer([{**text, "data": [PROMPT]}], {**greedy, "max_tokens": 3,
                                                 "return_state": True})
    second = infer([{**text, "data": [""]},
                    {"name": "state", "datatype": "BYTES", "shape": [1],
                     "data": first["state"]}], {**greedy, "max_tokens": 5})
    assert first["text_output"][0] + second["text_output"][0] == whole["text_output"][0]


def test_an_older_bundle_continues_states_through_lm_step(tiny_lm_repo: Path) -> None:
    """A prefill without initial_state (an older bundle) feeds a state's tokens through
    lm_step: the same states and log-probs as the prefill that takes initial_state."""
    import numpy as np

    from seqserve.export.manifest import load_bundle
    from seqserve.service.runtimes.onnx import OnnxRuntime
    from seqserve.service.scheduling.lm_prefill import PrefillRow, run_prefill

    folder = tiny_lm_repo / "tiny-lm" / "1"
    manifest = load_bundle(folder)
    runtime = OnnxRuntime({g: folder / s.onnx for g, s in manifest.graphs.items()
                           if s.onnx}, ["CPUExecutionProvider"], 1, 1)
    rng = np.random.default_rng(0)
    width = manifest.state_dim
    assert width
    start = rng.standard_normal(width).astype(np.float32) * 0.5
    rows = [PrefillRow([2, 9, 10, 11, 12]), PrefillRow([13, 14, 15], start),
            PrefillRow([2, 20, 21, 22, 23, 24], None, [2, 5])]
    class Older:
        """The bundle as an older one: its prefill always from zeros (no initial_state)."""

        name, providers = runtime.name, runtime.providers

        def run(self, graph: str, inputs: dict[str, Any]) -> dict[str, Any]:
            assert "initial_state" not in inputs
            if graph == "prefill":
                zeros = np.zeros((len(inputs["lengths"]), width), np.float32)
                inputs = {**inputs, "initial_state": zeros}
            return runtime.run(graph, inputs)

    new = run_prefill(runtime, rows, 0, True, width)
    old = run_prefill(Older(), rows, 0, False, None)
    np.testing.assert_allclose(old.state, new.state, atol=1e-5)
    np.testing.assert_allclose(old.log_probs, new.log_probs, atol=1e-5)
    for a, b in zip(old.cut_states, new.cut_states, strict=True):
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            np.testing.assert_allclose(x, y, atol=1e-5)
