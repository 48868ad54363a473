"""Per-request FastAPI + ONNX Runtime beam search: what a user writes first for a translator.

    PEER_BUNDLE=model_repository/numbers-en-fr/1 python translate_server.py PORT

A sync route (FastAPI's thread pool), one beam search (beam 5, common.TranslatorBundle) per
text, no batching across requests. PEER_THREADS sets the ONNX Runtime intra-op threads (1),
PEER_WORKERS the uvicorn worker processes (1).
"""

from __future__ import annotations

import os
import sys

import uvicorn
from common import TranslatorBundle
from fastapi import FastAPI
from pydantic import BaseModel


class Body(BaseModel):
    texts: list[str]
    beam_size: int = 5


def build_app(bundle: TranslatorBundle) -> FastAPI:
    app = FastAPI()

    @app.post("/v1/models/{name}/translate")
    def translate(name: str, body: Body) -> dict:
        return {"model": name,
                "results": [bundle.translate(t, body.beam_size) for t in body.texts]}

    return app


def create_app() -> FastAPI:
    """The app from the environment (uvicorn's factory: every worker process calls it)."""
    return build_app(TranslatorBundle(os.environ["PEER_BUNDLE"],
                                      int(os.environ.get("PEER_THREADS", "1"))))


if __name__ == "__main__":
    uvicorn.run("translate_server:create_app", factory=True, host="127.0.0.1",
                port=int(sys.argv[1]), workers=int(os.environ.get("PEER_WORKERS", "1")),
                log_level="warning", access_log=False)
