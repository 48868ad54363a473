"""Run inside the kserve client's own environment (see kserve_client.py): the KServe SDK's
V1 REST client against a server, as its users call it. Prints one JSON object.

    python kserve_v1_client.py BASE_URL MODEL NOT_READY_MODEL TEXT...
"""

from __future__ import annotations

import asyncio
import json
import sys

from kserve import InferenceRESTClient, RESTConfig


async def main(base: str, model: str, not_ready: str, texts: list[str]) -> dict[str, object]:
    client = InferenceRESTClient(RESTConfig(protocol="v1", retries=0, timeout=30))
    return {
        "model_ready": await client.is_model_ready(base, model),
        "not_ready": await client.is_model_ready(base, not_ready),
        "predict": await client.infer(base, {"instances": texts}, model_name=model),
    }


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]))))
