"""Writing one graph as ONNX or TorchScript, and checking the ONNX signature afterwards.

ONNX goes through the TorchScript-based exporter (`dynamo=False`): it emits native ONNX
LSTM/GRU/RNN ops and names every dynamic dim after `dynamic_axes`. Afterwards every graph
input and output is checked against the contract spec: names, dtypes, and every dim symbolic
with the contract's name (only `k` is a fixed [1]); a size frozen from the example inputs
fails the export.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import torch

from seqserve.export.graphs import GraphDef
from seqserve.export.manifest import GraphSpec, TensorSpec
from seqserve.models.errors import BundleError

DEFAULT_OPSET = 17
_ONNX_DTYPES = {"float32": 1, "int64": 7, "bool": 9}  # onnx.TensorProto enum values


def dynamic_axes(spec: GraphSpec) -> dict[str, dict[int, str]]:
    """{tensor name: {axis: dim name}} for every symbolic dim of the spec."""
    axes: dict[str, dict[int, str]] = {}
    for t in (*spec.inputs, *spec.outputs):
        named = {i: d for i, d in enumerate(t.shape) if isinstance(d, str)}
        if named:
            axes[t.name] = named
    return axes


def export_onnx(gdef: GraphDef, path: Path, opset: int = DEFAULT_OPSET) -> None:
    """Export one graph to a self-contained .onnx file, then check it (see module doc)."""
    spec = gdef.spec
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # tracer and deprecation chatter
        torch.onnx.export(
            gdef.module, gdef.example, str(path),
            input_names=[t.name for t in spec.inputs],
            output_names=[t.name for t in spec.outputs],
            dynamic_axes=dynamic_axes(spec),  # type: ignore[arg-type]
            opset_version=opset,
            do_constant_folding=True,
            dynamo=False,
        )
    check_onnx(path, spec, opset)


def check_onnx(path: Path, spec: GraphSpec, opset: int | None = None) -> None:
    """onnx.checker, no external data, opset, and the signature of `spec` (symbolic dims)."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    try:
        onnx.checker.check_model(model, full_check=True)
    except onnx.checker.ValidationError as exc:
        raise BundleError(f"{path.name}: onnx checker failed: {exc}") from exc
    external = [t.name for t in model.graph.initializer
                if t.data_location == onnx.TensorProto.EXTERNAL]
    if external:
        raise BundleError(f"{path.name}: weights in external data files {external[:3]}")
    if opset is not None:
        found = {o.version for o in model.opset_import if o.domain in ("", "ai.onnx")}
        if found != {opset}:
            raise BundleError(f"{path.name}: opset {sorted(found)} != requested {opset}")
    _check_values(path.name, "input", list(model.graph.input), spec.inputs)
    _check_values(path.name, "output", list(model.graph.output), spec.outputs)


def _check_values(file: str, kind: str, values: list[Any], specs: tuple[TensorSpec, ...]
                  ) -> None:
    names = [v.name for v in values]
    if names != [t.name for t in specs]:
        raise BundleError(f"{file}: graph {kind}s {names} != contract {[t.name for t in specs]}")
    for value, t in zip(values, specs, strict=True):
        tensor_type = value.type.tensor_type
        if tensor_type.elem_type != _ONNX_DTYPES[t.dtype]:
            raise BundleError(f"{file}: {kind} {t.name} has ONNX elem_type "
                              f"{tensor_type.elem_type}, contract says {t.dtype}")
        dims = [d.dim_param or (d.dim_value if d.HasField("dim_value") else "?")
                for d in tensor_type.shape.dim]
        if len(dims) != len(t.shape):
            raise BundleError(f"{file}: {kind} {t.name} has rank {len(dims)}, contract "
                              f"{list(t.shape)}")
        for axis, (got, want) in enumerate(zip(dims, t.shape, strict=True)):
            if got != want:
                frozen = "a frozen size " if isinstance(got, int) else ""
                raise BundleError(
                    f"{file}: {kind} {t.name} dim {axis} is {frozen}{got!r}, contract says "
                    f"{want!r} (declared shape {dims}, expected {list(t.shape)})"
                )


def export_torchscript(gdef: GraphDef, path: Path) -> None:
    """Trace the wrapper module and save it with torch.jit.save (positional in/out)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        traced = torch.jit.trace(gdef.module, gdef.example, check_trace=False)
    torch.jit.save(traced, str(path))
