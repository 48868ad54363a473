"""The public bundle contract (docs/bundle-format.md), torch-free and onnx-free: each graph's
signature, which outputs are optional, the manifest's JSON schema, and the checks that
`seqserve verify`, `seqserve pack` and the server (engine) all apply.

A graph's actual signature comes from wherever the caller can read it: the `onnx` package at
export or pack time, ONNX Runtime's session metadata in the serving install (no torch, no
onnx), as a list of (name, dtype, dims) with dims a str (symbolic), an int (fixed) or None
(unknown).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from seqserve.export.manifest import (
    FEATURE_TASKS,
    GRAPHS_BY_TASK,
    TASKS,
    GraphSpec,
    Manifest,
    TensorSpec,
)
from seqserve.models.errors import BundleError


def _spec(name: str, dtype: str, *shape: str | int) -> TensorSpec:
    return TensorSpec(name, dtype, tuple(shape))


CLASSIFIER_SPEC = GraphSpec(
    inputs=(_spec("input_ids", "int64", "batch", "seq"), _spec("lengths", "int64", "batch")),
    outputs=(_spec("logits", "float32", "batch", "classes"),
             _spec("attention", "float32", "batch", "seq")),
)
TAGGER_SPEC = GraphSpec(
    inputs=(_spec("input_ids", "int64", "batch", "seq"), _spec("lengths", "int64", "batch")),
    outputs=(_spec("log_probs", "float32", "batch", "seq", "labels"),),
)
ENCODER_SPEC = GraphSpec(
    inputs=(_spec("src_ids", "int64", "batch", "src_len"),
            _spec("src_lengths", "int64", "batch")),
    outputs=(_spec("memory", "float32", "batch", "src_len", "mem_dim"),
             _spec("src_mask", "bool", "batch", "src_len"),
             _spec("state", "float32", "batch", "state_dim")),
)
DECODER_STEP_SPEC = GraphSpec(
    inputs=(_spec("prev_ids", "int64", "rows"),
            _spec("state", "float32", "rows", "state_dim"),
            _spec("memory", "float32", "batch", "src_len", "mem_dim"),
            _spec("src_mask", "bool", "batch", "src_len"),
            _spec("memory_index", "int64", "rows"),
            _spec("k", "int64", 1)),
    outputs=(_spec("new_state", "float32", "rows", "state_dim"),
             _spec("topk_logprobs", "float32", "rows", "k"),
             _spec("topk_ids", "int64", "rows", "k"),
             _spec("attention", "float32", "rows", "src_len")),
)
PREFILL_SPEC = GraphSpec(
    inputs=(_spec("input_ids", "int64", "batch", "seq"), _spec("lengths", "int64", "batch")),
    outputs=(_spec("state", "float32", "batch", "state_dim"),
             _spec("log_probs", "float32", "batch", "seq", "vocab")),
)
LM_STEP_SPEC = GraphSpec(
    inputs=(_spec("prev_ids", "int64", "rows"), _spec("state", "float32", "rows", "state_dim")),
    outputs=(_spec("new_state", "float32", "rows", "state_dim"),
             _spec("log_probs", "float32", "rows", "vocab")),
)
LM_SPECS = {"prefill": PREFILL_SPEC, "lm_step": LM_STEP_SPEC}
_SERIES_INPUTS = (_spec("features", "float32", "batch", "time", "feature_dim"),
                  _spec("lengths", "int64", "batch"),
                  _spec("state", "float32", "batch", "state_dim"))
SEQUENCE_CLASSIFIER_SPEC = GraphSpec(
    inputs=_SERIES_INPUTS,
    outputs=(_spec("outputs", "float32", "batch", "out_dim"),
             _spec("new_state", "float32", "batch", "state_dim")),
)
SEQUENCE_TAGGER_SPEC = GraphSpec(
    inputs=_SERIES_INPUTS,
    outputs=(_spec("outputs", "float32", "batch", "time", "out_dim"),
             _spec("new_state", "float32", "batch", "state_dim")),
)
SERIES_SPECS = {"sequence_classifier": SEQUENCE_CLASSIFIER_SPEC,
                "sequence_tagger": SEQUENCE_TAGGER_SPEC}
SPECS: dict[str, GraphSpec] = {"classifier": CLASSIFIER_SPEC, "tagger": TAGGER_SPEC,
                               "encoder": ENCODER_SPEC, "decoder_step": DECODER_STEP_SPEC,
                               **LM_SPECS, **SERIES_SPECS}
"""Graph name -> its contract signature (every output listed, optional ones included)."""
OPTIONAL_OUTPUTS: dict[str, tuple[str, ...]] = {"classifier": ("attention",),
                                                "sequence_classifier": ("new_state",),
                                                "sequence_tagger": ("new_state",)}
"""Outputs a graph may leave out (a classifier without attention: `return_attention` is a
400; a feature-sequence graph without state)."""
STATE_INPUTS: dict[str, tuple[str, str]] = {"sequence_classifier": ("state", "new_state"),
                                            "sequence_tagger": ("state", "new_state")}
"""Optional inputs that come with an optional output: a feature-sequence graph takes `state`
exactly when it returns `new_state`."""
DATA_DIMS = frozenset({"batch", "seq", "src_len", "rows", "k", "time"})
"""Dims that change from call to call: they must be symbolic in a graph. The others
(classes, labels, mem_dim, state_dim) are sizes of the model and may be fixed numbers."""
DTYPES = {"tensor(float)": "float32", "tensor(int64)": "int64", "tensor(bool)": "bool",
          "tensor(int32)": "int32", "tensor(double)": "float64", "tensor(float16)": "float16"}
"""ONNX Runtime's type strings -> the manifest's dtype names."""
ONNX_ELEM_TYPES = {1: "float32", 7: "int64", 9: "bool", 6: "int32", 11: "float64",
                   10: "float16"}
"""onnx.TensorProto element types -> dtype names."""

Signature = list[tuple[str, str, list[str | int | None]]]
"""A graph's inputs or outputs as read from its file: (name, dtype, dims)."""


def expected_spec(graph: str, outputs: Sequence[str]) -> GraphSpec:
    """The contract of `graph` for a bundle that declares `outputs` (optional outputs it
    leaves out are dropped; the order stays the contract's)."""
    want = SPECS[graph]
    optional = OPTIONAL_OUTPUTS.get(graph, ())
    kept = tuple(t for t in want.outputs if t.name not in optional or t.name in outputs)
    inputs = want.inputs
    if graph in STATE_INPUTS:
        given, returned = STATE_INPUTS[graph]
        if returned not in outputs:
            inputs = tuple(t for t in inputs if t.name != given)
    return GraphSpec(inputs, kept)


def check_declared(manifest: Manifest, where: str = "manifest.json") -> None:
    """The manifest's declared signatures, files, name maps and special ids must be the
    contract's: what both `seqserve verify` and the server check before running anything."""
    for name in GRAPHS_BY_TASK[manifest.task]:
        got = manifest.graphs[name]
        want = expected_spec(name, [t.name for t in got.outputs])
        if (got.inputs, got.outputs) != (want.inputs, want.outputs):
            raise BundleError(
                f"{where}: graph {name} declares inputs {_names(got.inputs)} -> outputs "
                f"{_names(got.outputs)}; the contract (docs/bundle-format.md) is "
                f"{_names(want.inputs)} -> {_names(want.outputs)} with the dims and dtypes "
                "listed there")
        if got.onnx is None and got.torchscript is None:
            raise BundleError(f"{where}: graph {name} has no file in any format")
        known = {t.name for t in (*got.inputs, *got.outputs)}
        unknown = sorted(set(got.tensor_names) - known)
        if unknown:
            raise BundleError(f"{where}: graph {name} maps tensors {unknown} that are not in "
                              "its signature")
    extra = sorted(set(manifest.graphs) - set(GRAPHS_BY_TASK[manifest.task]))
    if extra:
        raise BundleError(f"{where}: graphs {extra} are not part of a {manifest.task} bundle")
    if manifest.has_tokenizer:
        _check_specials(manifest, where)
    else:
        check_series(manifest, where)


def _stats_block(block: Any, size: int | None, key: str, what: str, where: str) -> None:
    if block is None:
        return
    for part in ("mean", "std"):
        values = block.get(part) if isinstance(block, Mapping) else None
        if not isinstance(values, list) or len(values) != size:
            raise BundleError(f"{where}: {key}.{part} must list one number per {what} "
                              f"({size}), got {values!r:.80}")
        if not all(isinstance(v, int | float) and math.isfinite(v) for v in values):
            raise BundleError(f"{where}: {key}.{part} holds a value that is not a finite "
                              "number")
    if any(v <= 0 for v in block["std"]):
        raise BundleError(f"{where}: {key}.std must be > 0 everywhere (a constant feature: "
                          "give it std 1)")


def check_series(manifest: Manifest, where: str = "manifest.json") -> None:
    """A feature-sequence bundle's own fields: features, outputs (= the label count when it
    has labels), normalization per feature, output_scale per output (regressions only),
    state_dim exactly when its graph returns new_state."""
    if not manifest.features or manifest.features < 1:
        raise BundleError(f"{where}: a {manifest.task} needs features (the width of one "
                          "step's feature vector, >= 1)")
    if not manifest.outputs or manifest.outputs < 1:
        raise BundleError(f"{where}: a {manifest.task} needs outputs (k, >= 1)")
    if manifest.labels:
        if len(manifest.labels) < 2 or len(manifest.labels) != manifest.outputs:
            raise BundleError(f"{where}: {len(manifest.labels)} labels for {manifest.outputs} "
                              "outputs: a classifying bundle names every output (at least two)")
        if manifest.output_scale is not None:
            raise BundleError(f"{where}: output_scale de-normalises regression outputs; a "
                              "bundle with labels has class scores")
    _stats_block(manifest.normalization, manifest.features, "normalization", "feature", where)
    _stats_block(manifest.output_scale, manifest.outputs, "output_scale", "output", where)
    graph = manifest.graphs[GRAPHS_BY_TASK[manifest.task][0]]
    stateful = any(t.name == "new_state" for t in graph.outputs)
    if stateful != (manifest.state_dim is not None) or (
            manifest.state_dim is not None and manifest.state_dim < 1):
        raise BundleError(f"{where}: state_dim {manifest.state_dim} but the graph "
                          f"{'returns' if stateful else 'has no'} new_state: state_dim is "
                          "the width of its state, given exactly when it has one")
    limit = manifest.limits.get("max_steps")
    if limit is None or limit < 1:
        raise BundleError(f"{where}: limits.max_steps (the longest series, >= 1) is missing")


def check_task_fields(data: Mapping[str, Any], where: str) -> None:
    """What the schema cannot say: text tasks need a tokenizer; feature tasks none."""
    task = data.get("task")
    if task in FEATURE_TASKS:
        if "tokenizer" in data:
            raise BundleError(f"{where}: a {task} reads feature vectors, not texts: it has no "
                              "tokenizer")
        return
    if "tokenizer" not in data:
        raise BundleError(f"{where} lacks required field(s) ['tokenizer']")


def _check_specials(manifest: Manifest, where: str) -> None:
    specs = [("tokenizer", manifest.tokenizer)]
    if manifest.target_tokenizer is not None:
        specs.append(("target_tokenizer", manifest.target_tokenizer))
    for key, tok in specs:
        size = tok.vocab_size
        for special in ("pad_id", "unk_id", "bos_id", "eos_id"):
            value = getattr(tok, special)
            if size and not -1 <= value < size:
                raise BundleError(f"{where}: {key}.{special} {value} is outside the "
                                  f"vocabulary [0, {size})")
    target = manifest.target_tokenizer or manifest.tokenizer
    if manifest.task == "translator" and (target.bos_id < 0 or target.eos_id < 0):
        raise BundleError(f"{where}: a translator's target tokenizer needs bos_id and eos_id "
                          "(the decoder's start and stop tokens); pack with --bos-token and "
                          "--eos-token")
    if manifest.task == "lm" and (manifest.tokenizer.bos_id < 0 or
                                  manifest.tokenizer.eos_id < 0):
        raise BundleError(f"{where}: a language model's tokenizer needs bos_id and eos_id "
                          "(every prompt is read after bos; generation stops at eos); pack "
                          "with --bos-token and --eos-token")


def _names(specs: Sequence[TensorSpec]) -> list[str]:
    return [t.name for t in specs]


def check_signature(file: str, spec: GraphSpec, inputs: Signature, outputs: Signature,
                    strict: bool = False) -> None:
    """A graph file's actual inputs and outputs against its declared `spec` (contract names,
    mapped through `spec.tensor_names` onto the file's own names).

    Names, order, dtypes and ranks must match. Data dims (batch, seq, src_len, rows, k) must
    be symbolic; model dims (classes, labels, mem_dim, state_dim) may be fixed numbers.
    `strict` (seqserve's own export) also wants every symbolic dim named as the contract
    names it. Raises BundleError naming the tensor, the dim and the fix."""
    for kind, actual, want in (("input", inputs, spec.inputs), ("output", outputs,
                                                                spec.outputs)):
        mapped = [spec.tensor_names.get(t.name, t.name) for t in want]
        names = [a[0] for a in actual]
        if names != mapped:
            hint = ("" if spec.tensor_names or not set(names) - set(mapped) else
                    " (map the graph's own names onto the contract's with --input-names / "
                    "--output-names)")
            raise BundleError(f"{file}: graph {kind}s {names} != expected {mapped}{hint}")
        for (name, dtype, dims), t in zip(actual, want, strict=True):
            if dtype != t.dtype:
                raise BundleError(f"{file}: {kind} {name} is {dtype}, the contract's "
                                  f"{t.name} is {t.dtype}")
            if len(dims) != len(t.shape):
                raise BundleError(f"{file}: {kind} {name} has rank {len(dims)} "
                                  f"{list(dims)}, the contract's {t.name} is {list(t.shape)}")
            for axis, (got, contract) in enumerate(zip(dims, t.shape, strict=True)):
                _check_dim(file, kind, name, t, axis, got, contract, strict, list(dims))


def _check_dim(file: str, kind: str, name: str, t: TensorSpec, axis: int, got: Any,
               contract: str | int, strict: bool, dims: list[Any]) -> None:
    if isinstance(contract, int):
        if got not in (contract, None) and not (isinstance(got, str) and not strict):
            raise BundleError(f"{file}: {kind} {name} dim {axis} is {got!r}, the contract "
                              f"says {contract}")
        return
    if strict:
        if got != contract:
            frozen = "a frozen size " if isinstance(got, int) else ""
            raise BundleError(f"{file}: {kind} {name} dim {axis} is {frozen}{got!r}, "
                              f"contract says {contract!r} (declared shape {dims}, expected "
                              f"{list(t.shape)})")
        return
    if isinstance(got, int) and contract in DATA_DIMS:
        raise BundleError(
            f"{file}: {kind} {name} dim {axis} ({contract}) is frozen at {got}: the graph was "
            f"exported for that size only. Export it again with that dim dynamic: "
            f"torch.onnx.export(..., dynamic_axes={{'{name}': {{{axis}: '{contract}'}}, ...}}) "
            f"or, with dynamo=True, dynamic_shapes naming a torch.export.Dim for it")


def session_signature(session: Any) -> tuple[Signature, Signature]:
    """(inputs, outputs) of an ONNX Runtime InferenceSession, from its metadata."""
    def read(args: Any) -> Signature:
        return [(a.name, DTYPES.get(a.type, a.type), [d if isinstance(d, int | str) else None
                                                       for d in a.shape]) for a in args]

    return read(session.get_inputs()), read(session.get_outputs())


def onnx_signature(model: Any) -> tuple[Signature, Signature]:
    """(inputs, outputs) of an onnx.ModelProto's graph (initializers are not inputs)."""
    inits = {t.name for t in model.graph.initializer}

    def read(values: Any) -> Signature:
        out: Signature = []
        for v in values:
            if v.name in inits:
                continue
            tt = v.type.tensor_type
            dims: list[str | int | None] = [
                d.dim_param or (d.dim_value if d.HasField("dim_value") else None)
                for d in tt.shape.dim]
            out.append((v.name, ONNX_ELEM_TYPES.get(tt.elem_type, str(tt.elem_type)), dims))
        return out

    return read(model.graph.input), read(model.graph.output)


# -- manifest.json schema ---------------------------------------------------------------

_TENSOR = {"type": "object", "required": ["name", "dtype", "shape"],
           "properties": {"name": {"type": "string"},
                          "dtype": {"enum": ["float32", "int64", "bool"]},
                          "shape": {"type": "array", "items": {"type": ["string", "integer"]}}}}
_TOKENIZER = {
    "type": "object", "required": ["file", "vocab_size", "pad_id", "unk_id", "bos_id", "eos_id"],
    "properties": {"file": {"type": "string"},
                   "kind": {"enum": ["sentencepiece", "tokenizers"]},
                   "vocab_size": {"type": "integer", "minimum": 0},
                   **{k: {"type": "integer", "minimum": -1}
                      for k in ("pad_id", "unk_id", "bos_id", "eos_id")}},
}
_STATS = {"type": "object", "required": ["mean", "std"],
          "properties": {"mean": {"type": "array", "items": {"type": "number"}},
                         "std": {"type": "array", "items": {"type": "number"}}}}
MANIFEST_SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "seqserve bundle manifest (manifest.json)",
    "type": "object",
    "required": ["schema_version", "task", "name", "version", "graphs", "files"],
    "properties": {
        "schema_version": {"enum": [1, 2]},
        "task": {"enum": list(TASKS)},
        "name": {"type": "string", "minLength": 1},
        "version": {"type": "integer", "minimum": 1},
        "created": {"type": "string"},
        "source_run": {"type": "object"},
        "source": {"type": "object"},
        "tokenizer": _TOKENIZER,
        "target_tokenizer": _TOKENIZER,
        "labels": {"type": "array", "items": {"type": "string"}},
        "limits": {"type": "object",
                   "properties": {"max_tokens": {"type": "integer", "minimum": 1},
                                  "max_decode_length": {"type": "integer", "minimum": 1},
                                  "max_steps": {"type": "integer", "minimum": 1}}},
        "features": {"type": "integer", "minimum": 1},
        "outputs": {"type": "integer", "minimum": 1},
        "normalization": _STATS,
        "output_scale": _STATS,
        "state_dim": {"type": "integer", "minimum": 1},
        "graphs": {"type": "object", "additionalProperties": {
            "type": "object", "required": ["inputs", "outputs"],
            "properties": {"onnx": {"type": "string"}, "torchscript": {"type": "string"},
                           "rnn_form": {"enum": ["native", "loop", "cell"]},
                           "tensor_names": {"type": "object",
                                            "additionalProperties": {"type": "string"}},
                           "inputs": {"type": "array", "items": _TENSOR},
                           "outputs": {"type": "array", "items": _TENSOR}}}},
        "opset": {"type": ["integer", "null"]},
        "parity": {"type": "object"},
        "libraries": {"type": "object", "additionalProperties": {"type": "string"}},
        "files": {"type": "object", "additionalProperties": {"type": "string",
                                                             "pattern": "^[0-9a-f]{64}$"}},
        "decoder": {"enum": ["none", "bahdanau", "luong"]},
        "attention": {"type": "boolean"},
        "manifest_sha256": {"type": "string", "pattern": "^[0-9a-f]{64}$"},
    },
}
"""The JSON schema of manifest.json (docs/manifest.schema.json is this, written out)."""

_TYPES: dict[str, tuple[type, ...]] = {"object": (dict,), "array": (list,), "string": (str,),
                                       "integer": (int,), "number": (int, float),
                                       "boolean": (bool,),
                                       "null": (type(None),)}


def validate_schema(data: Any, schema: Mapping[str, Any] = MANIFEST_SCHEMA,
                    path: str = "manifest") -> None:
    """Check `data` against the subset of JSON Schema that MANIFEST_SCHEMA uses (type, enum,
    required, properties, additionalProperties, items, minimum, minLength, pattern);
    BundleError naming the field."""
    import re

    if "enum" in schema and data not in schema["enum"]:
        raise BundleError(f"{path} is {data!r}, expected one of {schema['enum']}")
    if "type" in schema:
        kinds = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
        ok = any(isinstance(data, _TYPES[k])
                 and not (k in ("integer", "number") and isinstance(data, bool))
                 for k in kinds)
        if not ok:
            raise BundleError(f"{path} is {type(data).__name__} {data!r:.60}, expected "
                              f"{' or '.join(kinds)}")
    if isinstance(data, bool):
        return
    if isinstance(data, int) and "minimum" in schema and data < schema["minimum"]:
        raise BundleError(f"{path} is {data}, below its minimum {schema['minimum']}")
    if isinstance(data, str):
        if len(data) < schema.get("minLength", 0):
            raise BundleError(f"{path} is empty")
        if "pattern" in schema and not re.search(schema["pattern"], data):
            raise BundleError(f"{path} {data!r:.40} does not match {schema['pattern']}")
    if isinstance(data, dict):
        missing = [k for k in schema.get("required", ()) if k not in data]
        if missing:
            raise BundleError(f"{path} lacks required field(s) {missing}")
        props = schema.get("properties", {})
        for key, value in data.items():
            sub = props.get(key, schema.get("additionalProperties"))
            if isinstance(sub, Mapping):
                validate_schema(value, sub, f"{path}.{key}")
    if isinstance(data, list) and isinstance(schema.get("items"), Mapping):
        for i, item in enumerate(data):
            validate_schema(item, schema["items"], f"{path}[{i}]")
