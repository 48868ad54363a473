"""The runtime interface the batcher and the decode scheduler see (docs/contracts.md)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol

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


@dataclass(frozen=True)
class RuntimeSpec:
    """Which runtime to build and how (`Settings.runtime_spec()` gives the server's; no
    defaults here that could disagree with the settings)."""

    kind: Literal["onnx", "torchscript"]
    """Graph format that runs: ONNX Runtime or TorchScript (imports torch)."""
    device: Literal["cpu", "cuda"]
    """Device; with onnx it picks the default provider list."""
    providers: tuple[str, ...]
    """Ordered ONNX Runtime providers; empty: the default for `device`."""
    intra_op_threads: int
    """Threads inside one operator (0 = runtime default)."""
    inter_op_threads: int
    """Threads across operators (0 = runtime default)."""

    def ort_providers(self) -> list[str]:
        """The ONNX Runtime provider list: as given, or the default for `device`."""
        if self.providers:
            return list(self.providers)
        if self.device == "cuda":
            return ["CUDAExecutionProvider", "CPUExecutionProvider"]
        return ["CPUExecutionProvider"]
