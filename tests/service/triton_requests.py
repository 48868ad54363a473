"""The request a Triton client builds from a model's configuration, as perf_analyzer does:
batch 1 (the batch dimension before the dims when max_batch_size > 0), each -1 dimension 2,
texts for strings, 2 for `lengths` (the two steps), ones otherwise. numpy only: the gRPC client
script imports it inside tritonclient[grpc]'s own environment too."""

from __future__ import annotations

from typing import Any

import numpy as np

NUMPY = {"TYPE_STRING": object, "TYPE_FP32": np.float32, "TYPE_INT64": np.int64}


def request_arrays(config: dict[str, Any]) -> list[tuple[str, str, np.ndarray]]:
    """(name, OIP datatype, data) of each input the configuration declares."""
    batched = int(config.get("max_batch_size", 0)) > 0
    out = []
    for t in config["input"]:
        dims = [int(d) for d in t["dims"]]
        shape = ([1] if batched else []) + [2 if d == -1 else d for d in dims]
        kind = NUMPY[t["data_type"]]
        if kind is object:
            data = np.full(shape, "one two", dtype=object)
        else:
            data = np.full(shape, 2 if t["name"] == "lengths" else 1, dtype=kind)
        datatype = "BYTES" if kind is object else t["data_type"].removeprefix("TYPE_")
        out.append((t["name"], datatype, data))
    return out
