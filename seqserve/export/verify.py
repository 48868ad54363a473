"""Re-verify a written bundle without the training run: hashes, graph signatures, and
(optionally) ONNX vs TorchScript parity plus batch invariance on generated inputs."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from seqserve.export.manifest import Manifest, load_bundle
from seqserve.models.errors import BundleError
from seqserve.models.text.tokenizer_files import load_tokenizer, probe_tokenizer


def _vocab_size(manifest: Manifest) -> int:
    model_cfg = (manifest.source_run.get("config") or {}).get("model") or {}
    return int(model_cfg.get("vocab_size") or manifest.tokenizer.vocab_size)


def series_grid(manifest: Manifest, overrides: dict[str, Any]) -> Any:
    """The parity grid of a feature-sequence bundle: float series up to its max_steps."""
    from seqserve.export.parity import ParityGrid

    return ParityGrid(max_length=int(manifest.limits.get("max_steps", 64)), vocab_size=0,
                      features=int(manifest.features or 0),
                      state_dim=int(manifest.state_dim or 0), **overrides)


def check_graph_files(root: Path, manifest: Manifest) -> None:
    """Each ONNX graph against its declared signature: with the onnx package (checker,
    opset) and as ONNX Runtime sees it (the check the server makes). Seqserve's own exports
    must name every dim as the contract does; packed graphs keep their authors' dim names."""
    from seqserve.export.contract import check_signature, session_signature
    from seqserve.export.formats import check_onnx

    strict = not manifest.source
    for spec in manifest.graphs.values():
        if not spec.onnx:
            continue
        check_onnx(root / spec.onnx, spec, manifest.opset if strict else None, strict=strict)
        session = _session(root / spec.onnx)
        check_signature(spec.onnx, spec, *session_signature(session))


def _session(path: Path) -> object:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    try:
        return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    except Exception as exc:  # onnxruntime raises its own exception types
        raise BundleError(f"{path}: ONNX Runtime cannot load it: {exc}") from exc


def probe_tokenizers(root: Path, manifest: Manifest) -> None:
    """The server's own check of a bundle's tokenizers (`probe_tokenizer`, as the repository
    runs it at load): one that fails, panics or crawls on short adversarial texts is refused,
    with the reason (BundleError)."""
    if manifest.has_tokenizer:
        for spec in filter(None, (manifest.tokenizer, manifest.target_tokenizer)):
            probe_tokenizer(load_tokenizer(root / spec.file, spec.kind, (
                spec.pad_id, spec.unk_id, spec.bos_id, spec.eos_id)), spec.file)


def check_crf(root: Path, manifest: Manifest) -> None:
    """A tagger's CRF file as the server reads it (`export.crf.load_crf`): one score array
    that fits the labels, every score finite (BundleError)."""
    if manifest.crf is not None:
        from seqserve.export.crf import load_crf

        load_crf(root / manifest.crf.file, len(manifest.labels))


def verify_bundle(bundle_dir: str | os.PathLike[str], parity: bool = True,
                  progress: bool = False, grid: dict[str, Any] | None = None) -> dict[str, Any]:
    """Check a bundle; raise BundleError naming what is wrong, else return a report dict.

    Checks: every sha256 (no missing, no unlisted files), manifest.json against its own
    `manifest_sha256`, the contract signatures in the
    manifest and in each ONNX graph (symbolic dims, dtypes, opset, checker), and with
    `parity`: ONNX vs TorchScript within the recorded tolerance and batch invariance of each
    format over the grid (batch sizes x lengths up to the bundle's max_tokens), with the
    contract's bounds (1e-4 parity, 1e-5 invariance) unless `grid` overrides them.
    """
    root = Path(bundle_dir)
    manifest = load_bundle(root, verify=True, require_checksum=True)  # schema + declared
    check_graph_files(root, manifest)
    probe_tokenizers(root, manifest)
    check_crf(root, manifest)
    report: dict[str, Any] = {"bundle": str(root), "name": manifest.name,
                              "version": manifest.version, "task": manifest.task,
                              "files": sorted(manifest.files), "hashes": "ok", "parity": None}
    if not parity:
        return report
    from seqserve.export.parity import ParityGrid, check_parity
    from seqserve.export.runners import bundle_runners, torch_threads

    runners = bundle_runners(root, manifest.graphs)
    reference = "torchscript" if "torchscript" in runners else "onnx"
    if manifest.has_tokenizer:
        params = ParityGrid(  # the contract's bounds, not whatever the manifest says
            max_length=int(manifest.limits.get("max_tokens", 64)),
            vocab_size=_vocab_size(manifest), pad_id=max(manifest.tokenizer.pad_id, 0),
            target_vocab_size=manifest.target.vocab_size if manifest.target_tokenizer else None,
            state_dim=int(manifest.state_dim or 0),  # an LM prefill's initial_state
            **(grid or {}),
        )
    else:
        params = series_grid(manifest, grid or {})
    with torch_threads(1):  # many small runs: one thread is fastest, even on an idle box
        result = check_parity(manifest.task, runners, reference, manifest.graphs, params,
                              progress=progress)
    report["parity"] = result
    if not result["passed"]:
        raise BundleError(f"{root}: parity check failed:\n  " + "\n  ".join(result["failures"]))
    return report
