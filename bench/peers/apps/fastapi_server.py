"""Per-request FastAPI + ONNX Runtime: no batching, what a user writes in 30 lines.

    PEER_BUNDLE=model_repository/langid/1 python fastapi_server.py PORT

A sync route, so FastAPI runs it in its thread pool: with 1 ONNX Runtime thread per call,
two requests compute at once on two cores. PEER_THREADS sets the intra-op threads (1),
PEER_WORKERS the uvicorn worker processes (1; each loads its own session).
"""

from __future__ import annotations

import os
import sys

import numpy as np
import onnxruntime as ort
import uvicorn
from common import Bundle
from fastapi import FastAPI
from pydantic import BaseModel


class Body(BaseModel):
    texts: list[str]


def build_app(bundle: Bundle, threads: int) -> FastAPI:
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    sess = ort.InferenceSession(str(bundle.onnx), opts, providers=["CPUExecutionProvider"])
    app = FastAPI()

    @app.post("/v1/models/{name}/classify")
    def classify(name: str, body: Body) -> dict:
        results = []
        for text in body.texts:  # one model call per text: no batching
            ids = bundle.encode(text)
            logits, _ = sess.run(None, {"input_ids": np.array([ids], dtype=np.int64),
                                        "lengths": np.array([len(ids)], dtype=np.int64)})
            results += bundle.results(logits)
        return {"model": name, "results": results}

    return app


def create_app() -> FastAPI:
    """The app from the environment (uvicorn's factory: every worker process calls it)."""
    return build_app(Bundle(os.environ["PEER_BUNDLE"]), int(os.environ.get("PEER_THREADS", "1")))


if __name__ == "__main__":
    uvicorn.run("fastapi_server:create_app", factory=True, host="127.0.0.1",
                port=int(sys.argv[1]), workers=int(os.environ.get("PEER_WORKERS", "1")),
                log_level="warning", access_log=False)
