"""TorchServe batch handler for a translator: beam search over each batch TorchServe forms.

Archived by the harness with common.py, the bundle's ONNX graphs, tokenizer and manifest.json
as extra files; TorchServe's frontend batches requests (batchSize, maxBatchDelay set in the
harness's config.properties) and hands the batch to `handle`, which runs one batched beam
search (common.TranslatorBundle.translate_batch: one encoder call, then one decoder step per
step over the live hypotheses of every text of the batch) on ONNX Runtime. PEER_THREADS sets
its intra-op threads (1).
"""

from __future__ import annotations

import os
from typing import Any

from common import TranslatorBundle, body_of, per_request, torchserve_entry


class TranslateHandler:
    """initialize(context) once per worker, then handle(batch, context) per batch."""

    def __init__(self) -> None:
        self.bundle: TranslatorBundle | None = None

    @property
    def ready(self) -> bool:
        return self.bundle is not None

    def initialize(self, context: Any) -> None:
        model_dir = context.system_properties["model_dir"]
        self.bundle = TranslatorBundle(model_dir, int(os.environ.get("PEER_THREADS", "1")))
        print(f"translate handler: ORT intra-op threads {os.environ.get('PEER_THREADS', '1')}",
              flush=True)

    def handle(self, data: list[dict[str, Any]], context: Any) -> list[dict[str, Any]]:
        assert self.bundle is not None
        bodies = [body_of(row.get("body") or row.get("data")) for row in data]
        texts = [str(t) for body in bodies for t in body["texts"]]
        beam = int(bodies[0].get("beam_size", 5))  # the harness sends one beam size
        return per_request(self.bundle.translate_batch(texts, beam),
                           [len(body["texts"]) for body in bodies])


handle = torchserve_entry(TranslateHandler())
"""TorchServe's module-level entry point."""
