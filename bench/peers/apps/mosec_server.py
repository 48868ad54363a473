"""mosec: Rust HTTP front end, dynamic batching (32 rows, 5 ms), ONNX Runtime in the worker.

    PEER_BUNDLE=model_repository/langid/1 python mosec_server.py --port PORT --address 127.0.0.1

One stage: the worker decodes each request's JSON, tokenizes, pads the batch, runs ONNX
Runtime and answers per request. PEER_WORKERS worker processes (1), each with PEER_THREADS
ONNX Runtime intra-op threads (1); PEER_MAX_BATCH (32) and PEER_WAIT_MS (5) set the batcher.
"""

from __future__ import annotations

import os
from typing import Any

import onnxruntime as ort
from common import Bundle, texts_of
from mosec import Server, Worker


class Classify(Worker):
    """A batch of request bodies in, one answer per body out (same order)."""

    def __init__(self) -> None:
        super().__init__()
        self.bundle = Bundle(os.environ["PEER_BUNDLE"])
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = int(os.environ.get("PEER_THREADS", "1"))
        self.sess = ort.InferenceSession(str(self.bundle.onnx), opts,
                                         providers=["CPUExecutionProvider"])

    def forward(self, data: list[Any]) -> list[dict[str, Any]]:
        per_request = [texts_of(body) for body in data]
        rows = [self.bundle.encode(t) for texts in per_request for t in texts]
        ids, lengths = self.bundle.pad(rows)  # (B, T), (B,)
        logits, _ = self.sess.run(None, {"input_ids": ids, "lengths": lengths})  # (B, C)
        results = self.bundle.results(logits)
        answers, at = [], 0
        for texts in per_request:
            answers.append({"results": results[at: at + len(texts)]})
            at += len(texts)
        return answers


if __name__ == "__main__":
    route = f"/v1/models/{os.environ.get('PEER_MODEL', 'langid')}/classify"
    server = Server()
    server.append_worker(Classify, num=int(os.environ.get("PEER_WORKERS", "1")),
                         max_batch_size=int(os.environ.get("PEER_MAX_BATCH", "32")),
                         max_wait_time=int(os.environ.get("PEER_WAIT_MS", "5")), route=route)
    server.run()
