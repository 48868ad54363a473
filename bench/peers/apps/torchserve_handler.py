"""TorchServe handler: the bundle's TorchScript twin (classifier.pt), batches from TorchServe.

Archived by the harness with common.py, tokenizer.model and manifest.json as extra files;
TorchServe's frontend batches requests (batchSize 32, maxBatchDelay 5 ms, set in the
harness's config.properties) and hands the batch to `handle`. PEER_THREADS sets torch's
intra-op threads (1).
"""

from __future__ import annotations

import os
from typing import Any

import torch
from common import Bundle, per_request, texts_of, torchserve_entry


class LangidHandler:
    """initialize(context) once per worker, then handle(batch, context) per batch."""

    def __init__(self) -> None:
        self.bundle: Bundle | None = None
        self.model: Any = None

    @property
    def ready(self) -> bool:
        return self.bundle is not None

    def initialize(self, context: Any) -> None:
        torch.set_num_threads(int(os.environ.get("PEER_THREADS", "1")))
        model_dir = context.system_properties["model_dir"]
        self.bundle = Bundle(model_dir)
        self.model = torch.jit.load(os.path.join(model_dir, "classifier.pt")).eval()
        print(f"langid handler: torch intra-op threads {torch.get_num_threads()}", flush=True)

    def handle(self, data: list[dict[str, Any]], context: Any) -> list[dict[str, Any]]:
        assert self.bundle is not None
        texts = [texts_of(row.get("body") or row.get("data")) for row in data]
        rows = [self.bundle.encode(t) for one in texts for t in one]
        ids, lengths = self.bundle.pad(rows)  # (B, T), (B,)
        with torch.inference_mode():
            logits, _ = self.model(torch.from_numpy(ids), torch.from_numpy(lengths))  # (B, C)
        return per_request(self.bundle.results(logits.numpy()), [len(t) for t in texts])


handle = torchserve_entry(LangidHandler())
"""TorchServe's module-level entry point."""
