"""The runtimes layer: ONNX Runtime and TorchScript behind one small interface (`base`).

`load_runtime(spec, bundle_dir, manifest)` builds the chosen runtime; each runtime module is
imported only when chosen, so the ONNX path never imports torch. This layer imports no web
framework, no pydantic and no `Settings` (a checked rule: it runs in the engine process).
"""

from __future__ import annotations

from pathlib import Path

from seqserve.export.manifest import Manifest
from seqserve.service.runtimes.base import Runtime, RuntimeSpec, RuntimeUnavailable


def graph_files(bundle_dir: Path, manifest: Manifest, fmt: str) -> dict[str, Path]:
    """Graph name -> file of format `fmt` ("onnx" | "torchscript") inside the bundle."""
    files = {}
    for graph, spec in manifest.graphs.items():
        name = spec.file(fmt)
        if name is None:
            fixes = [f"serve it with --runtime {f}" for f in manifest.formats if f != fmt]
            if fmt == "torchscript":
                fixes.append("pack it again with --torchscript (a TorchScript twin is "
                             "optional in the bundle format)")
            raise RuntimeUnavailable(f"bundle has no {fmt} file for graph {graph!r} (it is "
                                     f"{' + '.join(manifest.formats) or 'empty'}-only): "
                                     + " or ".join(fixes))
        files[graph] = bundle_dir / name
    return files


def load_runtime(spec: RuntimeSpec, bundle_dir: Path, manifest: Manifest) -> Runtime:
    """Build the runtime `spec.kind` for one bundle; raises RuntimeUnavailable."""
    if spec.kind == "onnx":
        from seqserve.service.runtimes.onnx import OnnxRuntime

        return OnnxRuntime(
            graph_files(bundle_dir, manifest, "onnx"),
            providers=spec.ort_providers(),
            signatures=manifest.graphs,
            intra_op_threads=spec.intra_op_threads,
            inter_op_threads=spec.inter_op_threads,
        )
    from seqserve.service.runtimes.torchscript import TorchScriptRuntime

    return TorchScriptRuntime(
        graph_files(bundle_dir, manifest, "torchscript"),
        manifest,
        device=spec.device,
        intra_op_threads=spec.intra_op_threads,
        inter_op_threads=spec.inter_op_threads,
    )


__all__ = ["Runtime", "RuntimeSpec", "RuntimeUnavailable", "graph_files", "load_runtime"]
