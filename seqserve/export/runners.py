"""Uniform runners over numpy dicts: eager/TorchScript modules and ONNX Runtime sessions.

A runner maps {input name: array} to {output name: array} for one graph, so that parity and
batch-invariance checks compare any two formats with the same code.
"""

from __future__ import annotations

import contextlib
import os
import warnings
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from seqserve.export.contract import GraphSpec
from seqserve.models.errors import BundleError

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


def bundle_runners(root: Path, specs: Mapping[str, GraphSpec],
                   eager: Mapping[str, Any] | None = None,
                   order: tuple[str, ...] = ("eager", "onnx", "torchscript")
                   ) -> dict[str, dict[str, Runner]]:
    """format -> graph -> runner over a bundle folder's graph files (`specs` name them) and,
    as format "eager", the modules in `eager` (graph -> module; the parity reference at
    export and pack time). Formats come in `order` (the parity report lists them so); a file
    that does not load is a BundleError naming its graph."""
    found: dict[str, dict[str, Runner]] = {}
    for graph, spec in specs.items():
        module = (eager or {}).get(graph)
        try:
            if module is not None:
                found.setdefault("eager", {})[graph] = torch_runner(module, spec)
            if spec.onnx:
                found.setdefault("onnx", {})[graph] = onnx_runner(root / spec.onnx, spec)
            if spec.torchscript:
                found.setdefault("torchscript", {})[graph] = torchscript_runner(
                    root / spec.torchscript, spec)
        except Exception as exc:  # a corrupt-but-rehashed file fails to load
            raise BundleError(f"{root}: graph {graph} does not load: {exc}") from exc
    return {fmt: found[fmt] for fmt in order if fmt in found}


@contextlib.contextmanager
def torch_threads(n: int) -> Iterator[None]:
    """torch's intra-op threads set to `n` for the block (restored afterwards): the parity
    grid is many small runs, and one thread is fastest for them."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)
