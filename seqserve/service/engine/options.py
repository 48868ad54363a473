"""`EngineOptions`: everything an engine is started with, as plain JSON-able values.

Every value comes from `Settings.engine_options()`, once the composition root
(server/composition.py) resolved the layout's counts: nothing here has a default of its own
that could disagree with the settings. The engine process reads them as
JSON from SEQSERVE_ENGINE_OPTIONS and nothing else of its environment but the address.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any, Literal

from seqserve.service.core.process import ProcessSettings
from seqserve.service.runtimes.base import RuntimeSpec
from seqserve.service.scheduling.batcher import BatcherConfig
from seqserve.service.scheduling.config import ModelConfig
from seqserve.service.scheduling.decoding import DecodeConfig
from seqserve.service.scheduling.sessions import SessionConfig

OPTIONS_ENV = "SEQSERVE_ENGINE_OPTIONS"
"""The engine process reads its `EngineOptions` (JSON) from this variable."""
ADDRESS_ENV = "SEQSERVE_ENGINE_ADDRESS"
"""The engine's ZeroMQ address (ipc://...), for the engine and every API process."""


@dataclass(frozen=True, kw_only=True)
class EngineOptions:
    """How the engine loads and schedules every bundle of a repository (see `Settings` for
    what each value means and its default)."""

    repo: str
    """Model repository folder."""
    bundles: Literal["all", "sessions"]
    """Which of its bundle versions the engine loads: all, or (the hybrid layout) only those
    that keep sessions (`loading.keeps_sessions`); the API processes load the others."""
    runtime: RuntimeSpec
    """Which runtime runs the graphs, and its threads (per instance)."""
    instances: int
    """Runtime instances per batched model: batches in flight at once (Triton's instance
    groups); each instance has its own runtime session."""
    max_batch_size: int
    """Most rows per batch (also the translator's admission batch)."""
    max_batch_tokens: int
    """Padded-token budget per batch."""
    max_wait_s: float
    """Longest a batch waits to fill while another instance is busy."""
    batch_overhead_tokens: float
    """Fixed cost of a batch in padded tokens (length grouping)."""
    queue_size: int
    """Most rows (texts) waiting per model."""
    retry_after_s: float
    """Retry-After of the engine's 429 and 503."""
    max_queue_wait_s: float | None
    """Admission by expected wait (None: the queue bounds only)."""
    max_tokens: int
    """Longest text in tokens (capped by each bundle's own limit)."""
    max_live_hypotheses: int
    """Translators: live-hypothesis cap."""
    decode_admit_steps: int
    """Translators: decoder steps arriving sources may wait to be encoded together."""
    decode_groups: int
    """Translators: decoder-step groups that take turns."""
    runtime_calls: Literal["loop", "steps", "threads"]
    """Where runtime calls run: on the event loop's thread (loop; steps: the decode loops'
    only), or a thread per instance and lane."""
    warmup: bool
    """Warm every model up before it serves."""
    drain_timeout_s: float
    """On SIGTERM, how long admitted work may take before the engine process exits."""
    max_sessions: int
    """Feature-sequence models with state: most live sessions per model version."""
    session_idle_timeout_s: float
    """A session idle this long expires."""
    process: ProcessSettings
    """Logging and switch interval of the engine process (the same as the API processes')."""
    model_control: Literal["none", "poll", "explicit"]
    """How the model table changes while serving; at start every version each model's policy
    serves is loaded (explicit: of `load_models` only; `engine.scan.startup_bundles`)."""
    load_models: tuple[str, ...]
    """explicit: the models loaded at start."""
    trusted_keys: str | None
    """A folder of public keys: load only bundles signed by one of them (None: any)."""
    prefix_cache_bytes: int = 0
    """Language models: bytes of prompt-prefix states kept per model version."""
    max_sessions_per_key: int = 0
    """Feature-sequence models with state: most live sessions per owner (0: no quota)."""

    def model_config(self, max_tokens: int) -> ModelConfig:
        """How a model whose texts have at most `max_tokens` tokens is scheduled."""
        batcher = BatcherConfig(
            max_batch_size=self.max_batch_size,
            max_batch_tokens=max(self.max_batch_tokens, max_tokens),
            max_wait_s=self.max_wait_s, queue_size=self.queue_size,
            retry_after_s=self.retry_after_s, max_queue_wait_s=self.max_queue_wait_s,
            overhead_tokens=self.batch_overhead_tokens,
            runtime_calls="loop" if self.runtime_calls == "loop" else "threads")
        decode = DecodeConfig(
            max_live_hypotheses=self.max_live_hypotheses, max_queue=self.queue_size,
            max_admit=self.max_batch_size, groups=self.decode_groups,
            retry_after_s=self.retry_after_s, max_queue_wait_s=self.max_queue_wait_s,
            runtime_calls="threads" if self.runtime_calls == "threads" else "loop",
            admit_steps=self.decode_admit_steps)
        sessions = SessionConfig(max_sessions=self.max_sessions,
                                 idle_timeout_s=self.session_idle_timeout_s,
                                 retry_after_s=self.retry_after_s,
                                 max_per_owner=self.max_sessions_per_key)
        return ModelConfig(batcher=batcher, decode=decode, max_tokens=max_tokens,
                           warmup=self.warmup, sessions=sessions,
                           prefix_cache_bytes=self.prefix_cache_bytes)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON data (what `to_json` writes and the engine reports in `State`)."""
        data = asdict(self)
        data["runtime"]["providers"] = list(self.runtime.providers)
        data["load_models"] = list(self.load_models)
        return data

    def to_json(self) -> str:
        return json.dumps(self.to_dict())

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> EngineOptions:
        data = dict(data)
        spec = dict(data.pop("runtime"))
        spec["providers"] = tuple(spec.get("providers") or ())
        process = ProcessSettings(**data.pop("process"))
        data["load_models"] = tuple(data.get("load_models", ()))
        return cls(runtime=RuntimeSpec(**spec), process=process, **data)

    @classmethod
    def from_json(cls, text: str) -> EngineOptions:
        return cls.from_dict(json.loads(text))
