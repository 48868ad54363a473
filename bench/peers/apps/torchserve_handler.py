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
from common import Bundle, texts_of


class LangidHandler:
    """initialize(context) once per worker, then handle(batch, context) per batch."""

    def __init__(self) -> None:
        self.bundle: Bundle | None = None
        self.model: Any = None

    def initialize(self, context: Any) -> None:
        torch.set_num_threads(int(os.environ.get("PEER_THREADS", "1")))
        model_dir = context.system_properties["model_dir"]
        self.bundle = Bundle(model_dir)
        self.model = torch.jit.load(os.path.join(model_dir, "classifier.pt")).eval()
        print(f"langid handler: torch intra-op threads {torch.get_num_threads()}", flush=True)

    def handle(self, data: list[dict[str, Any]], context: Any) -> list[dict[str, Any]]:
        assert self.bundle is not None
        per_request = [texts_of(row.get("body") or row.get("data")) for row in data]
        rows = [self.bundle.encode(t) for texts in per_request for t in texts]
        ids, lengths = self.bundle.pad(rows)  # (B, T), (B,)
        with torch.inference_mode():
            logits, _ = self.model(torch.from_numpy(ids), torch.from_numpy(lengths))  # (B, C)
        results = self.bundle.results(logits.numpy())
        answers, at = [], 0
        for texts in per_request:
            answers.append({"results": results[at: at + len(texts)]})
            at += len(texts)
        return answers


_service = LangidHandler()


def handle(data: list[dict[str, Any]] | None, context: Any) -> list[dict[str, Any]] | None:
    """TorchServe's module-level entry point: the first call (data None) initializes."""
    if _service.bundle is None:
        _service.initialize(context)
    if data is None:
        return None
    return _service.handle(data, context)
