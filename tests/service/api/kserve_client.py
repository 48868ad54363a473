"""Run inside the kserve client's own environment (kserve pins protobuf < 7 and psutil < 6
and pulls kubernetes and pandas: none of it belongs beside the server): the KServe SDK's
v2 REST client against a server, as its users call it. Prints one JSON object.

    python kserve_client.py BASE_URL MODEL
"""

from __future__ import annotations

import asyncio
import json
import sys

import numpy as np
from kserve import InferenceRESTClient, InferInput, InferRequest, RESTConfig


async def main(base: str, model: str) -> dict[str, object]:
    client = InferenceRESTClient(RESTConfig(protocol="v2", retries=0, timeout=30))
    out: dict[str, object] = {
        "live": await client.is_server_live(base),
        "ready": await client.is_server_ready(base),
        "model_ready": await client.is_model_ready(base, model),
    }
    texts = np.array(["one two three", "cent"], dtype=object)
    for binary in (False, True):
        inp = InferInput("text", [2], "BYTES")
        inp.set_data_from_numpy(texts, binary_data=binary)
        res = await client.infer(base, InferRequest(model, [inp], request_id="sdk"),
                                 model_name=model)
        out["binary" if binary else "json"] = {
            o.name: np.asarray(o.as_numpy()).tolist() if o.datatype != "BYTES" else
            [x.decode() if isinstance(x, bytes) else x for x in o.as_numpy().reshape(-1)]
            for o in res.outputs}
    try:
        inp = InferInput("text", [1], "BYTES")
        inp.set_data_from_numpy(np.array(["cent"], dtype=object), binary_data=False)
        await client.infer(base, InferRequest("another-model", [inp]), model_name=model)
        out["mismatch"] = "accepted"
    except Exception as exc:  # httpx.HTTPStatusError
        out["mismatch"] = str(exc)
    return out


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main(sys.argv[1], sys.argv[2]))))
