"""Run inside tritonclient[grpc]'s own environment (its grpc extra pins protobuf < 7; the
server's environment keeps protobuf 7): the repository, configuration and statistics calls of
`tritonclient.grpc` against a server, as its users make them. Prints one JSON object: each
call's answer (as_json) or its gRPC status and message.

    python triton_grpc_client.py HOST:PORT API_KEY LOADED UNLOADED
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import Any

import numpy as np
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException


def attempt(call: Callable[[], Any]) -> Any:
    """The call's answer, or {"status": "StatusCode.X", "message": ...}."""
    try:
        return call()
    except InferenceServerException as exc:
        return {"status": exc.status(), "message": exc.message()}


def main(address: str, key: str, loaded: str, unloaded: str) -> dict[str, Any]:
    client = grpcclient.InferenceServerClient(url=address)
    auth = {"authorization": f"Bearer {key}"}

    def infer(model: str, text: str) -> Any:
        inp = grpcclient.InferInput("text", [1], "BYTES")
        inp.set_data_from_numpy(np.array([text], dtype=object))
        result = client.infer(model, [inp], headers=auth)
        return {"version": result.get_response().model_version}

    out: dict[str, Any] = {
        "no_key": attempt(lambda: client.get_model_repository_index()),
        "index_before": attempt(lambda: client.get_model_repository_index(
            headers=auth, as_json=True)),
        "infer_unloaded": attempt(lambda: infer(unloaded, "one")),
    }
    out["load"] = attempt(lambda: client.load_model(unloaded, headers=auth))
    out["infer_loaded"] = attempt(lambda: infer(unloaded, "twenty one"))
    out["ready_loaded"] = client.is_model_ready(unloaded, headers=auth)
    out["index_loaded"] = attempt(lambda: client.get_model_repository_index(
        headers=auth, as_json=True))
    out["index_ready"] = attempt(lambda: client.get_model_repository_index(
        headers=auth, as_json=True))
    for _ in range(3):
        infer(loaded, "one two three")
    out["config"] = attempt(lambda: client.get_model_config(loaded, headers=auth,
                                                            as_json=True))
    out["config_v1"] = attempt(lambda: client.get_model_config(loaded, "1", headers=auth,
                                                               as_json=True))
    out["stats"] = attempt(lambda: client.get_inference_statistics(loaded, headers=auth,
                                                                   as_json=True))
    out["stats_v1"] = attempt(lambda: client.get_inference_statistics(
        loaded, "1", headers=auth, as_json=True))
    out["stats_all"] = attempt(lambda: client.get_inference_statistics(headers=auth,
                                                                       as_json=True))
    out["unload"] = attempt(lambda: client.unload_model(unloaded, headers=auth))
    out["infer_after_unload"] = attempt(lambda: infer(unloaded, "one"))
    out["ready_after_unload"] = client.is_model_ready(unloaded, headers=auth)
    out["load_nope"] = attempt(lambda: client.load_model("nope", headers=auth))
    out["unload_nope"] = attempt(lambda: client.unload_model("nope", headers=auth))
    out["load_config"] = attempt(lambda: client.load_model(
        loaded, headers=auth, config=json.dumps({"max_batch_size": 4})))
    out["config_nope"] = attempt(lambda: client.get_model_config("nope", headers=auth))
    out["config_v9"] = attempt(lambda: client.get_model_config(loaded, "9", headers=auth))
    out["stats_nope"] = attempt(lambda: client.get_inference_statistics("nope", headers=auth))
    out["extensions"] = list(client.get_server_metadata(headers=auth).extensions)
    return out


if __name__ == "__main__":
    print(json.dumps(main(*sys.argv[1:5])))
