"""Per-request FastAPI + ONNX Runtime generation with SSE: what a user writes first.

    PEER_BUNDLE=model_repository/text-lm/1 python bench/lm_peer.py PORT

The LM counterpart of bench/peers/apps/fastapi_server.py, for bench/bench_lm.py: one
`prefill` call for the prompt, then one `lm_step` call per token, batch 1, in a sync generator
that Starlette iterates in its thread pool (so requests compute side by side, each on its own
thread, with PEER_THREADS intra-op threads per call, 1 by default). It answers
POST /v1/models/{name}/generate with seqserve's stream format (`data: {"prompt_index",
"index", "text"}` per token, a finish event, `data: {"usage": ...}`, `data: [DONE]`), so the
same `seqserve loadtest --task generate --stream` drives both servers. It imports nothing from
seqserve: the bundle's manifest.json, tokenizer.model and the two ONNX graphs only.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnxruntime as ort
import sentencepiece as spm
import uvicorn
from fastapi import FastAPI
from fastapi.responses import StreamingResponse
from pydantic import BaseModel


class Body(BaseModel):
    prompt: str
    max_new_tokens: int = 64
    temperature: float = 1.0
    stream: bool = True


def sse(data: object) -> bytes:
    return f"data: {data if isinstance(data, str) else json.dumps(data)}\n\n".encode()


def build_app(folder: Path, threads: int) -> FastAPI:
    manifest = json.loads((folder / "manifest.json").read_text())
    tok = manifest["tokenizer"]
    bos, eos = int(tok["bos_id"]), int(tok["eos_id"])
    sp = spm.SentencePieceProcessor(model_file=str(folder / "tokenizer.model"))
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    prefill = ort.InferenceSession(str(folder / "prefill.onnx"), opts,
                                   providers=["CPUExecutionProvider"])
    step = ort.InferenceSession(str(folder / "lm_step.onnx"), opts,
                                providers=["CPUExecutionProvider"])
    app = FastAPI()

    def draw(log_probs: np.ndarray, temperature: float, rng: np.random.Generator) -> int:
        if temperature <= 0:
            return int(log_probs.argmax())
        z = log_probs.astype(np.float64) / temperature
        p = np.exp(z - z.max())
        return int(rng.choice(len(p), p=p / p.sum()))

    def generate(body: Body) -> Iterator[bytes]:
        ids = [bos, *sp.encode(body.prompt)]
        state, log_probs = prefill.run(["state", "log_probs"], {
            "input_ids": np.array([ids], dtype=np.int64),
            "lengths": np.array([len(ids)], dtype=np.int64)})
        rng = np.random.default_rng()
        out: list[int] = []
        text, finish = "", "length"
        token = draw(log_probs[0, -1], body.temperature, rng)
        while True:
            if token == eos:
                finish = "eos"
                break
            out.append(token)
            new = sp.decode(out)
            if len(new) > len(text):
                yield sse({"prompt_index": 0, "index": 0, "text": new[len(text):]})
                text = new
            if len(out) >= body.max_new_tokens:
                break
            state, log_probs = step.run(["new_state", "log_probs"], {
                "prev_ids": np.array([token], dtype=np.int64), "state": state})
            token = draw(log_probs[0], body.temperature, rng)
        yield sse({"prompt_index": 0, "index": 0, "finish_reason": finish})
        yield sse({"usage": {"prompt_tokens": len(ids) - 1, "completion_tokens": len(out)}})
        yield sse("[DONE]")

    @app.post("/v1/models/{name}/generate")
    def generate_route(name: str, body: Body) -> StreamingResponse:
        return StreamingResponse(generate(body), media_type="text/event-stream")

    return app


if __name__ == "__main__":
    app = build_app(Path(os.environ["PEER_BUNDLE"]), int(os.environ.get("PEER_THREADS", "1")))
    uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning",
                access_log=False)
