"""ONNX Runtime: one InferenceSession per graph, an ordered provider list, IOBinding on GPU.

ONNX Runtime silently falls back to CPU when a requested GPU provider cannot start; this
runtime compares the session's providers with the request and refuses to serve on fallback.
Given the bundle's declared signatures, it checks each session's inputs and outputs against
them (`export.contract.check_signature`, the check `seqserve verify` makes) and feeds and
returns tensors under the contract's names when the graph keeps its own
(`GraphSpec.tensor_names`).
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import onnxruntime as ort

from seqserve.export.contract import GraphSpec, check_signature, session_signature
from seqserve.models.errors import BundleError
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



def _open_session(path: Path, opts: ort.SessionOptions, providers: list[str]
                  ) -> ort.InferenceSession:
    """An InferenceSession from the graph file's bytes, not its path: ONNX Runtime then reads
    no external data file (a graph in a bundle is one file: `seqserve verify` refuses external
    data, and the server the same, so a bundle cannot make either read a file beside it or
    elsewhere)."""
    try:
        return ort.InferenceSession(path.read_bytes(), sess_options=opts, providers=providers)
    except Exception as exc:  # onnxruntime raises its own exception types
        if "external data" in str(exc).lower():
            raise RuntimeUnavailable(
                f"{path.name}: its weights are in external data files; a bundle's graph is "
                "one file (pack reads external data in)") from exc
        raise

class OnnxRuntime:
    """Runtime over ONNX Runtime sessions, one per graph file."""

    name = "onnx"

    def __init__(
        self,
        files: dict[str, Path],
        providers: list[str],
        intra_op_threads: int = 0,
        inter_op_threads: int = 0,
        signatures: dict[str, GraphSpec] | None = None,
    ) -> None:
        opts = _session_options(intra_op_threads, inter_op_threads)
        self.sessions: dict[str, ort.InferenceSession] = {}
        self._feed: dict[str, dict[str, str]] = {}
        """graph -> {contract input name: the graph's own name} (only where they differ)."""
        self._back: dict[str, dict[str, str]] = {}
        """graph -> {the graph's own output name: contract name}."""
        for graph, path in files.items():
            if not path.is_file():
                raise RuntimeUnavailable(f"{path}: graph file is missing")
            sess = _open_session(path, opts, providers)
            check_providers(providers, sess.get_providers())
            spec = (signatures or {}).get(graph)
            if spec is not None:
                try:
                    check_signature(path.name, spec, *session_signature(sess))
                except BundleError as exc:
                    raise RuntimeUnavailable(str(exc)) from exc
                names = spec.tensor_names
                self._feed[graph] = {t.name: names[t.name] for t in spec.inputs
                                     if t.name in names}
                self._back[graph] = {names[t.name]: t.name for t in spec.outputs
                                     if t.name in names}
            self.sessions[graph] = sess
        first = next(iter(self.sessions.values()))
        self.providers: list[str] = list(first.get_providers())
        self.on_gpu = any(p in GPU_PROVIDERS for p in self.providers)
        self._outputs = {g: [o.name for o in s.get_outputs()] for g, s in self.sessions.items()}

    def run(self, graph: str, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        feed, back = self._feed.get(graph), self._back.get(graph)
        if feed:
            inputs = {feed.get(k, k): v for k, v in inputs.items()}
        out = self._run(graph, inputs)
        return {back.get(k, k): v for k, v in out.items()} if back else out

    def _run(self, graph: str, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
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
