"""Runtime selection: `load_runtime(settings, bundle_dir, manifest)`.

Each runtime module is imported only when chosen, so the ONNX path never imports torch.
"""

from __future__ import annotations

from pathlib import Path

from export.manifest import Manifest
from service.runtimes.base import Runtime, RuntimeUnavailable
from service.settings import Settings


def graph_files(bundle_dir: Path, manifest: Manifest, fmt: str) -> dict[str, Path]:
    """Graph name -> file of format `fmt` ("onnx" | "torchscript") inside the bundle."""
    files = {}
    for graph, spec in manifest.graphs.items():
        name = spec.file(fmt)
        if name is None:
            raise RuntimeUnavailable(f"bundle has no {fmt} file for graph {graph!r}")
        files[graph] = bundle_dir / name
    return files


def load_runtime(settings: Settings, bundle_dir: Path, manifest: Manifest) -> Runtime:
    """Build the runtime `settings.runtime` for one bundle; raises RuntimeUnavailable."""
    if settings.runtime == "onnx":
        from service.runtimes.onnx import OnnxRuntime

        return OnnxRuntime(
            graph_files(bundle_dir, manifest, "onnx"),
            providers=settings.ort_providers(),
            intra_op_threads=settings.intra_op_threads,
            inter_op_threads=settings.inter_op_threads,
        )
    from service.runtimes.torchscript import TorchScriptRuntime

    return TorchScriptRuntime(
        graph_files(bundle_dir, manifest, "torchscript"),
        manifest,
        device=settings.device,
        intra_op_threads=settings.intra_op_threads,
        inter_op_threads=settings.inter_op_threads,
    )


__all__ = ["Runtime", "RuntimeUnavailable", "graph_files", "load_runtime"]
