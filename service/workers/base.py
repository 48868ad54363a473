"""What the repository knows of a model worker, and the per-request call context.

A worker serves one loaded bundle version of one task. The repository builds it with
`WORKERS[task](ctx)` (see `service.workers`), awaits `start()` (which warms up) before the
model is ready, and awaits `stop(timeout)` at shutdown (drain, not cancel).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Protocol, TypeVar

from export.manifest import Manifest
from models.tokenizer import Tokenizer
from service.batcher import Timing
from service.errors import BadRequest, ClientGone, DeadlineExceeded
from service.metrics import Metrics
from service.runtimes.base import Runtime
from service.settings import Settings

T = TypeVar("T")


@dataclass
class WorkerContext:
    """Everything a worker is built from."""

    name: str
    version: int
    path: Path
    manifest: Manifest
    runtime: Runtime
    tokenizer: Tokenizer
    settings: Settings
    metrics: Metrics


@dataclass
class V2Tensor:
    """One decoded OIP tensor (inputs and outputs): data flattened row-major."""

    name: str
    datatype: str
    shape: list[int]
    data: list[Any]


def v2_texts(inputs: dict[str, V2Tensor]) -> list[str]:
    """The texts of an OIP infer request: exactly one input `text`, BYTES, shape [n], n >= 1,
    each element a str or UTF-8 bytes (every task's `v2_infer` takes its texts this way)."""
    text = inputs.get("text")
    if text is None or len(inputs) != 1:
        raise BadRequest(f"expected exactly one input named 'text', got {sorted(inputs)}")
    if text.datatype != "BYTES" or len(text.shape) != 1:
        raise BadRequest("input 'text' must be BYTES with shape [n]")
    texts = [_as_text(x, i) for i, x in enumerate(text.data)]
    if not texts:
        raise BadRequest("input 'text' is empty")
    return texts


def _as_text(x: object, i: int) -> str:
    if isinstance(x, str):
        return x
    if isinstance(x, bytes):
        try:
            return x.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise BadRequest(f"text[{i}] is not valid UTF-8") from exc
    raise BadRequest(f"text[{i}] must be a string, got {type(x).__name__}")


class ModelWorker(Protocol):
    """A served model version. Translators (service.engine) implement it as well."""

    task: ClassVar[str]

    def __init__(self, ctx: WorkerContext) -> None: ...

    async def start(self) -> None:
        """Start background tasks and warm up; ready once it returns."""
        ...

    async def stop(self, timeout: float) -> bool:
        """Refuse new work, finish admitted work within `timeout`; True when all finished."""
        ...

    def describe(self) -> dict[str, Any]:
        """Task-specific facts for GET /v1/models/{name} (labels, limits)."""
        ...

    def v2_signature(self) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """OIP metadata `inputs` and `outputs`: [{name, datatype, shape}]."""
        ...

    async def v2_infer(self, inputs: dict[str, V2Tensor], call: Call) -> list[V2Tensor]:
        """OIP infer on decoded inputs; raises BadRequest for wrong names/types/shapes."""
        ...


@dataclass
class Call:
    """One HTTP request's deadline, disconnect signal and where its time went."""

    deadline: float
    """time.monotonic() at which the request gives up (504)."""
    disconnected: asyncio.Event = field(default_factory=asyncio.Event)
    """Set when the client went away; queued rows are then dropped."""
    parameters: dict[str, Any] = field(default_factory=dict)
    """OIP request-level `parameters` (v2 infer), minus the binary-extension keys."""
    queue_s: float = 0.0
    compute_s: float = 0.0
    batch_sizes: list[int] = field(default_factory=list)

    def remaining(self) -> float:
        return self.deadline - time.monotonic()

    def record(self, timing: Timing) -> None:
        self.queue_s = max(self.queue_s, timing.queue_s)
        self.compute_s = max(self.compute_s, timing.compute_s)
        self.batch_sizes.append(timing.batch_size)

    async def wait_all(self, futures: list[asyncio.Future[tuple[T, Timing]]]) -> list[T]:
        """Await every row; on deadline or disconnect cancel the rest (the batcher drops them)."""
        gathered: asyncio.Future[Any] = asyncio.gather(*futures)
        gone: asyncio.Future[Any] = asyncio.ensure_future(self.disconnected.wait())
        try:
            done, _ = await asyncio.wait(
                {gathered, gone}, timeout=max(self.remaining(), 0.0),
                return_when=asyncio.FIRST_COMPLETED,
            )
            if gathered in done:
                pairs = gathered.result()
                for _, timing in pairs:
                    self.record(timing)
                return [result for result, _ in pairs]
            if gone in done:
                raise ClientGone("client disconnected")
            raise DeadlineExceeded(
                f"request deadline passed ({self.remaining():.3f}s left); the work was dropped"
            )
        finally:
            gone.cancel()
            gathered.add_done_callback(_retrieve)
            for f in futures:
                f.cancel()  # rows still queued are dropped by the batcher


def _retrieve(f: asyncio.Future[Any]) -> None:
    """Mark a future's exception as seen (we already answered the request)."""
    if not f.cancelled():
        f.exception()
