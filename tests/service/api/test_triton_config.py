"""Triton model configurations true to the server (issue 51): for one model of every task
(tiny_full_repo's classifier, translator and tagger, tiny_series_repo's stateful series model,
tiny_lm_repo's language model), the configuration read with tritonclient over HTTP and over
gRPC (in its own environment) gives a request the server accepts on both (batch dimension +
dims, a session model's request as one whole sequence); the session model declares
`sequence_batching` with Triton's control inputs and the session idle timeout, the language
model `decoupled`, every other `dynamic_batching` as the batcher is set, each an
`instance_group` as served; no served view (configuration, v1 model, OIP metadata, repository
index) shows a path of the machine the bundle was built on."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import httpx
import pytest
from client_venvs import client_python
from grpc_support import serve_with_grpc
from service_fakes import settings
from triton_requests import request_arrays

from seqserve.service.server.app import create_app

httpclient = pytest.importorskip("tritonclient.http")
VENV_NAME = "tritonclient-grpc"
SESSION_IDLE_S = 123.0
MAX_WAIT_MS = 3.0
CONTROLS = {"START": "CONTROL_SEQUENCE_START", "END": "CONTROL_SEQUENCE_END",
            "READY": "CONTROL_SEQUENCE_READY", "CORRID": "CONTROL_SEQUENCE_CORRID"}


def http_inputs(config: dict[str, Any]) -> list[Any]:
    """The inputs a client builds from the configuration (triton_requests.py)."""
    inputs = []
    for name, datatype, data in request_arrays(config):
        inp = httpclient.InferInput(name, list(data.shape), datatype)
        inp.set_data_from_numpy(data)
        inputs.append(inp)
    return inputs


def strings(value: Any) -> list[str]:
    if isinstance(value, dict):
        return [s for v in value.values() for s in strings(v)]
    if isinstance(value, list):
        return [s for v in value for s in strings(v)]
    return [value] if isinstance(value, str) else []


def check_blocks(name: str, config: dict[str, Any]) -> None:
    assert config["instance_group"] == [{"name": "seqserve", "kind": "KIND_CPU",
                                         "count": 1}], name
    if name == "tiny-series":
        assert "dynamic_batching" not in config
        sequence = config["sequence_batching"]
        assert int(sequence["max_sequence_idle_microseconds"]) == int(SESSION_IDLE_S * 1e6)
        # (proto3's JSON leaves out a default: START's kind is 0)
        kinds = {c["name"]: c["control"][0].get("kind", "CONTROL_SEQUENCE_START")
                 for c in sequence["control_input"]}
        assert kinds == CONTROLS
    else:
        assert "sequence_batching" not in config
        dynamic = config["dynamic_batching"]
        if name in ("tiny-clf", "tiny-tag"):
            assert dynamic["preferred_batch_size"] == [config["max_batch_size"]]
            assert int(dynamic["max_queue_delay_microseconds"]) == int(MAX_WAIT_MS * 1000)
        else:
            assert int(dynamic.get("max_queue_delay_microseconds", 0)) == 0
    decoupled = config.get("model_transaction_policy", {}).get("decoupled", False)
    assert decoupled == (name == "tiny-lm"), name


@pytest.mark.parametrize("fixture", ["tiny_full_repo", "tiny_series_repo", "tiny_lm_repo"])
def test_a_request_built_from_the_config_is_accepted(
        fixture: str, request: pytest.FixtureRequest,
        tmp_path_factory: pytest.TempPathFactory) -> None:
    repo: Path = request.getfixturevalue(fixture)
    python = client_python(VENV_NAME)
    names = sorted(p.name for p in repo.iterdir() if p.is_dir())
    app = create_app(settings(repo, grpc_port=0, session_idle_timeout_s=SESSION_IDLE_S,
                              max_wait_ms=MAX_WAIT_MS))
    with serve_with_grpc(app) as running:
        client = httpclient.InferenceServerClient(url=running.url.removeprefix("http://"))
        views: list[Any] = [httpx.post(f"{running.url}/v2/repository/index").json()]
        for name in names:
            config = client.get_model_config(name)
            check_blocks(name, config)
            sequence = ({"sequence_id": 7, "sequence_start": True, "sequence_end": True}
                        if "sequence_batching" in config else {})
            result = client.infer(name, http_inputs(config), **sequence)
            assert result.get_response()["outputs"], name
            views += [config, httpx.get(f"{running.url}/v1/models/{name}").json(),
                      httpx.get(f"{running.url}/v2/models/{name}").json()]
        done = subprocess.run([str(python), str(Path(__file__).with_name(
            "triton_config_client.py")), running.grpc, *names],
            capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    over_grpc = json.loads(done.stdout.strip().splitlines()[-1])
    for name in names:
        got = over_grpc[name]
        assert "ok" in got["infer"], (name, got["infer"])
        check_blocks(name, got["config"])
        views.append(got["config"])
    # the run folders (tmp paths of this machine) are in the manifests, never served
    base = str(tmp_path_factory.getbasetemp())
    served = [s for view in views for s in strings(view)]
    assert not [s for s in served if s.startswith("/") or base in s]
    kept = [json.loads(m.read_text()).get("source_run", {}).get("path", "")
            for m in repo.glob("*/1/manifest.json")]
    assert fixture == "tiny_series_repo" or all(p.startswith(base) for p in kept)  # the file's
