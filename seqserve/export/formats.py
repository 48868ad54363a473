"""Writing one graph as ONNX or TorchScript, and checking the ONNX signature afterwards.

ONNX goes through the TorchScript-based exporter (`dynamo=False`): it emits native ONNX
LSTM/GRU/RNN ops and names every dynamic dim after `dynamic_axes`. Afterwards every graph
input and output is checked against the contract spec: names, dtypes, and every dim symbolic
with the contract's name (only `k` is a fixed [1]); a size frozen from the example inputs
fails the export. torch is imported by the writers only: `check_onnx` runs without it
(`seqserve verify --no-parity`).
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import TYPE_CHECKING

from seqserve.export.contract import GraphSpec
from seqserve.models.errors import BundleError

if TYPE_CHECKING:
    from seqserve.export.graphs import GraphDef

DEFAULT_OPSET = 17


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
    import torch

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


def check_onnx(path: Path, spec: GraphSpec, opset: int | None = None, strict: bool = True,
               external: bool = False) -> None:
    """onnx.checker, opset, and the signature of `spec` (`contract.check_signature`;
    `strict`: every symbolic dim named as the contract names it, seqserve's own exports).
    External data files are refused unless `external` (packed graphs list them)."""
    import onnx

    from seqserve.export.contract import check_signature, onnx_signature

    model = onnx.load(str(path), load_external_data=False)
    outside = [t.name for t in model.graph.initializer
               if t.data_location == onnx.TensorProto.EXTERNAL]
    if outside and not external:
        raise BundleError(f"{path.name}: weights in external data files {outside[:3]}; a "
                          "bundle's graph is one file (pack reads external data in)")
    try:
        if external:  # the checker reads the external files itself, by path
            onnx.checker.check_model(str(path), full_check=False)
        else:
            onnx.checker.check_model(model, full_check=True)
    except onnx.checker.ValidationError as exc:
        raise BundleError(f"{path.name}: onnx checker failed: {exc}") from exc
    if opset is not None:
        found = {o.version for o in model.opset_import if o.domain in ("", "ai.onnx")}
        if found != {opset}:
            raise BundleError(f"{path.name}: opset {sorted(found)} != requested {opset}")
    inputs, outputs = onnx_signature(model)
    check_signature(path.name, spec, inputs, outputs, strict=strict)


def export_torchscript(gdef: GraphDef, path: Path) -> None:
    """Trace the wrapper module and save it with torch.jit.save (positional in/out)."""
    import torch

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        traced = torch.jit.trace(gdef.module, gdef.example, check_trace=False)
    torch.jit.save(traced, str(path))
