"""Run inside tritonclient[grpc]'s own environment (see triton_grpc_client.py): for each model
named, read its configuration over gRPC (ModelConfig), build an infer request from it as
perf_analyzer does (tests/service/triton_requests.py) and send it; for a model with
`sequence_batching`, as one whole sequence (sequence_id, start and end). Prints one JSON
object: each model's configuration (as_json) and its infer's outcome ("ok" with the output
names, or the gRPC status and message).

    python triton_config_client.py HOST:PORT MODEL...
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/service
from triton_requests import request_arrays  # noqa: E402


def request_inputs(config: dict[str, Any]) -> list[Any]:
    """The inputs a client builds from the configuration (triton_requests.py)."""
    inputs = []
    for name, datatype, data in request_arrays(config):
        inp = grpcclient.InferInput(name, list(data.shape), datatype)
        inp.set_data_from_numpy(data)
        inputs.append(inp)
    return inputs


def main(address: str, models: list[str]) -> dict[str, Any]:
    client = grpcclient.InferenceServerClient(url=address)
    out: dict[str, Any] = {}
    for model in models:
        config = client.get_model_config(model, as_json=True)["config"]
        sequence: dict[str, Any] = {}
        if "sequence_batching" in config:
            sequence = {"sequence_id": 42, "sequence_start": True, "sequence_end": True}
        try:
            result = client.infer(model, request_inputs(config), **sequence)
            outcome: Any = {"ok": sorted(o.name for o in result.get_response().outputs)}
        except InferenceServerException as exc:
            outcome = {"status": exc.status(), "message": exc.message()}
        out[model] = {"config": config, "infer": outcome}
    return out


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], sys.argv[2:])))
