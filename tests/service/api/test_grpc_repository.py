"""The gRPC front's repository, configuration and statistics RPCs (issue 34): the real
`tritonclient.grpc` client (in its own environment: its grpc extra pins protobuf < 7, the
server keeps protobuf 7) lists, loads and unloads models, reads their configuration and
statistics, and gets the answers HTTP gives, behind the API key; each refusal has its gRPC
status. model_config.proto's fields are Triton's."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
from client_venvs import client_python
from control_support import CLF, MT
from grpc_support import Running, serve_with_grpc
from service_fakes import copy_repo, settings

from seqserve.service.api.grpc import messages as pb
from seqserve.service.server.app import create_app

VENV_NAME = "tritonclient-grpc"
KEY = "s3cret"
AUTH = {"Authorization": f"Bearer {KEY}"}


@pytest.fixture(scope="module")
def triton_python() -> Path:
    return client_python(VENV_NAME)


@pytest.fixture
def explicit(tiny_repo: Path, tmp_path: Path) -> Iterator[Running]:
    repo = copy_repo(tiny_repo, tmp_path / "repo")
    app = create_app(settings(repo, grpc_port=0, api_key=KEY, model_control="explicit",
                              load_model=[CLF]))
    with serve_with_grpc(app) as running:
        yield running


def run_client(python: Path, running: Running) -> dict[str, Any]:
    script = Path(__file__).with_name("triton_grpc_client.py")
    done = subprocess.run([str(python), str(script), running.grpc, KEY, CLF, MT],
                          capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    out: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return out


def _rows(answer: dict[str, Any]) -> set[tuple[str, str, str, str]]:
    return {(m["name"], m.get("version", ""), m.get("state", ""), m.get("reason", ""))
            for m in answer.get("models", [])}


def _status(answer: Any) -> str:
    return answer["status"] if isinstance(answer, dict) and "status" in answer else "OK"


def test_tritonclient_grpc_loads_unloads_and_reads_index_config_and_stats(
        triton_python: Path, explicit: Running) -> None:
    got = run_client(triton_python, explicit)
    assert sys.executable != str(triton_python)
    url = explicit.url
    assert _status(got["no_key"]) == "StatusCode.UNAUTHENTICATED"
    assert _rows(got["index_before"]) == {(CLF, "1", "READY", ""),
                                          (MT, "", "UNAVAILABLE", "unloaded")}
    assert _status(got["infer_unloaded"]) == "StatusCode.NOT_FOUND"
    assert _status(got["load"]) == "OK" and got["ready_loaded"]
    assert got["infer_loaded"] == {"version": "1"}
    assert {(CLF, "1", "READY", ""), (MT, "1", "READY", "")} <= _rows(got["index_loaded"])
    # afterwards: NOT_FOUND, as HTTP's 404
    assert _status(got["unload"]) == "OK" and not got["ready_after_unload"]
    assert _status(got["infer_after_unload"]) == "StatusCode.NOT_FOUND"
    assert httpx.post(f"{url}/v1/models/{MT}/translate", json={"texts": ["one"]},
                      headers=AUTH).status_code == 404
    assert _status(got["load_nope"]) == "StatusCode.NOT_FOUND"
    assert "no model folder" in got["load_nope"]["message"]
    assert _status(got["unload_nope"]) == "StatusCode.NOT_FOUND"
    assert _status(got["load_config"]) == "StatusCode.INVALID_ARGUMENT"
    assert "config" in got["load_config"]["message"]
    assert _status(got["config_nope"]) == "StatusCode.NOT_FOUND"
    assert _status(got["config_v9"]) == "StatusCode.NOT_FOUND"
    assert _status(got["stats_nope"]) == "StatusCode.NOT_FOUND"
    assert {"model_repository", "statistics", "model_configuration"} <= set(got["extensions"])

    # the same answers as HTTP's
    index = httpx.post(f"{url}/v2/repository/index", headers=AUTH).json()
    assert _rows(got["index_before"]) == {(r["name"], r["version"], r["state"], r["reason"])
                                          for r in index}
    http = httpx.get(f"{url}/v2/models/{CLF}/config", headers=AUTH).json()
    config = got["config"]["config"]
    assert (config["name"], config["platform"], config["backend"]) == (
        http["name"], http["platform"], http["backend"])
    assert config.get("max_batch_size", 0) == http["max_batch_size"]
    for ours, theirs in ((config["input"], http["input"]), (config["output"], http["output"])):
        assert [(t["name"], t["data_type"], [int(d) for d in t["dims"]]) for t in ours] == [
            (t["name"], t["data_type"], t["dims"]) for t in theirs]
    assert config["input"][0]["data_type"] == "TYPE_STRING"
    assert config["parameters"]["version"]["string_value"] == "1"
    assert json.loads(config["parameters"]["seqserve"]["string_value"]) == http["seqserve"]
    assert got["config_v1"] == got["config"]
    stats = httpx.get(f"{url}/v2/models/{CLF}/stats", headers=AUTH).json()["model_stats"]
    ours_stats = got["stats"]["model_stats"]
    assert [s["version"] for s in ours_stats] == ["1"] and got["stats_v1"] == got["stats"]
    success = ours_stats[0]["inference_stats"]["success"]
    assert int(success["count"]) == stats[0]["inference_stats"]["success"]["count"] == 3
    assert int(success["ns"]) == stats[0]["inference_stats"]["success"]["ns"] > 0
    assert int(ours_stats[0]["last_inference"]) == stats[0]["last_inference"] > 0
    every = got["stats_all"]["model_stats"]  # (asked while tiny-mt was loaded)
    assert [(s["name"], int(s["inference_stats"]["success"]["count"])) for s in every] == [
        (CLF, 3), (MT, 1)]


def _call(address: str, method: str, request: Any, response: Any) -> Any:
    with grpc.insecure_channel(address) as channel:
        rpc = channel.unary_unary(f"/{pb.INFERENCE}/{method}",
                                  request_serializer=lambda m: m.SerializeToString(),
                                  response_deserializer=response.FromString)
        return rpc(request, timeout=60)


def test_what_the_mode_does_not_allow_is_failed_precondition(tiny_repo: Path) -> None:
    request = pb.message("inference.RepositoryModelUnloadRequest")
    index = pb.message("inference.RepositoryIndexRequest")
    with serve_with_grpc(create_app(settings(tiny_repo, grpc_port=0,
                                             model_control="none"))) as running:
        with pytest.raises(grpc.RpcError) as caught:
            _call(running.grpc, "RepositoryModelUnload", request(model_name=CLF),
                  pb.RepositoryModelUnloadResponse)
        assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "'none'" in caught.value.details()
        with pytest.raises(grpc.RpcError) as caught:
            _call(running.grpc, "RepositoryIndex", index(repository_name="other"),
                  pb.RepositoryIndexResponse)
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        ready = _call(running.grpc, "RepositoryIndex", index(ready=True),
                      pb.RepositoryIndexResponse)
        assert {(m.name, m.state) for m in ready.models} == {(CLF, "READY"), (MT, "READY")}


def test_model_config_proto_is_tritons_part() -> None:
    """Every field model_config.proto declares is Triton's (number, type, cardinality,
    message or enum type); every DataType value too."""
    theirs = pytest.importorskip("tritonclient.grpc.model_config_pb2").DESCRIPTOR
    mine = pb.POOL.FindFileByName("model_config.proto")
    assert mine.package == theirs.package
    for name, message in mine.message_types_by_name.items():
        other = theirs.message_types_by_name[name]
        for f in message.fields:
            twin = other.fields_by_name[f.name]
            assert (f.number, f.type, f.is_repeated) == (twin.number, twin.type,
                                                          twin.is_repeated), f.full_name
            for kind in ("message_type", "enum_type"):
                a, b = getattr(f, kind), getattr(twin, kind)
                assert (a and a.full_name) == (b and b.full_name), f.full_name
    for name, enum in mine.enum_types_by_name.items():
        assert {v.name: v.number for v in enum.values} == {
            v.name: v.number for v in theirs.enum_types_by_name[name].values}
