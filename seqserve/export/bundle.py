"""Training run -> artifact bundle `REPO/NAME/VERSION/` (docs/contracts.md, "Artifact bundle").

`export_run` rebuilds the run's eager model, writes the graphs in every requested format,
checks their signatures and their parity with the eager model, and writes the bundle with the
one bundle writer (export/writer.py: a staged folder, the manifest last and read back
verified, an atomic rename to the version number; a version is never overwritten).

A forecaster run (`seqserve train forecast`: config.json task "forecast") is a feature-sequence
model with no tokenizer: it is packed as a stateful `sequence-tagger` (pack/api.py, the same
parity, batch-invariance and chunking checks) with the run's normalization, output scale and
test metrics in the manifest (`source_run`), longest series `FORECAST_MAX_STEPS`.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

from seqserve.export.contract import GraphSpec
from seqserve.export.formats import DEFAULT_OPSET, export_onnx, export_torchscript
from seqserve.export.graphs import GraphDef, graph_defs, rnn_form
from seqserve.export.manifest import Manifest, TokenizerSpec
from seqserve.export.parity import ParityGrid, check_parity
from seqserve.export.runners import bundle_runners, torch_threads
from seqserve.export.writer import FORMATS, SUFFIX, check_args, say, write_bundle
from seqserve.models.errors import UserError

FORECAST_MAX_STEPS = 256
"""Longest series a forecaster bundle takes per request (weeks for the CO2 demo: ~5 years; the
server's default `max_tokens` is 256 too)."""


def export_run(run_dir: str | os.PathLike[str], repo: str | os.PathLike[str], name: str,
               version: int | None = None, formats: tuple[str, ...] | list[str] = FORMATS,
               progress: bool = True, opset: int = DEFAULT_OPSET,
               grid: dict[str, Any] | None = None, threads: int = 1,
               attention_keys: bool = True, chat_template: str | None = None) -> Path:
    """Export a finished training run as bundle `repo/name/version` and return its path.

    version: None = next free integer. formats: any of "onnx", "torchscript". grid: optional
    `ParityGrid` overrides (batch_sizes, lengths, tolerances, seed). threads: torch threads
    while exporting (restored afterwards); the parity grid is many small runs, and one thread
    is fastest for them, several times faster than two on a busy machine. attention_keys:
    a translator whose attention projects the memory returns the projected keys from its
    encoder and its decoder step takes them (schema 3), unless False (graphs as schema 2
    wrote them: the step projects the memory at every call). chat_template: a language
    model's (Jinja, `models.text.chat_template`; checked here). Raises UserError
    for bad arguments or an existing version, BundleError when a graph check or parity fails.
    """
    formats = check_args(name, version, formats)
    if chat_template is not None:
        from seqserve.models.text.chat_template import read_template

        chat_template = read_template(chat_template, "chat_template")
    if threads < 1:
        raise UserError(f"threads={threads} must be >= 1")
    with torch_threads(threads):
        return _export(Path(run_dir), Path(repo), name, version, formats, progress, opset,
                       grid or {}, attention_keys, chat_template)


def _export(run: Path, repo: Path, name: str, version: int | None, formats: tuple[str, ...],
            progress: bool, opset: int, grid: dict[str, Any],
            attention_keys: bool = True, chat_template: str | None = None) -> Path:
    from seqserve.models.checkpoint import load_run

    if not run.is_dir():
        raise UserError(f"{run}: no such run directory")
    if not (run / "DONE").is_file():
        raise UserError(f"{run}: the run is not finished (no DONE file); train it to the end")
    if _run_task(run) == "forecast":
        return _export_forecast(run, repo, name, version, formats, progress, opset, grid)
    started = time.perf_counter()
    model, config, tokenizer = load_run(run)
    task = str(config["task"])
    if chat_template is not None and task != "lm":
        raise UserError(f"a chat template is a language model's, not a {task}'s")
    defs: list[GraphDef] = []

    def build(tmp: Path, version: int, target: Path) -> Manifest:
        say(progress, f"exporting {run} -> {target}")
        shutil.copyfile(run / "tokenizer.model", tmp / "tokenizer.model")
        defs.extend(graph_defs(task, model, int(config["model"]["vocab_size"]),
                               attention_keys))
        graphs = _write_graphs(defs, tmp, formats, opset, progress)
        state_dim = getattr(model.config, "state_dim", None) if task == "lm" else None
        manifest = _manifest(task, name, version, run, config, tokenizer, graphs,
                             opset if "onnx" in formats else None, state_dim)
        return dataclasses.replace(manifest, chat_template=chat_template)

    def check(tmp: Path, manifest: Manifest) -> dict[str, Any]:
        return _parity(task, defs, manifest, tmp, config, progress, grid)

    return write_bundle(repo, name, version, build, check, progress=progress, started=started)


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
    say(progress, f"packing forecaster {run} as sequence-tagger {name}")
    return sequence_tagger(model, features=model.config.features,
                           outputs=model.config.outputs,
                           normalization=config["normalization"],
                           output_scale=config["output_scale"], repo=repo, name=name,
                           version=version, torchscript="torchscript" in formats,
                           max_steps=FORECAST_MAX_STEPS, stateful=True, opset=opset,
                           progress=progress, grid=grid or None, source_run=source_run)


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
            say(progress, f"wrote {file} ({time.perf_counter() - t0:.1f} s)")
        spec = gdef.spec
        graphs[gdef.name] = GraphSpec(spec.inputs, spec.outputs, files.get("onnx"),
                                      files.get("torchscript"), rnn_form(gdef.name, gdef.module))
    return graphs


def _parity(task: str, defs: list[GraphDef], manifest: Manifest, out: Path,
            config: dict[str, Any], progress: bool, grid: dict[str, Any]) -> dict[str, Any]:
    runners = bundle_runners(out, manifest.graphs, {g.name: g.module for g in defs})
    model_cfg = config["model"]
    params = ParityGrid(max_length=int(model_cfg["max_length"]),
                        vocab_size=int(model_cfg["vocab_size"]),
                        pad_id=int(model_cfg.get("pad_id", 0)),
                        **{"state_dim": int(manifest.state_dim or 0), **grid})
    say(progress, "checking parity and batch invariance against the eager model")
    return check_parity(task, runners, "eager", manifest.graphs, params, progress=progress)


def _manifest(task: str, name: str, version: int, run: Path, config: dict[str, Any],
              tokenizer: Any, graphs: dict[str, GraphSpec], opset: int | None,
              state_dim: int | None = None) -> Manifest:
    """The run's manifest (the writer adds created, libraries and the files' hashes)."""
    max_length = int(config["model"]["max_length"])
    limits = {"max_tokens": max_length}
    if task == "translator":
        limits["max_decode_length"] = max_length
    test_metrics = run / "test_metrics.json"
    return Manifest(
        task=task, name=name, version=version,
        source_run={"path": str(run.resolve()), "config": config,
                    "test_metrics": json.loads(test_metrics.read_text())
                    if test_metrics.is_file() else {}},
        tokenizer=TokenizerSpec("tokenizer.model", tokenizer.vocab_size, tokenizer.pad_id,
                                tokenizer.unk_id, tokenizer.bos_id, tokenizer.eos_id),
        labels=[str(x) for x in config.get("labels") or []],
        limits=limits, graphs=graphs, opset=opset,
        decoder=str(config["model"].get("decoder", "luong")) if task == "translator" else None,
        state_dim=state_dim,  # a language model: its prefill's initial_state width
    )
