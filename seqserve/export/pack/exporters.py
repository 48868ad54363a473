"""The ONNX exporters behind `seqserve.pack`, and graphs judged by running them.

`export_onnx` exports a wrapper with PyTorch's default exporter (dynamo, torch.export) and
runs the graph in ONNX Runtime on probe inputs of other batch sizes and lengths than the
example's against the module itself; where dynamo fails to export, or its graph answers
wrongly at a probe (torch.export fixed a size the example had), it exports again with the
TorchScript-based exporter (`dynamo=False`) and says why.

`relax_data_dims` rewrites a graph's declared data dims (batch, seq, ...) that an exporter
declared as fixed numbers to symbolic ones: torch.export declares nn.LSTM / nn.GRU outputs
with the example's sequence length although the graph answers every length. Whether it does
is what the parity check then finds by running it at several lengths and batch sizes.
"""

from __future__ import annotations

import re
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from seqserve.export.contract import DATA_DIMS, GraphSpec
from seqserve.export.formats import dynamic_axes
from seqserve.models.errors import BundleError

PROBE_TOL = 1e-4
GENERATED_DIM = re.compile(r"s\d+")
"""The names torch.export gives the dynamic dims it finds (Dim.AUTO)."""


def _dynamic_shapes(spec: GraphSpec, count: int) -> tuple[Any, ...]:
    """torch.export's dynamic shapes, positionally: every symbolic dim of the spec's inputs
    Dim.AUTO (dynamic where the module allows it)."""
    auto = torch.export.Dim.AUTO
    shapes: list[Any] = []
    for t in spec.inputs[:count]:
        axes = {i: auto for i, d in enumerate(t.shape) if isinstance(d, str)}
        shapes.append(axes or None)
    return tuple(shapes)


def _onnx(module: nn.Module, example: tuple[Tensor, ...], spec: GraphSpec, opset: int,
          dynamo: bool) -> Any:
    import onnx

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "graph.onnx"
        inputs = [t.name for t in spec.inputs][:len(example)]
        outputs = [t.name for t in spec.outputs]
        if dynamo:
            torch.onnx.export(module, example, str(path), dynamo=True, verbose=False,
                              input_names=inputs, output_names=outputs,
                              dynamic_shapes=_dynamic_shapes(spec, len(example)),
                              opset_version=max(opset, 18), external_data=False)
        else:
            torch.onnx.export(module, example, str(path), input_names=inputs,
                              output_names=outputs,
                              dynamic_axes=dynamic_axes(spec),  # type: ignore[arg-type]
                              opset_version=opset, do_constant_folding=True, dynamo=False)
        return onnx.load(str(path))


def probe(model: Any, module: nn.Module, probes: tuple[tuple[Tensor, ...], ...]) -> None:
    """Run `model` in ONNX Runtime on each probe and compare every output with `module`'s
    (|a - b| <= 1e-4 x max(1, |b|)); raise ValueError naming the first probe that differs."""
    import onnxruntime as ort

    if not probes:
        return
    options = ort.SessionOptions()
    options.log_severity_level = 3
    session = ort.InferenceSession(model.SerializeToString(), options,
                                   providers=["CPUExecutionProvider"])
    names = [i.name for i in session.get_inputs()]
    for inputs in probes:
        shapes = ", ".join(str(tuple(t.shape)) for t in inputs)
        with torch.no_grad():
            want = module(*inputs)
        want = want if isinstance(want, tuple | list) else (want,)
        feed = {n: t.numpy() for n, t in zip(names, inputs, strict=False)}
        try:
            got = session.run(None, feed)
        except Exception as exc:  # onnxruntime's own error types
            raise ValueError(f"ONNX Runtime failed on inputs {shapes}: "
                             f"{str(exc)[:200]}") from exc
        for out, a, b in zip(session.get_outputs(), got, want, strict=False):
            b = b.detach().numpy()
            if a.shape != b.shape or (b.size and float(np.max(
                    np.abs(a.astype(np.float64) - b) / np.maximum(1.0, np.abs(b)))) > PROBE_TOL):
                raise ValueError(f"output {out.name!r} on inputs {shapes} differs from the "
                                 "module's (a size fixed to the example's)")


def _why(exc: BaseException) -> str:
    """The innermost cause of an exporter's error, in a line."""
    while exc.__cause__ is not None:
        exc = exc.__cause__
    first = (str(exc).strip().splitlines() or [""])[0]
    return f"{type(exc).__name__}: {first[:240]}"


def export_onnx(module: nn.Module, example: tuple[Tensor, ...], spec: GraphSpec, opset: int,
                dynamo: bool, probes: tuple[tuple[Tensor, ...], ...]
                ) -> tuple[Any, str, str]:
    """(onnx.ModelProto, "dynamo" | "torchscript", a note for the user or "")."""
    note = ""
    if dynamo:
        try:
            model = _onnx(module, example, spec, opset, True)
            probe(model, module, probes)
            return model, "dynamo", ""
        except Exception as exc:  # the exporter's or the probe's own errors
            note = (f"PyTorch's default ONNX exporter (dynamo) did not give a usable graph "
                    f"({_why(exc)}); exported with the TorchScript-based "
                    "exporter (dynamo=False) instead")
    try:
        return _onnx(module, example, spec, opset, False), "torchscript", note
    except Exception as exc:  # the exporter's own errors
        before = f" {note[:-len(' instead')]}; then" if note else ""
        raise BundleError(
            f"ONNX export failed:{before} the TorchScript-based exporter raised "
            f"{type(exc).__name__}: {str(exc)[:300]}") from exc


def relax_data_dims(model: Any, spec: GraphSpec) -> list[str]:
    """Rewrite, in place, the fixed numbers an exporter declared for the contract's data dims
    (DATA_DIMS: batch, seq, ...) of `model`'s inputs and outputs (named as the graph names them,
    `spec.tensor_names`) to symbolic dims, name such dims the dynamo exporter named itself
    (s0, s1, ...; a name the file's author chose stays) as the contract does, and drop the
    intermediate shapes it declared (value_info: those of the example's sizes would otherwise
    be taken for the outputs').
    Returns "tensor dim axis" of each rewritten dim."""
    values = {v.name: v for v in [*model.graph.input, *model.graph.output]}
    changed: list[str] = []
    for t in (*spec.inputs, *spec.outputs):
        value = values.get(spec.tensor_names.get(t.name, t.name))
        if value is None or not value.type.HasField("tensor_type"):
            continue
        dims = value.type.tensor_type.shape.dim
        for axis, contract in enumerate(t.shape):
            if contract not in DATA_DIMS or axis >= len(dims):
                continue
            if dims[axis].HasField("dim_value"):
                dims[axis].dim_param = str(contract)
                changed.append(f"{value.name} dim {axis}")
            elif GENERATED_DIM.fullmatch(dims[axis].dim_param):  # dynamo's s0, s1, ...
                dims[axis].dim_param = str(contract)
    del model.graph.value_info[:]  # intermediate shapes: ONNX Runtime infers them again
    return changed

