"""TorchScript runtime on cpu or cuda. Importing this module imports torch: only
`load_runtime` does, and only when `--runtime torchscript` was chosen."""

from __future__ import annotations

import contextlib
from pathlib import Path

import numpy as np
import torch

from seqserve.export.manifest import Manifest
from seqserve.service.runtimes.base import RuntimeUnavailable


class TorchScriptRuntime:
    """Runtime over `torch.jit` modules; inputs positional in manifest order."""

    name = "torchscript"

    def __init__(
        self,
        files: dict[str, Path],
        manifest: Manifest,
        device: str = "cpu",
        intra_op_threads: int = 0,
        inter_op_threads: int = 0,
    ) -> None:
        if device == "cuda" and not torch.cuda.is_available():
            raise RuntimeUnavailable("device cuda requested but torch sees no CUDA device")
        if intra_op_threads:
            torch.set_num_threads(intra_op_threads)
        if inter_op_threads:
            with contextlib.suppress(RuntimeError):  # settable once per process only
                torch.set_num_interop_threads(inter_op_threads)
        if device == "cuda":
            # fp32 means fp32: cuDNN's RNN kernels use TF32 by default, which moved logits by
            # ~3e-3 against the CPU on an H200; parity with the exported reference wins.
            torch.backends.cudnn.allow_tf32 = False
            torch.backends.cuda.matmul.allow_tf32 = False
        # Every request brings a new (batch, seq) shape: the profiling executor's shape
        # specialisations only cost re-optimisation spikes (37 ms vs 10 ms worst call over 300
        # mixed shapes of the langid classifier, same p50), so it stays off (process-wide).
        torch._C._set_graph_executor_optimize(False)
        self.device = torch.device(device)
        self.providers: list[str] = [str(self.device)]
        self.modules = {}
        for graph, path in files.items():
            if not path.is_file():
                raise RuntimeUnavailable(f"{path}: graph file is missing")
            self.modules[graph] = torch.jit.load(str(path), map_location=self.device).eval()
        self._inputs = {g: [t.name for t in s.inputs] for g, s in manifest.graphs.items()}
        self._outputs = {g: [t.name for t in s.outputs] for g, s in manifest.graphs.items()}

    def run(self, graph: str, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        args = [
            torch.from_numpy(np.ascontiguousarray(inputs[n])).to(self.device)
            for n in self._inputs[graph]
        ]
        with torch.inference_mode():
            out = self.modules[graph](*args)
        if isinstance(out, torch.Tensor):
            out = (out,)
        return {
            n: t.detach().cpu().numpy() for n, t in zip(self._outputs[graph], out, strict=True)
        }
