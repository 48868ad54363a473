"""`EngineOptions`: everything an engine is started with, as plain JSON-able values."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from seqserve.service.runtimes.base import RuntimeSpec
from seqserve.service.scheduling.batcher import BatcherConfig
from seqserve.service.scheduling.decoding import DecodeConfig
from seqserve.service.scheduling.models import ModelConfig

OPTIONS_ENV = "SEQSERVE_ENGINE_OPTIONS"
"""The engine process reads its `EngineOptions` (JSON) from this variable."""
ADDRESS_ENV = "SEQSERVE_ENGINE_ADDRESS"
"""The engine's ZeroMQ address (ipc://...), for the engine and every API process."""


@dataclass(frozen=True)
class EngineOptions:
    """How the engine loads and schedules every bundle of a repository."""

    repo: str = "model_repository"
    """Model repository folder."""
    runtime: RuntimeSpec = field(default_factory=RuntimeSpec)
    """Which runtime runs the graphs, and its threads (per instance)."""
    instances: int = 1
    """Runtime instances per batched model: batches in flight at once (Triton's instance
    groups); each instance has its own runtime session."""
    max_batch_size: int = 16
    """Most rows per batch (also the translator's admission batch)."""
    max_batch_tokens: int = 4096
    """Padded-token budget per batch."""
    max_wait_s: float = 0.002
    """Longest a batch waits to fill."""
    batch_overhead_tokens: float = 64.0
    """Fixed cost of a batch in padded tokens (length grouping)."""
    queue_size: int = 256
    """Most rows (texts) waiting per model."""
    retry_after_s: float = 1.0
    """Retry-After of the engine's 429 and 503."""
    max_queue_wait_s: float | None = None
    """Admission by expected wait (None: the queue bounds only)."""
    max_tokens: int = 256
    """Longest text in tokens (capped by each bundle's own limit)."""
    max_live_hypotheses: int = 1024
    """Translators: live-hypothesis cap."""
    decode_groups: int = 2
    """Translators: decoder-step groups that take turns."""
    warmup: bool = True
    """Warm every model up before it serves."""

    def model_config(self, max_tokens: int) -> ModelConfig:
        """How a model whose texts have at most `max_tokens` tokens is scheduled."""
        batcher = BatcherConfig(
            max_batch_size=self.max_batch_size,
            max_batch_tokens=max(self.max_batch_tokens, max_tokens),
            max_wait_s=self.max_wait_s, queue_size=self.queue_size,
            retry_after_s=self.retry_after_s, max_queue_wait_s=self.max_queue_wait_s,
            overhead_tokens=self.batch_overhead_tokens)
        engine = DecodeConfig(
            max_live_hypotheses=self.max_live_hypotheses, max_queue=self.queue_size,
            max_admit=self.max_batch_size, groups=self.decode_groups,
            retry_after_s=self.retry_after_s, max_queue_wait_s=self.max_queue_wait_s)
        return ModelConfig(batcher, engine, max_tokens, self.warmup)

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> EngineOptions:
        data: dict[str, Any] = json.loads(text)
        spec = data.pop("runtime")
        spec["providers"] = tuple(spec.get("providers") or ())
        return cls(runtime=RuntimeSpec(**spec), **data)
