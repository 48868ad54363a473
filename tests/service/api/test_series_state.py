"""Portable state of feature-sequence models (issue 36), on real servers and a stateful GRU
bundle built in the test session (tiny-series from the `tiny_series_repo` fixture: 3
features, 1 output, normalisation and output scale, limits.max_steps steps a request;
tests/series_support.py): `return_state` answers a signed state token, `state` continues
from it on another server with the same bundle and secret, and a series carried in chunks
equals the whole series (outputs and final state within 1e-5), over the v1 API and OIP
alike; the refusals (several series, a session, no secret, a tampered or malformed token:
400; a token of another version: 409, also with a version pinned in the URL). The engine
process's path (the state crossing the process boundary) runs in
tests/deploy/test_scale_out.py."""

from __future__ import annotations

import base64
import contextlib
import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from series_support import TutorialLSTMTagger, init, raw_series
from service_fakes import serve_in_thread

import seqserve.pack
from seqserve.service.core.state_token import KIND_SERIES, StateCodec

MODEL = "tiny-series"
SECRET = "series-state-test-secret-0123456789"


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory, tiny_series_repo: Path) -> Path:
    """tiny-series as versions 1 and 2 (the same files; a copy of the shared session bundle)
    and a stateless series tagger."""
    repo = tmp_path_factory.mktemp("series-state") / "repo"
    for version in ("1", "2"):
        shutil.copytree(tiny_series_repo / MODEL / "1", repo / MODEL / version)
    seqserve.pack.sequence_tagger(init(TutorialLSTMTagger(), seed=2), features=3, outputs=1,
                                  repo=repo, name="stateless", max_steps=32, progress=False,
                                  grid={"batch_sizes": (1, 2), "lengths": (1, 5)})
    return repo


@pytest.fixture(scope="module")
def secret_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("secret") / "state-secret"
    path.write_text(SECRET + "\n")
    return path


def _server(repo: Path, secret: Path | None) -> contextlib.AbstractContextManager[str]:
    from seqserve.service.server.app import create_app
    from seqserve.service.web.settings import Settings

    settings = Settings(repo=repo, intra_op_threads=1, inter_op_threads=1, warmup=False,
                        max_texts=8, state_secret_file=secret)
    return serve_in_thread(create_app(settings))


@pytest.fixture(scope="module")
def servers(repo: Path, secret_file: Path) -> Iterator[tuple[str, str]]:
    """Two servers (two replicas) with the same bundle and secret."""
    with _server(repo, secret_file) as a, _server(repo, secret_file) as b:
        yield a, b


@pytest.fixture(scope="module")
def max_steps(tiny_series_repo: Path) -> int:
    """The bundle's limit on one request's steps (limits.max_steps in its manifest)."""
    manifest = json.loads((tiny_series_repo / MODEL / "1" / "manifest.json").read_text())
    steps = int(manifest["limits"]["max_steps"])
    assert steps >= 16, steps  # the cuts below need 16 steps in one request
    return steps


@pytest.fixture(scope="module")
def series(max_steps: int) -> np.ndarray:
    """A raw 3-feature series as long as one request may be (the bundle's step limit)."""
    return raw_series(np.random.default_rng(36), max_steps)


def _predict(url: str, series: np.ndarray | list[Any], path: str = MODEL,
             **extra: Any) -> httpx.Response:
    body = {"series": [np.asarray(series).tolist()], **extra}
    return httpx.post(f"{url}/v1/models/{path}/predict", json=body, timeout=60)


def _ok(r: httpx.Response) -> dict[str, Any]:
    assert r.status_code == 200, r.text
    out: dict[str, Any] = r.json()
    return out


def _state(token: str) -> np.ndarray:
    return np.frombuffer(StateCodec([SECRET.encode()]).decode(token).state, "<f4")


def _close(got: np.ndarray, want: np.ndarray) -> None:
    assert got.shape == want.shape
    assert np.abs(got - want).max() <= 1e-5 * max(1.0, float(np.abs(want).max()))


def test_chunks_carried_across_replicas_equal_the_whole_series(
        servers: tuple[str, str], series: np.ndarray) -> None:
    n = len(series)  # the bundle's step limit: the longest series one request may send
    whole = _ok(_predict(servers[0], series, return_state=True))
    assert whole["steps"] == n
    want = np.asarray(whole["results"][0]["outputs"])  # (n, 1)
    cuts = [0, 1, 5, 6, 11, 13, n]
    token, outs = None, []
    for i, (a, b) in enumerate(zip(cuts, cuts[1:], strict=False)):
        extra: dict[str, Any] = {"return_state": True}
        if token is not None:
            extra["state"] = token
        body = _ok(_predict(servers[i % 2], series[a:b], **extra))
        assert body["steps"] == b and body["results"][0]["steps"] == b - a
        token = body["results"][0]["state"]
        value = StateCodec([SECRET.encode()]).decode(token)
        assert value.kind == KIND_SERIES and value.position == b
        assert (value.identity.name, value.identity.version) == (MODEL, 2)  # the default
        outs.append(np.asarray(body["results"][0]["outputs"]))
    _close(np.concatenate(outs), want)
    assert token is not None
    _close(_state(token), _state(whole["results"][0]["state"]))
    # a token continues without returning another one; the last steps are the same
    last = _ok(_predict(servers[1], series[13:], state=_ok(_predict(
        servers[0], series[:13], return_state=True))["results"][0]["state"]))
    assert "state" not in last["results"][0] or last["results"][0]["state"] is None
    _close(np.asarray(last["results"][0]["outputs"]), want[13:])


def _oip(url: str, steps: np.ndarray, token: str | None = None, return_state: bool = True,
         path: str = MODEL) -> httpx.Response:
    inputs: list[dict[str, Any]] = [{"name": "features", "datatype": "FP32",
                                     "shape": [1, *steps.shape],
                                     "data": steps.reshape(-1).tolist()}]
    if token is not None:
        inputs.append({"name": "state", "datatype": "BYTES", "shape": [1], "data": [token]})
    body: dict[str, Any] = {"inputs": inputs}
    if return_state:
        body["parameters"] = {"return_state": True}
    return httpx.post(f"{url}/v2/models/{path}/infer", json=body, timeout=60)


def test_oip_state_input_and_output_continue_a_v1_series(servers: tuple[str, str],
                                                         series: np.ndarray) -> None:
    """OIP's `state` output continues on v1 and v1's token on OIP: one token format."""
    want = np.asarray(_ok(_predict(servers[0], series[:15]))["results"][0]["outputs"])
    first = _ok(_oip(servers[0], series[:5]))
    tensors = {t["name"]: t for t in first["outputs"]}
    assert tensors["state"]["datatype"] == "BYTES" and tensors["state"]["shape"] == [1]
    assert first["parameters"]["sequence_steps"] == 5
    middle = _ok(_predict(servers[1], series[5:10], state=tensors["state"]["data"][0],
                          return_state=True))
    last = _ok(_oip(servers[0], series[10:15], middle["results"][0]["state"],
                    return_state=False))
    names = [t["name"] for t in last["outputs"]]
    assert "state" not in names and last["parameters"]["sequence_steps"] == 15
    got = np.concatenate([np.asarray(tensors["outputs"]["data"]).reshape(5, 1),
                          np.asarray(middle["results"][0]["outputs"]),
                          np.asarray(last["outputs"][0]["data"]).reshape(5, 1)])
    _close(got, want)


def _error(r: httpx.Response, status: int, *words: str) -> None:
    assert r.status_code == status, r.text
    message = r.json()["error"]
    for word in words:
        assert word in message, message


def test_refusals(servers: tuple[str, str], series: np.ndarray) -> None:
    url = servers[0]
    token = _ok(_predict(url, series[:6], return_state=True))["results"][0]["state"]
    two = {"series": [series[:3].tolist(), series[3:6].tolist()], "return_state": True}
    _error(httpx.post(f"{url}/v1/models/{MODEL}/predict", json=two, timeout=30), 400,
           "exactly one series")
    _error(_predict(url, series[6:12], state=token, session="s1"), 400, "session")
    _error(_predict(url, series[6:12], return_state=True, session="s1", start=True), 400,
           "session")
    raw = bytearray(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
    raw[40] ^= 1
    tampered = base64.urlsafe_b64encode(bytes(raw)).rstrip(b"=").decode()
    _error(_predict(url, series[6:12], state=tampered), 400, "does not verify")
    _error(_predict(url, series[6:12], state="not a token!"), 400, "not a state token")
    _error(_predict(url, series[6:12], state=token[:-8]), 400, "state")
    _error(_predict(url, series[6:12], return_state="yes"), 422)
    r = _oip(url, series[6:12], token)
    assert r.status_code == 200, r.text
    assert _oip(url, series[6:12], tampered).status_code == 400
    _error(httpx.post(f"{url}/v2/models/{MODEL}/infer", timeout=30, json={
        "inputs": [{"name": "features", "datatype": "FP32", "shape": [1, 2, 3],
                    "data": series[:2].reshape(-1).tolist()}],
        "parameters": {"return_state": True, "sequence_id": "s2", "sequence_start": True}}),
        400, "sequence_id")
    _error(httpx.post(f"{url}/v2/models/{MODEL}/infer", timeout=30, json={
        "inputs": [{"name": "features", "datatype": "FP32", "shape": [1, 2, 3],
                    "data": series[:2].reshape(-1).tolist()}],
        "parameters": {"return_state": 1}}),
        400, "return_state")
    x = np.random.default_rng(0).standard_normal((4, 3))
    _error(_predict(url, x, path="stateless", return_state=True), 400, "no recurrent state")


def test_a_token_of_another_version_is_409_and_pinning_it_continues(
        servers: tuple[str, str], series: np.ndarray) -> None:
    """The token of version 1 (pinned) given to the default, version 2, is a 409 naming
    both; pinned to version 1 in the URL it continues; version 2's token pinned to 1: 409."""
    url = servers[1]
    v1 = _ok(_predict(url, series[:8], path=f"{MODEL}/versions/1", return_state=True))
    assert v1["version"] == 1
    token = v1["results"][0]["state"]
    _error(_predict(url, series[8:12], state=token), 409, "version 1", "version 2")
    pinned = _ok(_predict(url, series[8:12], path=f"{MODEL}/versions/1", state=token))
    want = _ok(_predict(url, series[:12], path=f"{MODEL}/versions/1"))["results"][0]["outputs"]
    _close(np.asarray(pinned["results"][0]["outputs"]), np.asarray(want)[8:])
    v2 = _ok(_predict(url, series[:8], return_state=True))
    assert v2["version"] == 2
    _error(_predict(url, series[8:12], path=f"{MODEL}/versions/1",
                    state=v2["results"][0]["state"]), 409, "version 2")
    r = _oip(url, series[8:12], token, path=f"{MODEL}/versions/2")
    assert r.status_code == 409, r.text


def test_a_server_without_a_secret_refuses_state(repo: Path, servers: tuple[str, str],
                                                 series: np.ndarray) -> None:
    token = _ok(_predict(servers[0], series[:6], return_state=True))["results"][0]["state"]
    with _server(repo, None) as url:
        _error(_predict(url, series[:6], return_state=True), 400, "--state-secret-file")
        _error(_predict(url, series[6:12], state=token), 400, "--state-secret-file")
        assert _oip(url, series[:6]).status_code == 400
        assert _ok(_predict(url, series[:6]))["results"][0]["steps"] == 6
