"""Training run -> artifact bundle `REPO/NAME/VERSION/` (docs/contracts.md, "Artifact bundle").

`export_run` rebuilds the run's eager model, writes the graphs in every requested format into
a hidden temporary folder beside the target, checks their signatures and their parity with the
eager model, writes the manifest, verifies the hashes, and only then renames the folder to its
version number: a half-written bundle never appears under a version name, and an existing
version is never overwritten.

A forecaster run (`seqserve train forecast`: config.json task "forecast") is a feature-sequence
model with no tokenizer: it is packed as a stateful `sequence-tagger` (pack/api.py, the same
parity, batch-invariance and chunking checks) with the run's normalization, output scale and
test metrics in the manifest (`source_run`), longest series `FORECAST_MAX_STEPS`.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import shutil
import tempfile
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from seqserve.export.formats import DEFAULT_OPSET, export_onnx, export_torchscript
from seqserve.export.graphs import GraphDef, graph_defs
from seqserve.export.manifest import (
    GraphSpec,
    Manifest,
    TokenizerSpec,
    hash_files,
    load_bundle,
    next_version,
    write_manifest,
)
from seqserve.export.parity import ParityGrid, check_parity
from seqserve.export.runners import Runner, onnx_runner, torch_runner, torchscript_runner
from seqserve.export.summary import format_summary
from seqserve.export.tagger_graphs import rnn_form
from seqserve.models.errors import BundleError, UserError

FORMATS = ("onnx", "torchscript")
SUFFIX = {"onnx": ".onnx", "torchscript": ".pt"}
FORECAST_MAX_STEPS = 256
"""Longest series a forecaster bundle takes per request (weeks for the CO2 demo: ~5 years; the
server's default `max_tokens` is 256 too)."""


def export_run(run_dir: str | os.PathLike[str], repo: str | os.PathLike[str], name: str,
               version: int | None = None, formats: tuple[str, ...] | list[str] = FORMATS,
               progress: bool = True, opset: int = DEFAULT_OPSET,
               grid: dict[str, Any] | None = None, threads: int = 1) -> Path:
    """Export a finished training run as bundle `repo/name/version` and return its path.

    version: None = next free integer. formats: any of "onnx", "torchscript". grid: optional
    `ParityGrid` overrides (batch_sizes, lengths, tolerances, seed). threads: torch threads
    while exporting (restored afterwards); the parity grid is many small runs, and one thread
    is fastest for them, several times faster than two on a busy machine. Raises UserError
    for bad arguments or an existing version, BundleError when a graph check or parity fails.
    """
    import torch

    formats = _check_args(name, version, formats)
    if threads < 1:
        raise UserError(f"threads={threads} must be >= 1")
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        return _export(Path(run_dir), Path(repo), name, version, formats, progress, opset,
                       grid or {})
    finally:
        torch.set_num_threads(before)


def _export(run: Path, repo: Path, name: str, version: int | None, formats: tuple[str, ...],
            progress: bool, opset: int, grid: dict[str, Any]) -> Path:
    from seqserve.models.checkpoint import load_run

    if not run.is_dir():
        raise UserError(f"{run}: no such run directory")
    if not (run / "DONE").is_file():
        raise UserError(f"{run}: the run is not finished (no DONE file); train it to the end")
    if _run_task(run) == "forecast":
        return _export_forecast(run, repo, name, version, formats, progress, opset, grid)
    started = time.perf_counter()
    model, config, tokenizer = load_run(run)
    with staged_version(repo, name, version) as (version, target, tmp):
        _say(progress, f"exporting {run} -> {target}")
        shutil.copyfile(run / "tokenizer.model", tmp / "tokenizer.model")
        task = str(config["task"])
        defs = graph_defs(task, model, int(config["model"]["vocab_size"]))
        graphs = _write_graphs(defs, tmp, formats, opset, progress)
        parity = _parity(task, defs, graphs, tmp, config, progress, grid)
        manifest = _manifest(task, name, version, run, config, tokenizer, graphs, parity,
                             opset if "onnx" in formats else None, tmp)
        write_manifest(tmp, manifest)
        load_bundle(tmp, verify=True)
    if progress:
        print(format_summary(target, manifest, time.perf_counter() - started))
    return target


def _run_task(run: Path) -> str | None:
    try:
        return str(json.loads((run / "config.json").read_text()).get("task"))
    except (OSError, ValueError, AttributeError):
        return None  # load_run names what is wrong


def _export_forecast(run: Path, repo: Path, name: str, version: int | None,
                     formats: tuple[str, ...], progress: bool, opset: int,
                     grid: dict[str, Any]) -> Path:
    """A forecaster run -> a stateful sequence-tagger bundle (module doc)."""
    from seqserve.export.pack.api import sequence_tagger
    from seqserve.models.train.forecast import load_forecast_run

    if "onnx" not in formats:
        raise UserError("a forecaster bundle needs the onnx format (torchscript is optional)")
    model, config = load_forecast_run(run)
    test_metrics = run / "test_metrics.json"
    source_run = {"path": str(run.resolve()), "config": config,
                  "test_metrics": json.loads(test_metrics.read_text())
                  if test_metrics.is_file() else {}}
    _say(progress, f"packing forecaster {run} as sequence-tagger {name}")
    return sequence_tagger(model, features=model.config.features,
                           outputs=model.config.outputs,
                           normalization=config["normalization"],
                           output_scale=config["output_scale"], repo=repo, name=name,
                           version=version, torchscript="torchscript" in formats,
                           max_steps=FORECAST_MAX_STEPS, stateful=True, opset=opset,
                           progress=progress, grid=grid or None, source_run=source_run)


def _check_args(name: str, version: int | None, formats: tuple[str, ...] | list[str]
                ) -> tuple[str, ...]:
    if not name or name.startswith(".") or "/" in name or "\\" in name or name != name.strip():
        raise UserError(f"model name {name!r} is not a plain folder name")
    if version is not None and version < 1:
        raise UserError(f"--version {version} must be a positive integer")
    chosen = tuple(dict.fromkeys(f.strip() for f in formats if f.strip()))
    unknown = [f for f in chosen if f not in FORMATS]
    if unknown or not chosen:
        raise UserError(f"formats {list(formats)}: choose from {', '.join(FORMATS)}")
    return chosen


def _say(progress: bool, text: str) -> None:
    if progress:
        print(f"== {text}", flush=True)


def _write_graphs(defs: list[GraphDef], out: Path, formats: tuple[str, ...], opset: int,
                  progress: bool) -> dict[str, GraphSpec]:
    graphs: dict[str, GraphSpec] = {}
    for gdef in defs:
        files: dict[str, str] = {}
        for fmt in formats:
            file = gdef.name + SUFFIX[fmt]
            t0 = time.perf_counter()
            if fmt == "onnx":
                export_onnx(gdef, out / file, opset)
            else:
                export_torchscript(gdef, out / file)
            files[fmt] = file
            _say(progress, f"wrote {file} ({time.perf_counter() - t0:.1f} s)")
        spec = gdef.spec
        graphs[gdef.name] = GraphSpec(spec.inputs, spec.outputs, files.get("onnx"),
                                      files.get("torchscript"), rnn_form(gdef.name, gdef.module))
    return graphs


def _parity(task: str, defs: list[GraphDef], graphs: dict[str, GraphSpec], out: Path,
            config: dict[str, Any], progress: bool, grid: dict[str, Any]) -> dict[str, Any]:
    runners: dict[str, dict[str, Runner]] = {"eager": {}}
    for gdef in defs:
        spec = graphs[gdef.name]
        runners["eager"][gdef.name] = torch_runner(gdef.module, spec)
        if spec.onnx:
            runners.setdefault("onnx", {})[gdef.name] = onnx_runner(out / spec.onnx, spec)
        if spec.torchscript:
            runners.setdefault("torchscript", {})[gdef.name] = torchscript_runner(
                out / spec.torchscript, spec)
    model_cfg = config["model"]
    params = ParityGrid(max_length=int(model_cfg["max_length"]),
                        vocab_size=int(model_cfg["vocab_size"]),
                        pad_id=int(model_cfg.get("pad_id", 0)), **grid)
    _say(progress, "checking parity and batch invariance against the eager model")
    report = check_parity(task, runners, "eager", graphs, params, progress=progress)
    if not report["passed"]:
        raise BundleError("parity check failed, nothing was written:\n  "
                          + "\n  ".join(report["failures"]))
    return report


def _manifest(task: str, name: str, version: int, run: Path, config: dict[str, Any],
              tokenizer: Any, graphs: dict[str, GraphSpec], parity: dict[str, Any],
              opset: int | None, out: Path) -> Manifest:
    max_length = int(config["model"]["max_length"])
    limits = {"max_tokens": max_length}
    if task == "translator":
        limits["max_decode_length"] = max_length
    test_metrics = run / "test_metrics.json"
    return Manifest(
        task=task, name=name, version=version,
        created=datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        source_run={"path": str(run.resolve()), "config": config,
                    "test_metrics": json.loads(test_metrics.read_text())
                    if test_metrics.is_file() else {}},
        tokenizer=TokenizerSpec("tokenizer.model", tokenizer.vocab_size, tokenizer.pad_id,
                                tokenizer.unk_id, tokenizer.bos_id, tokenizer.eos_id),
        labels=[str(x) for x in config.get("labels") or []],
        limits=limits, graphs=graphs, opset=opset, parity=parity,
        libraries=_libraries(), files=hash_files(out),
        decoder=str(config["model"].get("decoder", "luong")) if task == "translator" else None,
    )


def _libraries() -> dict[str, str]:
    import onnx
    import onnxruntime
    import torch

    return {"python": platform.python_version(), "torch": torch.__version__,
            "onnx": onnx.__version__, "onnxruntime": onnxruntime.__version__}


@contextlib.contextmanager
def staged_version(repo: str | os.PathLike[str], name: str,
                   version: int | None) -> Iterator[tuple[int, Path, Path]]:
    """(version, target, tmp): the version to write (the next free one when None), its
    folder and a fresh temporary folder beside it to write into. When the block ends the
    temporary folder is renamed to the version atomically; when it raises it is removed.
    A version that exists is refused: versions are never overwritten."""
    model_dir = Path(repo) / name
    version = version or next_version(repo, name)
    target = model_dir / str(version)
    if target.exists():
        raise UserError(f"{target} already exists: versions are never overwritten; pass a new "
                        "--version or leave it out for the next free one")
    model_dir.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{version}-", dir=model_dir))
    try:
        yield version, target, tmp
        _publish(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _publish(tmp: Path, target: Path) -> None:
    """Atomic rename of the finished folder to its version name (never over a bundle)."""
    try:
        os.rename(tmp, target)
    except OSError as exc:
        raise UserError(f"{target} appeared while exporting; not overwritten ({exc})") from exc
    os.chmod(target, 0o755)
