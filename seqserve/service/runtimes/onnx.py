"""ONNX Runtime: one InferenceSession per graph, an ordered provider list, IOBinding on GPU.

ONNX Runtime silently falls back to CPU when a requested GPU provider cannot start; this
runtime compares the session's providers with the request and refuses to serve on fallback.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import onnxruntime as ort

from seqserve.service.runtimes.base import RuntimeUnavailable

log = logging.getLogger("seqserve.runtime")

GPU_PROVIDERS = ("TensorrtExecutionProvider", "CUDAExecutionProvider")


def _session_options(intra_op_threads: int, inter_op_threads: int) -> ort.SessionOptions:
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    if intra_op_threads:
        opts.intra_op_num_threads = intra_op_threads
    if inter_op_threads:
        opts.inter_op_num_threads = inter_op_threads
    opts.log_severity_level = 3  # errors only; fallback is reported by us
    return opts


def check_providers(requested: list[str], actual: list[str]) -> None:
    """Raise RuntimeUnavailable when a requested GPU provider is not in the session."""
    missing = [p for p in requested if p in GPU_PROVIDERS and p not in actual]
    if missing:
        raise RuntimeUnavailable(
            f"requested provider(s) {missing} are not active: the session runs on {actual} "
            f"(this onnxruntime build offers {ort.get_available_providers()})"
        )


class OnnxRuntime:
    """Runtime over ONNX Runtime sessions, one per graph file."""

    name = "onnx"

    def __init__(
        self,
        files: dict[str, Path],
        providers: list[str],
        intra_op_threads: int = 0,
        inter_op_threads: int = 0,
    ) -> None:
        opts = _session_options(intra_op_threads, inter_op_threads)
        self.sessions: dict[str, ort.InferenceSession] = {}
        for graph, path in files.items():
            if not path.is_file():
                raise RuntimeUnavailable(f"{path}: graph file is missing")
            sess = ort.InferenceSession(str(path), sess_options=opts, providers=providers)
            check_providers(providers, sess.get_providers())
            self.sessions[graph] = sess
        first = next(iter(self.sessions.values()))
        self.providers: list[str] = list(first.get_providers())
        self.on_gpu = any(p in GPU_PROVIDERS for p in self.providers)
        self._outputs = {g: [o.name for o in s.get_outputs()] for g, s in self.sessions.items()}

    def run(self, graph: str, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        sess = self.sessions[graph]
        names = self._outputs[graph]
        if not self.on_gpu:
            return dict(zip(names, sess.run(names, inputs), strict=True))
        binding = sess.io_binding()  # inputs copied to the device once, outputs stay there
        for name, array in inputs.items():
            binding.bind_cpu_input(name, np.ascontiguousarray(array))
        for name in names:
            binding.bind_output(name, "cuda")
        sess.run_with_iobinding(binding)
        return dict(zip(names, binding.copy_outputs_to_cpu(), strict=True))
