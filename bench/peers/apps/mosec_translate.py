"""mosec with a batched beam search: the strongest translation peer found so far (issue 38).

    PEER_BUNDLE=model_repository/numbers-en-fr/1 python mosec_translate.py --port PORT \
        --address 127.0.0.1

mosec's Rust front end batches requests (PEER_MAX_BATCH 32, PEER_WAIT_MS 5) and hands each
batch to a worker process (PEER_WORKERS of them, 2 by default), which runs one batched beam
search over the whole batch on the bundle's own two ONNX graphs
(common.TranslatorBundle.translate_batch: one encoder call over the padded batch, then one
decoder_step call per step for every live hypothesis of every text; beam 5, n-best 1, no
penalties, seqserve's defaults) with PEER_THREADS (1) ONNX Runtime intra-op threads, and
answers `{"results": [{"translation", "token_ids", "score"}]}` per request: the forty-odd
lines a user writes for a translator under mosec.
"""

from __future__ import annotations

import os
from typing import Any

from common import TranslatorBundle, body_of, per_request
from mosec import Server, Worker


class Translate(Worker):
    """A batch of request bodies in, one answer per body out (same order)."""

    def __init__(self) -> None:
        super().__init__()
        self.bundle = TranslatorBundle(os.environ["PEER_BUNDLE"],
                                       int(os.environ.get("PEER_THREADS", "1")))

    def forward(self, data: list[Any]) -> list[dict[str, Any]]:
        bodies = [body_of(body) for body in data]
        texts = [str(t) for body in bodies for t in body["texts"]]
        beam = int(bodies[0].get("beam_size", 5))  # the harness sends one beam size
        return per_request(self.bundle.translate_batch(texts, beam),
                           [len(body["texts"]) for body in bodies])


if __name__ == "__main__":
    route = f"/v1/models/{os.environ.get('PEER_MODEL', 'numbers-en-fr')}/translate"
    server = Server()
    server.append_worker(Translate, num=int(os.environ.get("PEER_WORKERS", "2")),
                         max_batch_size=int(os.environ.get("PEER_MAX_BATCH", "32")),
                         max_wait_time=int(os.environ.get("PEER_WAIT_MS", "5")), route=route)
    server.run()
