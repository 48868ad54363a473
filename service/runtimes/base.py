"""The runtime interface the batcher and the decoding engine see (docs/contracts.md)."""

from __future__ import annotations

from typing import Protocol

import numpy as np


class Runtime(Protocol):
    """Runs one bundle's graphs by name on numpy inputs."""

    name: str
    """"onnx" | "torchscript" (a fake in tests)."""
    providers: list[str]
    """What actually runs: ORT session providers, or the torch device."""

    def run(self, graph: str, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run `graph` ("classifier", "encoder", "decoder_step") and return its outputs."""
        ...


class RuntimeUnavailable(Exception):
    """The runtime cannot serve as configured (missing file, provider fell back, no CUDA)."""
