"""How one model is scheduled: its batcher, decoding and session bounds together."""

from __future__ import annotations

from dataclasses import dataclass

from seqserve.service.scheduling.batcher import BatcherConfig
from seqserve.service.scheduling.sessions import SessionConfig
from seqserve.service.scheduling.work import DecodeConfig


@dataclass(frozen=True, kw_only=True)
class ModelConfig:
    """How one model is scheduled (`EngineOptions.model_config` derives it from the
    settings)."""

    batcher: BatcherConfig
    """Classifier and tagger batching."""
    decode: DecodeConfig
    """Translator decoding (its `pad_id` is replaced by the bundle's)."""
    max_tokens: int
    """Longest token row a request may bring (warm-up covers up to it)."""
    warmup: bool
    """Run the model over its length buckets before it serves."""
    sessions: SessionConfig
    """Stateful feature-sequence models: bounds of their sessions."""
    prefix_cache_bytes: int = 0
    """Language models: bytes of prefix states kept (`scheduling.prefix_cache`; 0 = off)."""
