"""Uniform runners over numpy dicts: eager/TorchScript modules and ONNX Runtime sessions.

A runner maps {input name: array} to {output name: array} for one graph, so that parity and
batch-invariance checks compare any two formats with the same code.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np

from seqserve.export.contract import GraphSpec

Arrays = dict[str, np.ndarray]
Runner = Callable[[Arrays], Arrays]


def torch_runner(module: object, spec: GraphSpec) -> Runner:
    """Runner for an eager wrapper module or a loaded TorchScript module (positional inputs)."""
    import torch

    def run(inputs: Arrays) -> Arrays:
        args = [torch.from_numpy(np.ascontiguousarray(inputs[t.name])) for t in spec.inputs]
        with torch.inference_mode():
            outs = module(*args)  # type: ignore[operator]
        return {t.name: o.detach().cpu().numpy() for t, o in zip(spec.outputs, outs, strict=True)}

    return run


def torchscript_runner(path: str | os.PathLike[str], spec: GraphSpec) -> Runner:
    """Load a TorchScript file (CPU) and wrap it as a runner."""
    import torch

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # torch.jit is deprecated in 2.13
        module = torch.jit.load(str(path), map_location="cpu")
    module.eval()
    return torch_runner(module, spec)


def onnx_runner(path: str | os.PathLike[str], spec: GraphSpec, threads: int = 1) -> Runner:
    """ONNX Runtime CPU session over one graph file, as a runner (contract names in and out,
    mapped onto the graph's own through `spec.tensor_names`)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.log_severity_level = 3
    session = ort.InferenceSession(str(Path(path)), options, providers=["CPUExecutionProvider"])
    own = spec.tensor_names  # contract name -> the graph's own name (packed graphs)
    names = [t.name for t in spec.outputs]
    fetch = [own.get(n, n) for n in names]

    def run(inputs: Arrays) -> Arrays:
        feed = {own.get(t.name, t.name): np.ascontiguousarray(inputs[t.name])
                for t in spec.inputs}
        return dict(zip(names, session.run(fetch, feed), strict=True))

    return run
