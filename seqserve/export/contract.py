"""The public bundle contract (docs/bundle-format.md), torch-free and onnx-free: each graph's
signature, which outputs are optional, the manifest's JSON schema, and the checks that
`seqserve verify`, `seqserve pack` and the server (engine) all apply.

A graph's actual signature comes from wherever the caller can read it: the `onnx` package at
export or pack time, ONNX Runtime's session metadata in the serving install (no torch, no
onnx), as a list of (name, dtype, dims) with dims a str (symbolic), an int (fixed) or None
(unknown).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from seqserve.models.errors import BundleError

FAMILIES = ("rows", "series", "decode", "lm")
"""How a task is scheduled and called. rows: one row of token ids in, one result out, batched
by the dynamic batcher (classifier, tagger); series: the same over float feature vectors,
sessions and state when the bundle has a `state_dim`; decode: an encoder, then a decoder
step per output token with beam search across requests (translator); lm: prefill, then one
step per new token for every live sequence, streamed (language model)."""


@dataclass(frozen=True)
class TaskSpec:
    """One task of the contract: the task table every layer dispatches on (the scheduler
    that runs it, the engine call and handle, the worker, the OIP face and the routes are each
    looked up by its `task` or `family`; tests/service/test_task_table.py holds every layer's
    table to this one)."""

    task: str
    """The manifest's `task`."""
    family: str
    """One of FAMILIES."""
    graphs: tuple[str, ...]
    """The graphs a bundle of this task must carry (the first is the one `pack` names)."""
    features: bool = False
    """Inputs are float feature vectors per time step, not texts: no tokenizer."""
    shared_instance: bool = False
    """One runtime instance whose scheduler batches across requests step by step (no
    `--instances` copies)."""
    streams: bool = False
    """Answers may stream token by token (SSE, OIP generate_stream, gRPC decoupled)."""
    crf: bool = False
    """A bundle may carry a CRF over its per-token scores (the manifest's `crf`): its rows
    are then decoded with Viterbi (export/crf.py), not label by label."""
    chat: bool = False
    """A bundle may carry a chat template (the manifest's `chat_template`, Jinja as Hugging
    Face tokenizer configs carry one): /v1/chat/completions renders conversations with it."""


TASK_SPECS: dict[str, TaskSpec] = {spec.task: spec for spec in (
    TaskSpec("classifier", "rows", ("classifier",)),
    TaskSpec("translator", "decode", ("encoder", "decoder_step"), shared_instance=True),
    TaskSpec("tagger", "rows", ("tagger",), crf=True),
    TaskSpec("lm", "lm", ("prefill", "lm_step"), shared_instance=True, streams=True,
             chat=True),
    TaskSpec("sequence-classifier", "series", ("sequence_classifier",), features=True),
    TaskSpec("sequence-tagger", "series", ("sequence_tagger",), features=True),
)}
TASKS = tuple(TASK_SPECS)
FEATURE_TASKS = tuple(t for t, spec in TASK_SPECS.items() if spec.features)
"""Tasks whose inputs are float feature vectors per time step, not texts: no tokenizer."""
GRAPHS_BY_TASK = {t: spec.graphs for t, spec in TASK_SPECS.items()}


def task_spec(task: str) -> TaskSpec:
    """The table's row of `task`; LookupError for a task the contract does not have."""
    spec = TASK_SPECS.get(task)
    if spec is None:
        raise LookupError(f"task {task!r} is not one of {TASKS}")
    return spec


CRF_UNITS = ("tokens",)
"""What a tagger's CRF decodes over (the manifest's `crf.unit`): "tokens", every token the
tagger graph scores, in order."""

DECODERS = ("none", "bahdanau", "luong")
"""Translator decoders (models/nn/decoders.py); a translator manifest without one is luong."""


@dataclass(frozen=True)
class TensorSpec:
    """One graph input or output as declared in the manifest."""

    name: str
    """Tensor name in the ONNX graph (and position in the TorchScript tuple)."""
    dtype: str
    """numpy-style dtype name: "int64", "float32" or "bool"."""
    shape: tuple[str | int, ...]
    """Symbolic dim names (strings); a fixed int only where the contract says so."""

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TensorSpec:
        return cls(name=str(d["name"]), dtype=str(d["dtype"]), shape=tuple(d["shape"]))

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "dtype": self.dtype, "shape": list(self.shape)}


@dataclass(frozen=True)
class GraphSpec:
    """One exported graph: its files (per format) and its signature."""

    inputs: tuple[TensorSpec, ...]
    """Inputs in positional order (the TorchScript twin takes them in this order)."""
    outputs: tuple[TensorSpec, ...]
    """Outputs in order (the TorchScript twin returns them as a tuple in this order)."""
    onnx: str | None = None
    """File name of the ONNX graph inside the bundle, or None when not exported."""
    torchscript: str | None = None
    """File name of the TorchScript twin inside the bundle, or None when not exported."""
    rnn_form: str | None = None
    """How its recurrent layers are exported: "native" ONNX RNN ops or a "loop" of standard
    ops (LSTM variants); None in older manifests."""
    tensor_names: dict[str, str] = field(default_factory=dict)
    """Contract tensor name -> the ONNX graph's own name, for graphs kept as their authors
    exported them (`seqserve pack --input-names/--output-names`); empty: the same names."""

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> GraphSpec:
        return cls(
            inputs=tuple(TensorSpec.from_dict(x) for x in d["inputs"]),
            outputs=tuple(TensorSpec.from_dict(x) for x in d["outputs"]),
            onnx=d.get("onnx"),
            torchscript=d.get("torchscript"),
            rnn_form=d.get("rnn_form"),
            tensor_names={str(k): str(v) for k, v in (d.get("tensor_names") or {}).items()},
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.onnx is not None:
            out["onnx"] = self.onnx
        if self.torchscript is not None:
            out["torchscript"] = self.torchscript
        if self.rnn_form is not None:
            out["rnn_form"] = self.rnn_form
        if self.tensor_names:
            out["tensor_names"] = dict(self.tensor_names)
        out["inputs"] = [t.to_dict() for t in self.inputs]
        out["outputs"] = [t.to_dict() for t in self.outputs]
        return out

    def file(self, fmt: str) -> str | None:
        """The file for format "onnx" or "torchscript" (None when that format is absent)."""
        if fmt not in ("onnx", "torchscript"):
            raise ValueError(f"unknown format {fmt!r}; expected 'onnx' or 'torchscript'")
        return self.onnx if fmt == "onnx" else self.torchscript



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
             _spec("state", "float32", "batch", "state_dim"),
             _spec("keys", "float32", "batch", "src_len", "key_dim")),
)
DECODER_STEP_SPEC = GraphSpec(
    inputs=(_spec("prev_ids", "int64", "rows"),
            _spec("state", "float32", "rows", "state_dim"),
            _spec("memory", "float32", "batch", "src_len", "mem_dim"),
            _spec("src_mask", "bool", "batch", "src_len"),
            _spec("memory_index", "int64", "rows"),
            _spec("k", "int64", 1),
            _spec("keys", "float32", "batch", "src_len", "key_dim")),
    outputs=(_spec("new_state", "float32", "rows", "state_dim"),
             _spec("topk_logprobs", "float32", "rows", "k"),
             _spec("topk_ids", "int64", "rows", "k"),
             _spec("attention", "float32", "rows", "src_len")),
)
PREFILL_SPEC = GraphSpec(
    inputs=(_spec("input_ids", "int64", "batch", "seq"), _spec("lengths", "int64", "batch"),
            _spec("initial_state", "float32", "batch", "state_dim")),
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
                                                "encoder": ("keys",),
                                                "sequence_classifier": ("new_state",),
                                                "sequence_tagger": ("new_state",)}
"""Outputs a graph may leave out (a classifier without attention: `return_attention` is a
400; a translator's encoder without projected attention keys; a feature-sequence graph
without state)."""
STATE_INPUTS: dict[str, tuple[str, str]] = {"sequence_classifier": ("state", "new_state"),
                                            "sequence_tagger": ("state", "new_state")}
"""Optional inputs that come with an optional output: a feature-sequence graph takes `state`
exactly when it returns `new_state`."""
OPTIONAL_INPUTS: dict[str, tuple[str, ...]] = {"prefill": ("initial_state",),
                                               "decoder_step": ("keys",)}
"""Inputs a graph may leave out (schema 3): a language model's prefill that takes the flat
`initial_state` to start from continues a cached prefix or a client's state token in one
call; without it the server feeds those tokens through `lm_step`. A translator's decoder
step that takes `keys` (the encoder's optional output: the memory projected for attention
scores, once per request) scores against them instead of projecting the memory at every
step; it takes them exactly when the encoder returns them (`check_declared`)."""
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


def expected_spec(graph: str, outputs: Sequence[str],
                  inputs_given: Sequence[str] = ()) -> GraphSpec:
    """The contract of `graph` for a bundle that declares `outputs` and (for the optional
    inputs, `OPTIONAL_INPUTS`) `inputs_given`: what it leaves out is dropped; the order stays
    the contract's."""
    want = SPECS[graph]
    optional = OPTIONAL_OUTPUTS.get(graph, ())
    kept = tuple(t for t in want.outputs if t.name not in optional or t.name in outputs)
    left_out = set(OPTIONAL_INPUTS.get(graph, ())) - set(inputs_given)
    inputs = tuple(t for t in want.inputs if t.name not in left_out)
    if graph in STATE_INPUTS:
        given, returned = STATE_INPUTS[graph]
        if returned not in outputs:
            inputs = tuple(t for t in inputs if t.name != given)
    return GraphSpec(inputs, kept)


def names(specs: Sequence[TensorSpec]) -> list[str]:
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
            f"torch.onnx.export(..., dynamo=False, dynamic_axes={{'{name}': {{{axis}: "
            f"'{contract}'}}, ...}}) (the default exporter, dynamo=True, fixes the sequence "
            "length of nn.LSTM / nn.GRU even when given a torch.export.Dim)")


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

# A bundle is untrusted input: its declared sizes are bounded before anything is allocated
# from them (`seqserve verify` builds parity batches up to the limits; the server sizes
# tables by the vocabulary). Each bound is far above what a recurrent model uses.
MAX_VOCAB = 1 << 19
"""Most tokenizer pieces (524,288: twice the largest vocabularies in use, 256k)."""
MAX_TOKENS = 1 << 14
"""Most tokens a bundle may declare for an input or a decoded output (16,384)."""
MAX_STEPS = 1 << 16
"""Most steps of a feature sequence (65,536)."""
MAX_FEATURES = 1 << 12
"""Most values per step of a feature sequence (4,096)."""
MAX_SERIES_VALUES = 1 << 22
"""Most values of one whole series, max_steps x features (4M floats, 16 MiB a row)."""
MAX_OUTPUTS = 1 << 16
"""Most outputs (or labels) of a feature-sequence model or a classifier's labels."""
MAX_STATE_DIM = 1 << 18
"""Most floats of one recurrent state row (1 MiB)."""
MAX_TOKENIZER_BYTES = 64 << 20
"""Largest tokenizer file read (a 256k-piece tokenizer.json is ~17 MB)."""
MAX_MANIFEST_BYTES = 16 << 20
"""Largest manifest.json read (refused before it is parsed: a manifest of 1,000,000 labels
took the supervisor to 164 MB to refuse). A manifest names files, graphs and up to
MAX_OUTPUTS labels: 65,536 labels of 200 characters are ~13 MB."""

_TENSOR = {"type": "object", "required": ["name", "dtype", "shape"],
           "properties": {"name": {"type": "string"},
                          "dtype": {"enum": ["float32", "int64", "bool"]},
                          "shape": {"type": "array", "items": {"type": ["string", "integer"]}}}}
_TOKENIZER = {
    "type": "object", "required": ["file", "vocab_size", "pad_id", "unk_id", "bos_id", "eos_id"],
    "properties": {"file": {"type": "string"},
                   "kind": {"enum": ["sentencepiece", "tokenizers"]},
                   "vocab_size": {"type": "integer", "minimum": 0, "maximum": MAX_VOCAB},
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
        "schema_version": {"enum": [1, 2, 3, 4]},
        "task": {"enum": list(TASKS)},
        "name": {"type": "string", "minLength": 1},
        "version": {"type": "integer", "minimum": 1},
        "created": {"type": "string"},
        "source_run": {"type": "object"},
        "source": {"type": "object"},
        "tokenizer": _TOKENIZER,
        "target_tokenizer": _TOKENIZER,
        "labels": {"type": "array", "items": {"type": "string"}, "maxItems": MAX_OUTPUTS},
        "limits": {"type": "object",
                   "properties": {"max_tokens": {"type": "integer", "minimum": 1,
                                                 "maximum": MAX_TOKENS},
                                  "max_decode_length": {"type": "integer", "minimum": 1,
                                                        "maximum": MAX_TOKENS},
                                  "max_steps": {"type": "integer", "minimum": 1,
                                                "maximum": MAX_STEPS}}},
        "features": {"type": "integer", "minimum": 1, "maximum": MAX_FEATURES},
        "outputs": {"type": "integer", "minimum": 1, "maximum": MAX_OUTPUTS},
        "normalization": _STATS,
        "output_scale": _STATS,
        "state_dim": {"type": "integer", "minimum": 1, "maximum": MAX_STATE_DIM},
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
        "words": {"enum": ["whitespace", "tokenizer"]},
        "crf": {"type": "object", "required": ["file", "unit"],
                "properties": {"file": {"type": "string"}, "unit": {"enum": list(CRF_UNITS)}}},
        "chat_template": {"type": "string", "minLength": 1},
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
    required, properties, additionalProperties, items, minimum, maximum, maxItems, minLength,
    pattern);
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
    if isinstance(data, int) and "maximum" in schema and data > schema["maximum"]:
        raise BundleError(f"{path} is {data}, above its maximum {schema['maximum']} (a "
                          "bound on what a bundle may declare: docs/bundle-format.md)")
    if isinstance(data, list) and "maxItems" in schema and len(data) > schema["maxItems"]:
        raise BundleError(f"{path} has {len(data)} items, more than {schema['maxItems']}")
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
