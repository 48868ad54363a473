"""Write and verify a packed bundle (the shared back end of `seqserve pack` and
`seqserve.pack`): graphs in the contract's form, tokenizer(s) with their special ids,
labels, manifest with hashes; then the checks of `seqserve verify` (schema, signatures as
ONNX Runtime sees them, parity with the TorchScript twin or the eager module, batch
invariance), written by the one bundle writer (export/writer.py) before the hidden folder
is renamed to its version. A refusal names what to
change; nothing is left behind.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from seqserve.export.contract import GRAPHS_BY_TASK, GraphSpec, expected_spec
from seqserve.export.crf import CRF, CRF_FILE, save_crf
from seqserve.export.manifest import CrfSpec, Manifest, TokenizerSpec
from seqserve.export.pack.exporters import relax_data_dims
from seqserve.export.pack.user_names import UserNames
from seqserve.export.parity import ParityGrid, check_parity
from seqserve.export.runners import Runner, bundle_runners, torch_threads
from seqserve.export.verify import check_crf, check_graph_files, probe_tokenizers, series_grid
from seqserve.export.writer import Build, check_args, say, write_bundle
from seqserve.models.errors import BundleError, UserError
from seqserve.models.text.tokenizer_files import special_ids, tokenizer_kind

BIDIRECTIONAL_FIX = "seqserve.pack.bidirectional(your_rnn)"


@dataclass
class PackedGraph:
    """One graph to write: an ONNX model (onnx.ModelProto) and/or a TorchScript module."""

    outputs: list[str]
    """Contract outputs it has (a classifier may lack attention)."""
    onnx: Any | None = None
    torchscript: Any | None = None
    """A torch.jit.ScriptModule taking the contract's inputs positionally."""
    tensor_names: dict[str, str] = field(default_factory=dict)
    eager: Any | None = None
    """The eager wrapper module (Python API): the parity reference."""
    inputs_given: list[str] = field(default_factory=list)
    """Optional contract inputs it takes (a prefill's initial_state)."""


def parse_labels(labels: Any) -> list[str]:
    """Labels from a file (one per line), "a,b,c", or a sequence."""
    if isinstance(labels, str | os.PathLike) and Path(labels).is_file():
        return [x.strip() for x in Path(labels).read_text(encoding="utf-8").splitlines()
                if x.strip()]
    if isinstance(labels, str):
        return [x.strip() for x in labels.split(",") if x.strip()]
    return [str(x) for x in labels]


def pack_bundle(task: str, graphs: dict[str, PackedGraph], tokenizer: str | os.PathLike[str],
                repo: str | os.PathLike[str], name: str, version: int | None = None,
                labels: list[str] | None = None,
                target_tokenizer: str | os.PathLike[str] | None = None,
                specials: dict[str, Any] | None = None,
                target_specials: dict[str, Any] | None = None,
                max_tokens: int = 128, max_decode_length: int = 128,
                source: dict[str, Any] | None = None, opset: int | None = None,
                progress: bool = True, grid: dict[str, Any] | None = None,
                attention: bool | None = None, words: str | None = None,
                state_dim: int | None = None, crf: CRF | None = None,
                chat_template: str | None = None) -> Path:
    """Write `repo/name/version` from packed graphs and return its path (see module doc).
    `attention` False: a translator whose step has no attention (its graph returns zeros).
    `words` (taggers): "whitespace" (None: the same) or "tokenizer" (`Manifest.words`).
    `crf` (taggers): its scores, kept as `crf.npy`; the tagger graph then gives emission
    scores, decoded with Viterbi (`Manifest.crf`). `chat_template` (language models):
    `Manifest.chat_template`, checked by the caller."""

    check_args(name, version, ["onnx"])
    missing = [g for g in GRAPHS_BY_TASK[task] if g not in graphs]
    if missing:
        raise UserError(f"a {task} needs graph(s) {missing}")
    labels = list(labels or [])
    if task in ("classifier", "tagger") and len(labels) < 2:
        raise UserError(f"a {task} needs at least two labels (--labels a,b,c or a file with "
                        "one label per line)")
    if len(set(labels)) != len(labels):
        raise UserError(f"labels {labels} repeat a label")
    if words not in (None, "whitespace", "tokenizer"):
        raise UserError(f"words {words!r}: give whitespace or tokenizer")
    if words is not None and task != "tagger":
        raise UserError(f"--words is a tagger's option, not a {task}'s")
    if crf is not None and task != "tagger":
        raise UserError(f"--crf is a tagger's option, not a {task}'s")
    check_crf_labels(crf, labels)
    if words == "tokenizer" and tokenizer_kind(tokenizer) != "tokenizers":
        raise UserError(f"--words tokenizer labels the words of a tokenizer.json's "
                        f"pre-tokenizer; {Path(tokenizer).name} is a SentencePiece model, "
                        "which splits words at whitespace only: use --words whitespace")
    limits = {"max_tokens": int(max_tokens)}
    if task == "translator":
        limits["max_decode_length"] = int(max_decode_length)
        attention = True if attention is None else attention

    def build(tmp: Path, version: int, target: Path) -> Manifest:
        tok = _tokenizer(tmp, Path(tokenizer), "tokenizer", specials)
        target_tok = (None if target_tokenizer is None else
                      _tokenizer(tmp, Path(target_tokenizer), "target_tokenizer",
                                 target_specials))
        _check_bos_eos(task, tok, target_tok)
        if crf is not None:
            save_crf(tmp / CRF_FILE, crf)
        return Manifest(task=task, name=name, version=version, tokenizer=tok,
                        target_tokenizer=target_tok, labels=labels, limits=limits,
                        graphs=_write_graphs(tmp, graphs), opset=_opset(opset, graphs),
                        attention=attention, source=_source(source, graphs),
                        words=words if task == "tagger" else None,
                        state_dim=state_dim if task == "lm" else None,
                        crf=None if crf is None else CrfSpec(CRF_FILE),
                        chat_template=chat_template if task == "lm" else None)

    return _write(repo, name, version, graphs, build, grid or {}, progress,
                  UserNames.from_source(task, source))


_PACKED_BY = {"packed_by": "seqserve pack"}


def _source(source: dict[str, Any] | None, graphs: dict[str, PackedGraph]) -> dict[str, Any]:
    """The manifest's `source`, with the ONNX exporter `seqserve.pack` used ("dynamo" or
    "torchscript", per graph where they differ)."""
    out = dict(source or _PACKED_BY)
    used = {g: prop.value for g, p in graphs.items() if p.onnx is not None
            for prop in p.onnx.metadata_props if prop.key == "seqserve.exporter"}
    if used:
        out["exporter"] = next(iter(used.values())) if len(set(used.values())) == 1 else used
    return out


def _check_bos_eos(task: str, tok: TokenizerSpec, target_tok: TokenizerSpec | None) -> None:
    """A language model needs bos and eos in its tokenizer; a translator in its target's."""
    if task == "lm" and (tok.bos_id < 0 or tok.eos_id < 0):
        what = "bos" if tok.bos_id < 0 else "eos"
        raise UserError(f"the tokenizer has no {what} token by any usual name: a language "
                        "model reads every prompt after bos and stops generating at eos; "
                        f"name it with --{what}-token (Python: specials={{'{what}': ...}}), "
                        "a token or an id (bos and eos may be the same token, a document "
                        "separator such as <eos> or <|endoftext|>)")
    if task == "translator":
        side = target_tok or tok
        if side.bos_id < 0 or side.eos_id < 0:
            what = "bos" if side.bos_id < 0 else "eos"
            flag = (f"--target-{what}-token (Python: target_specials={{'{what}': ...}})"
                    if target_tok is not None else
                    f"--{what}-token (Python: specials={{'{what}': ...}})")
            raise UserError(f"the target tokenizer has no {what} token by any usual name: "
                            f"name it with {flag}, a token or an id")


def _opset(opset: int | None, graphs: dict[str, PackedGraph]) -> int | None:
    """The graphs' own opset (the highest default-domain import: PyTorch's default exporter
    writes at least 18 whatever was asked), else the given one."""
    found = [max(o.version for o in g.onnx.opset_import if o.domain in ("", "ai.onnx"))
             for g in graphs.values() if g.onnx is not None]
    return max(found) if found else opset


def _write(repo: str | os.PathLike[str], name: str, version: int | None,
           graphs: dict[str, PackedGraph], build: Build, grid: dict[str, Any],
           progress: bool, names: UserNames) -> Path:
    """The bundle written by the one writer, then checked as `seqserve verify` checks it:
    signatures as ONNX Runtime sees them, sizes against the labels / tokenizer / state,
    parity with the TorchScript twin or the eager module and batch invariance. Every
    refusal names the user's files and tensors (`names`), not the contract's."""

    def check(tmp: Path, manifest: Manifest) -> dict[str, Any]:
        try:
            return checked(tmp, manifest)
        except (BundleError, UserError) as exc:
            raise type(exc)(names.message(str(exc))) from exc

    def checked(tmp: Path, manifest: Manifest) -> dict[str, Any]:
        check_graph_files(tmp, manifest)
        check_crf(tmp, manifest)
        eager = {g: p.eager for g, p in graphs.items() if p.eager is not None}
        runners = bundle_runners(tmp, manifest.graphs, eager,
                                 order=("eager", "torchscript", "onnx"))
        if manifest.has_tokenizer:
            probe_tokenizers(tmp, manifest)  # what the server would refuse at load
            _check_sizes(manifest, runners, names)
            say(progress, "checking parity and batch invariance on random padded batches")
            params = _grid(manifest, grid)
        else:
            _check_series_sizes(manifest, runners)
            say(progress, "checking parity, batch invariance and chunking on random padded "
                "series")
            params = series_grid(manifest, grid)
        with torch_threads(1):
            return check_parity(manifest.task, runners, next(iter(runners)), manifest.graphs,
                                params)

    return write_bundle(repo, name, version, build, check, progress=progress,
                        explain=lambda report: explain(report, names))


def parse_stats(value: Any, what: str, size: int) -> dict[str, list[float]] | None:
    """A {"mean": [...], "std": [...]} block from a dict or a JSON file (None: none); each
    list has `size` finite numbers, every std > 0 (UserError naming the flaw)."""
    import json
    import math

    if value is None:
        return None
    if isinstance(value, str | os.PathLike):
        path = Path(value)
        if not path.is_file():
            raise UserError(f"{path}: no such {what} file (JSON: {{\"mean\": [...], "
                            "\"std\": [...]}})")
        try:
            value = json.loads(path.read_text(encoding="utf-8"))
        except ValueError as exc:
            raise UserError(f"{path}: not valid JSON ({exc})") from exc
    if not isinstance(value, dict) or set(value) != {"mean", "std"}:
        raise UserError(f"{what} must be {{\"mean\": [...], \"std\": [...]}}, got "
                        f"{value!r:.80}")
    out: dict[str, list[float]] = {}
    for key in ("mean", "std"):
        items = value[key]
        items = items.tolist() if hasattr(items, "tolist") else items
        if not isinstance(items, list | tuple) or len(items) != size:
            raise UserError(f"{what}.{key} must list {size} number(s) (one per "
                            f"{'feature' if what == 'normalization' else 'output'}), got "
                            f"{items!r:.80}")
        try:
            out[key] = [float(x) for x in items]
        except (TypeError, ValueError) as exc:
            raise UserError(f"{what}.{key} holds a value that is not a number") from exc
        if not all(math.isfinite(x) for x in out[key]):
            raise UserError(f"{what}.{key} holds a value that is not finite")
    if any(x <= 0 for x in out["std"]):
        raise UserError(f"{what}.std must be > 0 everywhere (a constant feature: give it std "
                        "1)")
    return out


def check_crf_labels(crf: CRF | None, labels: list[str]) -> None:
    """One label per tag of the CRF (UserError)."""
    if crf is not None and crf.labels != len(labels):
        raise UserError(f"the CRF scores {crf.labels} tags but {len(labels)} labels were given "
                        f"({', '.join(labels)}): give one label per tag, in the CRF's order")


def parse_crf(value: Any) -> CRF:
    """A CRF's scores from a mapping {"transitions": (tags, tags) [previous, next],
    "start": (tags,), "end": (tags,)} (lists, numpy arrays or tensors), a JSON file of one, or
    a .npy file laid out as a bundle's crf.npy (export/crf.py); UserError naming the flaw."""
    import json

    if isinstance(value, str | os.PathLike):
        path = Path(value)
        if not path.is_file():
            raise UserError(f"{path}: no such CRF file (a .npy laid out as a bundle's crf.npy, "
                            "or JSON: {\"transitions\": [[...]], \"start\": [...], \"end\": "
                            "[...]})")
        if path.suffix == ".npy":
            try:
                array = np.load(path, allow_pickle=False)
            except (OSError, ValueError) as exc:
                raise UserError(f"{path}: not a readable .npy array ({exc})") from exc
            if array.ndim != 2 or array.shape[0] != array.shape[1] + 2:
                raise UserError(f"{path}: a CRF .npy is (tags + 2, tags): the transitions, then "
                                f"the start and end rows; got {array.shape}")
            value = {"transitions": array[:-2], "start": array[-2], "end": array[-1]}
        else:
            try:
                value = json.loads(path.read_text(encoding="utf-8"))
            except ValueError as exc:
                raise UserError(f"{path}: not valid JSON ({exc})") from exc
    if not isinstance(value, dict) or set(value) != {"transitions", "start", "end"}:
        raise UserError(f"crf must be {{\"transitions\": ..., \"start\": ..., \"end\": ...}}, "
                        f"got {value!r:.80}")
    arrays = [v.detach().cpu().numpy() if hasattr(v, "detach") else v
              for v in (value["transitions"], value["start"], value["end"])]
    try:
        return CRF.from_arrays(*arrays)
    except (TypeError, ValueError) as exc:
        raise UserError(f"crf: {exc}") from exc


def pack_series_bundle(task: str, graph: PackedGraph, repo: str | os.PathLike[str], name: str,
                       *, features: int, outputs: int, labels: list[str] | None = None,
                       normalization: Any = None, output_scale: Any = None,
                       state_dim: int | None = None, version: int | None = None,
                       max_steps: int = 128, source: dict[str, Any] | None = None,
                       opset: int | None = None, progress: bool = True,
                       grid: dict[str, Any] | None = None,
                       source_run: dict[str, Any] | None = None) -> Path:
    """Write and verify `repo/name/version` of a feature-sequence task (sequence-classifier,
    sequence-tagger) from its one packed graph (see module doc); returns its path.
    `source_run`: the manifest's {"path", "config", "test_metrics"} of a seqserve training run
    (export_run of a forecaster run); none for a user's own model."""
    check_args(name, version, ["onnx"])
    labels = list(labels or [])
    if len(set(labels)) != len(labels):
        raise UserError(f"labels {labels} repeat a label")
    if labels and len(labels) < 2:
        raise UserError("a classifying bundle needs at least two labels (or give outputs= "
                        "for a regression)")
    if labels and output_scale is not None:
        raise UserError("output_scale de-normalises regression outputs; a model with labels "
                        "has class scores")
    if max_steps < 1 or features < 1:
        raise UserError(f"features ({features}) and max_steps ({max_steps}) must be >= 1")
    norm = parse_stats(normalization, "normalization", features)
    scale = parse_stats(output_scale, "output_scale", outputs)
    graphs = {GRAPHS_BY_TASK[task][0]: graph}

    def build(tmp: Path, version: int, target: Path) -> Manifest:
        return Manifest(task=task, name=name, version=version, labels=labels,
                        limits={"max_steps": int(max_steps)},
                        graphs=_write_graphs(tmp, graphs), opset=_opset(opset, graphs),
                        source=_source(source, graphs), features=int(features),
                        outputs=int(outputs), normalization=norm, output_scale=scale,
                        state_dim=None if state_dim is None else int(state_dim),
                        source_run=dict(source_run or {}))

    return _write(repo, name, version, graphs, build, grid or {}, progress,
                  UserNames.from_source(task, source))


def series_labels(labels: Any, outputs: int | None, flags: bool) -> list[str]:
    """A feature-sequence model's labels (a classifying model) or none (a regression: then
    `outputs` is needed), checked against `outputs`; errors name the CLI's flags with
    `flags`, else the Python API's arguments."""
    names = parse_labels(labels) if labels is not None else []
    if not names and outputs is None:
        raise UserError("give --labels (a classifying model) or --outputs N (a regression)"
                        if flags else "give labels= (a classifying model: one name per "
                        "output) or outputs= (a regression: how many numbers per series or "
                        "step)")
    if names and outputs is not None and outputs != len(names):
        raise UserError(f"{'--outputs ' if flags else 'outputs='}{outputs} but {len(names)} "
                        "labels: give one of them")
    return names


def _check_series_sizes(manifest: Manifest, runners: dict[str, dict[str, Runner]]) -> None:
    """The graph's outputs per step or series against the declared outputs (or labels), its
    new_state against state_dim, on a (1, 3, features) series."""
    graph = GRAPHS_BY_TASK[manifest.task][0]
    inputs: dict[str, np.ndarray] = {
        "features": np.zeros((1, 3, manifest.features or 1), np.float32),
        "lengths": np.array([3], np.int64)}
    if manifest.state_dim:
        inputs["state"] = np.zeros((1, manifest.state_dim), np.float32)
    for fmt, run in runners.items():
        try:
            out = run[graph](inputs)
        except Exception as exc:  # the runtime's own error, named
            raise BundleError(f"{fmt}: {graph} graph fails on a (1, 3, {manifest.features}) "
                              f"series: {exc}") from exc
        got = out["outputs"].shape[-1]
        if got != manifest.outputs:
            what = f"{len(manifest.labels)} labels" if manifest.labels else \
                f"outputs={manifest.outputs}"
            raise UserError(f"the graph gives {got} outputs per "
                            f"{'step' if manifest.task == 'sequence-tagger' else 'series'} but "
                            f"{what} was given")


def _tokenizer(out: Path, path: Path, stem: str, overrides: dict[str, Any] | None
               ) -> TokenizerSpec:
    if not path.is_file():
        raise UserError(f"{path}: no such tokenizer file (a tokenizer.json or a SentencePiece "
                        ".model)")
    kind = tokenizer_kind(path)
    file = f"{stem}.json" if kind == "tokenizers" else f"{stem}.model"
    ids = special_ids(path, overrides)
    shutil.copyfile(path, out / file)
    return TokenizerSpec(file, ids.vocab_size, ids.pad_id, ids.unk_id, ids.bos_id, ids.eos_id,
                         kind)


def _write_graphs(out: Path, graphs: dict[str, PackedGraph]) -> dict[str, GraphSpec]:
    import onnx

    specs: dict[str, GraphSpec] = {}
    for graph, packed in graphs.items():
        onnx_file = ts_file = None
        want = expected_spec(graph, packed.outputs, packed.inputs_given)
        if packed.onnx is not None:
            onnx_file = f"{graph}.onnx"
            if packed.onnx.ByteSize() > 2_000_000_000:
                raise UserError(f"{graph}: the graph is over 2 GB; a bundle keeps each graph "
                                "in one file")
            copy = onnx.ModelProto()
            copy.CopyFrom(packed.onnx)  # declared data dims made dynamic in the bundle's copy
            relax_data_dims(copy, GraphSpec(want.inputs, want.outputs,
                                            tensor_names=dict(packed.tensor_names)))
            onnx.save(copy, str(out / onnx_file))
        if packed.torchscript is not None:
            import torch

            ts_file = f"{graph}.pt"
            torch.jit.save(packed.torchscript, str(out / ts_file))
        if onnx_file is None and ts_file is None:
            raise UserError(f"graph {graph}: give an ONNX file (a TorchScript twin is optional)")
        specs[graph] = GraphSpec(want.inputs, want.outputs, onnx_file, ts_file,
                                 tensor_names=dict(packed.tensor_names))
    return specs


def _first_id(vocab: int) -> int:
    return 1 if vocab > 1 else 0


def _grid(manifest: Manifest, overrides: dict[str, Any]) -> ParityGrid:
    src, tgt = manifest.tokenizer, manifest.target
    overrides = {"state_dim": int(manifest.state_dim or 0), **overrides}
    return ParityGrid(max_length=int(manifest.limits["max_tokens"]), vocab_size=src.vocab_size,
                      pad_id=max(src.pad_id, 0), target_vocab_size=tgt.vocab_size,
                      first_id=_first_id(min(src.vocab_size, tgt.vocab_size)), **overrides)


def _check_sizes(manifest: Manifest, runners: dict[str, dict[str, Runner]],
                 users: UserNames) -> None:
    """The label count against the graph's output; vocabularies against the step's."""
    task = manifest.task
    fmt = next(iter(runners))
    first = GRAPHS_BY_TASK[task][0]
    ids = np.full((1, 3), _first_id(manifest.tokenizer.vocab_size), np.int64)
    lengths = np.array([3], np.int64)
    names = [t.name for t in manifest.graphs[first].inputs]
    feed = {names[0]: ids, names[1]: lengths}
    if "initial_state" in names:  # a prefill from zeros
        feed["initial_state"] = np.zeros((1, int(manifest.state_dim or 0)), np.float32)
    try:
        out = runners[fmt][first](feed)
    except Exception as exc:  # the runtime's own error, named
        raise BundleError(f"{users.file(first)}: the {first} graph fails on a (1, 3) batch of "
                          f"token ids: {exc}") from exc
    _check_embedding(runners[fmt][first], feed, names[0], manifest.tokenizer.vocab_size,
                     users.file(first), first)
    if task == "lm":
        _check_lm_sizes(runners[fmt], manifest, out, fmt)
        return
    n = len(manifest.labels)
    key = {"classifier": "logits", "tagger": "log_probs"}.get(task)
    if key is not None and out[key].shape[-1] != n:
        per = " per token" if task == "tagger" else ""
        raise UserError(f"{users.tensor(f'{first}.{key}')} has {out[key].shape[-1]} scores"
                        f"{per} but {n} labels were given ({', '.join(manifest.labels)}): "
                        "give one label per score, in the order of the scores (--labels)")


def _check_embedding(run: Runner, feed: dict[str, Any], ids: str, vocab: int, file: str,
                     graph: str) -> None:
    """Every id the tokenizer can give must run: a graph whose embedding has fewer rows than
    the tokenizer has tokens is refused with both sizes (the rows found by bisection: the
    first id the graph fails on), not with the runtime's Gather error on a served text."""
    def runs(token: int) -> bool:
        try:
            run({**feed, ids: np.full(feed[ids].shape, token, np.int64)})
        except Exception:
            return False
        return True

    if vocab <= 1 or runs(vocab - 1):
        return
    low, high = 0, vocab - 1  # runs(low), not runs(high)
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (mid, high) if runs(mid) else (low, mid)
    raise BundleError(f"{file}: the {graph} graph takes token ids below {high} (its embedding "
                      f"has {high} rows) but the tokenizer has {vocab} tokens: a text with a "
                      f"token from id {high} on would fail; give the tokenizer the model was "
                      "trained with, or a model whose embedding covers the tokenizer")


def _check_lm_sizes(runners: dict[str, Runner], manifest: Manifest, out: dict[str, Any],
                    fmt: str) -> None:
    """A language model's vocabulary (prefill and step) against its tokenizer's, and the
    prefill's state against the one the step takes and returns."""
    vocab = manifest.tokenizer.vocab_size
    if out["log_probs"].shape[-1] != vocab:
        raise UserError(f"the prefill graph gives {out['log_probs'].shape[-1]} log-probs per "
                        f"position but the tokenizer has {vocab} tokens: the model's output "
                        "layer must have one row per tokenizer id (is it the model's own "
                        "tokenizer?)")
    state = np.ascontiguousarray(out["state"])
    ids = np.array([_first_id(vocab)], np.int64)
    try:
        step = runners["lm_step"]({"prev_ids": ids, "state": state})
    except Exception as exc:  # the runtime's own error, named
        raise BundleError(f"{fmt}: the lm_step graph fails on the prefill's state (1, "
                          f"{state.shape[1]}): {str(exc)[:300]}. The prefill's state tensors "
                          "must be the step's, same sizes in the same order") from exc
    if step["new_state"].shape != state.shape:
        raise BundleError(f"{fmt}: the prefill's state is {state.shape[1]} wide but lm_step "
                          f"returns a new_state {step['new_state'].shape[1]} wide from it: "
                          "the prefill's state tensors must be the step's, same sizes in the "
                          "same order")
    if step["log_probs"].shape[-1] != vocab:
        raise UserError(f"the step graph gives {step['log_probs'].shape[-1]} log-probs per row "
                        f"but the tokenizer has {vocab} tokens")


LM_STATE_FIX = "seqserve.pack.lm(module)"
LENGTH_AWARE_FIX = "seqserve.pack.length_aware(your_rnn)"


def _lm_fault(fmt: str, key: str, value: float, tol: float) -> str:
    if key == "prefill.state":
        return (f"- {fmt}: batch invariance of prefill.state is broken: a prompt's state "
                f"differs by {value:.3g} (> {tol:g}) between the prompt run alone and in a "
                "padded batch: the state is not the one after each prompt's last token (a "
                "native nn.LSTM / nn.GRU returns the state after the batch's padding). Fix: "
                "export the prefill with a lengths input and "
                f"{LENGTH_AWARE_FIX} (call it as rnn(x, lengths, hx)), use ONNX LSTM / GRU / "
                f"RNN nodes (pack gives them sequence_lens), or pack the module with "
                f"{LM_STATE_FIX}")
    return (f"- {fmt}: batch invariance of {key} is broken: a row's output differs by "
            f"{value:.3g} (> {tol:g}) between the row run alone and the same row in a batch "
            "(or the prefill's log-probs past a row's length are not zero). A language model "
            "must be causal and treat every row on its own: no bidirectional layer, no "
            "pooling or attention over padded positions (docs/bundle-format.md, 'Graph "
            "signatures')")


def _series_fault(fmt: str, key: str, value: float, tol: float) -> str:
    if key.endswith(".chunked") or key.endswith(".new_state"):
        return (f"- {fmt}: {key} differs by {value:.3g} (> {tol:g}): new_state is not the "
                "state after each row's last valid step (a native nn.GRU / nn.LSTM returns "
                "its state after the batch's padding, and the next chunk of a row must start "
                f"from where the row ended). Fix: wrap the layer with {LENGTH_AWARE_FIX} (call "
                "it as rnn(x, lengths, state); it keeps the layer's weights) and return its "
                "state (docs/bundle-format.md, 'Feature sequences')")
    return (f"- {fmt}: batch invariance of {key} is broken: a row's output differs by "
            f"{value:.3g} (> {tol:g}) between the row run alone and the same row in a batch "
            "whose padded steps hold other values (or its padded steps' outputs are not "
            "zero). Likely cause: a bidirectional RNN or a pooling over time that does not "
            f"stop at each row's length. Fix: {BIDIRECTIONAL_FIX} for a bidirectional layer, "
            "read a classifier's state at each row's last valid step (gather at lengths - 1, "
            f"or {LENGTH_AWARE_FIX}), and mask pooling (docs/bundle-format.md, 'Padding')")


def explain(report: dict[str, Any], names: UserNames | None = None) -> str:
    """A failed parity report as a refusal that names the output (the user's: `names`), the
    size of the difference, the likely cause and the fix."""
    lines = ["the packed model was refused, nothing was written:"]
    names = names or UserNames()
    lines += [names.message(line) for line in _explained(report)]
    return "\n".join(lines)


def _explained(report: dict[str, Any]) -> list[str]:
    lines = []
    tol = report["tolerances"]["invariance"]
    for fmt, row in report["invariance_max_diff"].items():
        for key, value in row.items():
            if value <= tol:
                continue
            if key.split(".")[0] in ("sequence_classifier", "sequence_tagger"):
                lines.append(_series_fault(fmt, key, value, tol))
                continue
            if key.split(".")[0] in ("prefill", "lm_step"):
                lines.append(_lm_fault(fmt, key, value, tol))
                continue
            lines.append(
                f"- {fmt}: batch invariance of {key} is broken: a row's output differs by "
                f"{value:.3g} (> {tol:g}) between the row run alone and the same row in a "
                "padded batch (or its padded positions are not zero). Likely cause: a "
                "bidirectional RNN run over the padding (its backward direction starts at "
                "the padded end, so each row's result depends on how much padding the batch "
                "adds), or pooling / attention that does not mask padded positions. Fix: run "
                "the backward direction within each row's length: replace the layer with "
                f"{BIDIRECTIONAL_FIX} (a drop-in wrapper around your nn.LSTM / nn.GRU that "
                "keeps its weights: call it as rnn(x, lengths)), and mask padded positions "
                "(docs/bundle-format.md, 'Padding')")
    tol = report["tolerances"]["parity"]
    for fmt, row in report["parity_max_abs"].items():
        for key, value in row.items():
            if not value <= tol:
                where = report.get("first_failures", {}).get(f"parity {fmt} {key}")
                at = f", first at {where}" if where else ""
                lines.append(f"- {fmt} vs {report['reference']}: {key} differs by {value:.3g} "
                             f"(> {tol:g}{at}): the two do not compute the same function "
                             "there. A graph right at the example's length and wrong at others "
                             "had a length fixed when it was exported: export it again with "
                             "the sequence axis dynamic; else export both from the same module "
                             "and weights")
    lines += [f"- {f}" for f in report["failures"] if "top-k ids" in f or "ignores its k" in f]
    return lines
