"""The bundle manifest: read, write, hash-check and list artifact bundles.

Torch-free on purpose: the server imports this module (stdlib, numpy-free even, and
`seqserve.models.errors` only). The layout is the public format of docs/bundle-format.md:

    model_repository/NAME/VERSION/manifest.json      VERSION = positive integer
                                  tokenizer.model | tokenizer.json [+ target tokenizer]
                                  GRAPH.onnx [, GRAPH.pt]

Schema version 2 adds the tokenizer's `kind`, a translator's optional `target_tokenizer`,
each graph's `tensor_names` and the optional `attention` flag; version 3 optional graph inputs
and `state_dim`; version 4 (this module writes it) a tagger's optional `crf` and a language
model's optional `chat_template`. Older manifests keep loading (their absent fields mean
what they always meant).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import Any

from seqserve.export.contract import (
    DECODERS,
    FEATURE_TASKS,
    GRAPHS_BY_TASK,
    MAX_MANIFEST_BYTES,
    MAX_SERIES_VALUES,
    MAX_TOKENIZER_BYTES,
    TASK_SPECS,
    TASKS,
    GraphSpec,
    TaskSpec,
    expected_spec,
    names,
    validate_schema,
)
from seqserve.models.errors import BundleError

SCHEMA_VERSION = 4
SUPPORTED_SCHEMAS = (1, 2, 3, 4)
MANIFEST_FILE = "manifest.json"
SIGNATURE_FILE = "manifest.sig"
"""An optional signature over manifest.json (`seqserve.export.signing`): not listed in it."""
CHECKSUM_KEY = "manifest_sha256"
@dataclass(frozen=True)
class TokenizerSpec:
    """The tokenizer file and its special ids (-1: the tokenizer has none)."""

    file: str = "tokenizer.model"  # Tokenizer file name inside the bundle.
    vocab_size: int = 0  # Number of pieces, specials included.
    pad_id: int = 0  # Padding id (right padding).
    unk_id: int = 1  # Unknown-piece id.
    bos_id: int = 2  # Beginning-of-sequence id (decoder start token).
    eos_id: int = 3  # End-of-sequence id (decoder stop token).
    # "sentencepiece" (.model) or "tokenizers" (Hugging Face tokenizer.json).
    kind: str = "sentencepiece"


@dataclass(frozen=True)
class CrfSpec:
    """A tagger's CRF (schema 4): its scores' file (export/crf.py) and unit; the graph's
    `log_probs` then hold emission scores, not normalised, decoded with Viterbi."""

    file: str = "crf.npy"  # File name inside the bundle.
    unit: str = "tokens"  # What it decodes over: every token the graph scores, in order.


@dataclass(frozen=True)
class Manifest:
    """Everything `manifest.json` records about one bundle (docs/contracts.md)."""

    task: str
    """"classifier" or "translator"."""
    name: str
    """Model name (the folder above the version)."""
    version: int
    """Positive integer version (the folder name)."""
    graphs: dict[str, GraphSpec]
    """Graph name -> spec: `classifier`, or `encoder` + `decoder_step`."""
    tokenizer: TokenizerSpec = field(default_factory=TokenizerSpec)
    """Tokenizer file and special ids."""
    created: str = ""
    """ISO 8601 UTC creation time, e.g. "2026-11-30T00:00:00Z"."""
    source_run: dict[str, Any] = field(default_factory=dict)
    """{"path", "config", "test_metrics"} of the training run."""
    labels: list[str] = field(default_factory=list)
    """Class labels in logit order (classifiers; empty for translators)."""
    limits: dict[str, int] = field(default_factory=dict)
    """{"max_tokens", "max_decode_length"}: input and output length limits."""
    opset: int | None = None
    """ONNX opset of the graphs (None when no ONNX graph was exported)."""
    parity: dict[str, Any] = field(default_factory=dict)
    """Parity report measured at export time (max abs differences, grid, tolerances)."""
    libraries: dict[str, str] = field(default_factory=dict)
    """Versions of torch, onnx, onnxruntime used at export."""
    files: dict[str, str] = field(default_factory=dict)
    """File name -> sha256 hex digest of every file in the bundle except manifest.json
    (which carries its own `manifest_sha256`, written by `write_manifest`)."""
    schema_version: int = SCHEMA_VERSION
    """Manifest schema version."""
    decoder: str | None = None
    """Translators: the decoder, "none" (fixed context: decoder_step's attention output is
    all zeros) | "bahdanau" | "luong"; None for other tasks, for packed translators and in
    older manifests (= luong)."""
    target_tokenizer: TokenizerSpec | None = None
    """Translators with separate vocabularies: the target side's tokenizer (decoder ids,
    bos/eos, the step's vocabulary); None: `tokenizer` is joint."""
    attention: bool | None = None
    """False: the bundle's attention output means nothing (a packed translator whose step
    has none: zeros); None: as the task and decoder say (`has_attention`)."""
    source: dict[str, Any] = field(default_factory=dict)
    """Packed bundles: what `seqserve pack` was given (files, names, exporter)."""
    features: int | None = None
    """Feature-sequence tasks: the width of one time step's feature vector (dim)."""
    outputs: int | None = None
    """Feature-sequence tasks: k, the outputs per series (classifier) or per step (tagger)."""
    normalization: dict[str, list[float]] | None = None
    """Feature-sequence tasks: {"mean", "std"} per input feature; the server feeds the graph
    (x - mean) / std, so clients send raw values. None: the graph takes raw values."""
    output_scale: dict[str, list[float]] | None = None
    """Feature-sequence regressions: {"mean", "std"} per output; the server answers
    outputs * std + mean (the graph's outputs are normalised). None: as the graph gives."""
    state_dim: int | None = None
    """Feature-sequence graphs that take a `state` and return `new_state`, and language models
    whose prefill takes an `initial_state` (schema 3): the flat state's width."""
    words: str | None = None
    """Text taggers: the unit that gets one label, "whitespace" (runs of non-space
    characters) or "tokenizer" (the words of a tokenizer.json's own pre-tokenizer: a BERT
    pre-tokenizer makes "Hello," two words); None (older bundles, seqserve's own taggers):
    whitespace."""
    crf: CrfSpec | None = None
    """Taggers with a CRF layer (schema 4); None: each token's best label on its own."""
    chat_template: str | None = None
    """Language models (schema 4): Jinja rendering a conversation as a prompt
    (models/text/chat_template.py); None: no /v1/chat/completions."""

    @property
    def spec(self) -> TaskSpec:
        """The task table's row of this bundle's task (export.contract.TASK_SPECS)."""
        return TASK_SPECS[self.task]

    @property
    def has_tokenizer(self) -> bool:
        """Whether the bundle reads texts (every task but the feature-sequence ones)."""
        return not self.spec.features

    def __post_init__(self) -> None:
        if self.task not in TASKS:
            raise BundleError(f"manifest: task {self.task!r} is not one of {TASKS}")
        if self.version < 1:
            raise BundleError(f"manifest: version {self.version} must be a positive integer")
        missing = [g for g in GRAPHS_BY_TASK[self.task] if g not in self.graphs]
        if missing:
            raise BundleError(f"manifest: task {self.task} needs graphs {missing}")
        if self.decoder is not None and (self.task != "translator"
                                         or self.decoder not in DECODERS):
            raise BundleError(f"manifest: decoder {self.decoder!r} needs task translator and "
                              f"one of {DECODERS}")

    @property
    def has_attention(self) -> bool:
        """Whether decoder_step's attention output means anything (False for decoder none;
        classifiers have attention pooling, taggers none)."""
        if self.attention is not None:
            return self.attention
        if self.task == "translator":
            return self.decoder != "none"
        graph = self.graphs.get("classifier")
        return graph is not None and any(t.name == "attention" for t in graph.outputs)

    @property
    def target(self) -> TokenizerSpec:
        """The tokenizer of the decoder's side (the joint one unless the bundle has two)."""
        return self.target_tokenizer or self.tokenizer

    @property
    def formats(self) -> list[str]:
        """Formats present for every graph ("onnx", "torchscript")."""
        return [
            f for f in ("onnx", "torchscript")
            if all(g.file(f) is not None for g in self.graphs.values())
        ]

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "schema_version": self.schema_version,
            "task": self.task,
            "name": self.name,
            "version": self.version,
            "created": self.created,
            "source_run": self.source_run,
            "tokenizer": asdict(self.tokenizer),
            "labels": list(self.labels),
            "limits": dict(self.limits),
            "graphs": {k: g.to_dict() for k, g in self.graphs.items()},
            "opset": self.opset,
            "parity": self.parity,
            "libraries": dict(self.libraries),
            "files": dict(sorted(self.files.items())),
        }
        if self.decoder is not None:
            d["decoder"] = self.decoder
        if self.target_tokenizer is not None:
            d["target_tokenizer"] = asdict(self.target_tokenizer)
        if self.attention is not None:
            d["attention"] = self.attention
        if self.source:
            d["source"] = self.source
        if self.words is not None:
            d["words"] = self.words
        if self.crf is not None:
            d["crf"] = asdict(self.crf)
        if self.chat_template is not None:
            d["chat_template"] = self.chat_template
        if self.task == "lm" and self.state_dim is not None:
            d["state_dim"] = self.state_dim
        if not self.has_tokenizer:
            del d["tokenizer"]
            d["features"] = self.features
            d["outputs"] = self.outputs
            for key in ("normalization", "output_scale", "state_dim"):
                if getattr(self, key) is not None:
                    d[key] = getattr(self, key)
        return d

    def served_dict(self) -> dict[str, Any]:
        """`to_dict()` as the server shows it to clients: the build machine's paths in
        `source_run` (the run's folder, its training config's data files) and `source` (what
        `pack` was given) are relative, each its last part (the manifest file keeps them)."""
        d = self.to_dict()
        for key in ("source_run", "source"):
            if key in d:
                d[key] = _relative_paths(d[key])
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Manifest:
        try:
            schema = int(d.get("schema_version", 0))
            if schema not in SUPPORTED_SCHEMAS:
                raise BundleError(
                    f"manifest: schema_version {schema} is not supported (this seqserve "
                    f"reads {', '.join(map(str, SUPPORTED_SCHEMAS))}; a newer seqserve wrote "
                    "it?)"
                )
            target = d.get("target_tokenizer")
            return cls(
                schema_version=schema,
                task=str(d["task"]),
                name=str(d["name"]),
                version=int(d["version"]),
                created=str(d.get("created", "")),
                source_run=dict(d.get("source_run") or {}),
                tokenizer=TokenizerSpec(**(d.get("tokenizer") or {})),
                labels=[str(x) for x in d.get("labels") or []],
                limits={str(k): int(v) for k, v in (d.get("limits") or {}).items()},
                graphs={k: GraphSpec.from_dict(g) for k, g in d["graphs"].items()},
                opset=None if d.get("opset") is None else int(d["opset"]),
                parity=dict(d.get("parity") or {}),
                libraries={str(k): str(v) for k, v in (d.get("libraries") or {}).items()},
                files={str(k): str(v) for k, v in (d.get("files") or {}).items()},
                decoder=None if d.get("decoder") is None else str(d["decoder"]),
                target_tokenizer=None if target is None else TokenizerSpec(**target),
                attention=None if d.get("attention") is None else bool(d["attention"]),
                source=dict(d.get("source") or {}),
                features=None if d.get("features") is None else int(d["features"]),
                outputs=None if d.get("outputs") is None else int(d["outputs"]),
                normalization=_stats(d.get("normalization")),
                output_scale=_stats(d.get("output_scale")),
                state_dim=None if d.get("state_dim") is None else int(d["state_dim"]),
                words=None if d.get("words") is None else str(d["words"]),
                crf=None if d.get("crf") is None else CrfSpec(**d["crf"]),
                chat_template=None if (c := d.get("chat_template")) is None else str(c),
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise BundleError(f"manifest: malformed field ({type(exc).__name__}: {exc})") from exc


def _stats(value: Any) -> dict[str, list[float]] | None:
    """A {"mean": [...], "std": [...]} block as floats (None stays None)."""
    if value is None:
        return None
    return {k: [float(x) for x in value[k]] for k in ("mean", "std")}


def sha256_file(path: str | os.PathLike[str], chunk: int = 1 << 20) -> str:
    """Hex sha256 of a file, read in chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def manifest_checksum(data: dict[str, Any]) -> str:
    """sha256 of the manifest's canonical JSON (sorted keys, compact), without its own
    `manifest_sha256` field: a byte changed in manifest.json changes the parsed content or
    breaks the JSON, so either way the file no longer matches."""
    body = {k: v for k, v in data.items() if k != CHECKSUM_KEY}
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(canonical.encode("ascii")).hexdigest()


def read_manifest_bytes(bundle_dir: str | os.PathLike[str]) -> bytes:
    """The bytes of `bundle_dir/manifest.json`, checked as every file it lists is: a regular
    file inside the version folder (a symbolic link out of it is refused: `inside`), and at
    most MAX_MANIFEST_BYTES, refused before more is read (the server parses and signature
    checks read it through here)."""
    path = Path(bundle_dir) / MANIFEST_FILE
    if not path.is_file():
        raise BundleError(f"{path}: manifest.json is missing")
    inside(Path(bundle_dir).resolve(), path)
    with path.open("rb") as f:
        data = f.read(MAX_MANIFEST_BYTES + 1)
    if len(data) > MAX_MANIFEST_BYTES:
        raise BundleError(f"{path}: over the {MAX_MANIFEST_BYTES >> 20} MiB a manifest.json "
                          "may have")
    return data


def inside(real_root: Path, path: Path) -> Path:
    """`path` resolved, or BundleError when it leads out of the folder `real_root` (resolved):
    a symbolic link within it, as Kubernetes volumes and git-sync publish files, is fine."""
    real = path.resolve()
    if real_root not in real.parents:
        raise BundleError(f"{path}: a symbolic link that leads out of its version folder "
                          "(a bundle's files must lie inside it)")
    return real


def read_manifest(bundle_dir: str | os.PathLike[str], require_checksum: bool = False
                  ) -> Manifest:
    """Parse `bundle_dir/manifest.json`; check its own `manifest_sha256` when present
    (required with `require_checksum`). File hashes are checked by `load_bundle`."""
    path = Path(bundle_dir) / MANIFEST_FILE
    try:
        data = json.loads(read_manifest_bytes(bundle_dir).decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BundleError(f"{path}: manifest.json is not valid JSON ({exc})") from exc
    if not isinstance(data, dict):
        raise BundleError(f"{path}: manifest.json must hold a JSON object")
    if CHECKSUM_KEY in data:
        if data[CHECKSUM_KEY] != manifest_checksum(data):
            raise BundleError(f"{path}: manifest.json was changed after export "
                              f"({CHECKSUM_KEY} does not match its content)")
    elif require_checksum:
        raise BundleError(f"{path}: manifest.json has no {CHECKSUM_KEY}")
    validate_schema(data, path=f"{path}: manifest")
    check_task_fields(data, f"{path}: manifest")
    return Manifest.from_dict(data)


def write_manifest(bundle_dir: str | os.PathLike[str], manifest: Manifest) -> Path:
    """Write `bundle_dir/manifest.json` (indented, contract key order, own checksum last)."""
    path = Path(bundle_dir) / MANIFEST_FILE
    data = manifest.to_dict()
    data[CHECKSUM_KEY] = manifest_checksum(data)
    path.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    return path


def hash_files(bundle_dir: str | os.PathLike[str]) -> dict[str, str]:
    """sha256 of every regular file in the bundle folder except manifest.json (and its
    signature)."""
    root = Path(bundle_dir)
    return {
        p.name: sha256_file(p)
        for p in sorted(root.iterdir())
        if p.name not in (MANIFEST_FILE, SIGNATURE_FILE) and p.is_file()
    }


def _referenced_files(manifest: Manifest) -> list[str]:
    names = [manifest.tokenizer.file] if manifest.has_tokenizer else []
    if manifest.target_tokenizer is not None:
        names.append(manifest.target_tokenizer.file)
    for g in manifest.graphs.values():
        names += [f for f in (g.onnx, g.torchscript) if f is not None]
    if manifest.crf is not None:
        names.append(manifest.crf.file)
    return names


def _publishing_entry(name: str) -> bool:
    """Kubernetes' atomic writer (ConfigMap, Secret, projected volumes) keeps the files of a
    folder in `..<timestamp>/`, links `..data` to it and each file to `..data/<file>`: those
    two entries are how the folder is published, not bundle files."""
    return name.startswith("..")


def verify_files(bundle_dir: str | os.PathLike[str], manifest: Manifest) -> None:
    """Check the folder against `manifest.files`; raise BundleError naming the first bad file.

    A bundle is untrusted input: every listed file must be a regular file that resolves inside
    the version folder (a symbolic link within it, as Kubernetes volumes and git-sync publish
    files, is fine; one that leads out of it, to another bundle's file or anywhere else, is
    refused), and the tokenizer at most MAX_TOKENIZER_BYTES before anything reads it."""
    root = Path(bundle_dir)
    for name in _referenced_files(manifest):
        if name not in manifest.files:
            raise BundleError(f"{root / name}: used by the manifest but has no sha256 in 'files'")
    present = {p.name for p in root.iterdir()
               if p.name not in (MANIFEST_FILE, SIGNATURE_FILE) and not _publishing_entry(p.name)}
    for name in sorted(present - set(manifest.files)):
        raise BundleError(f"{root / name}: file is not listed in the manifest")
    real_root = root.resolve()
    tokenizers = {manifest.tokenizer.file} if manifest.has_tokenizer else set()
    if manifest.target_tokenizer is not None:
        tokenizers.add(manifest.target_tokenizer.file)
    for name, digest in sorted(manifest.files.items()):
        path = root / name
        if os.sep in name or "/" in name or name in ("", ".", "..") or _publishing_entry(name):
            raise BundleError(f"{root}: manifest lists an invalid file name {name!r}")
        if not path.is_file():
            raise BundleError(f"{path}: listed in the manifest but missing")
        real = inside(real_root, path)
        if name in tokenizers and real.stat().st_size > MAX_TOKENIZER_BYTES:
            raise BundleError(f"{path}: {real.stat().st_size} bytes, over the "
                              f"{MAX_TOKENIZER_BYTES >> 20} MiB a tokenizer file may have")
        actual = sha256_file(path)
        if actual != digest:
            raise BundleError(
                f"{path}: sha256 mismatch (manifest {digest[:12]}..., file {actual[:12]}...)"
            )


def load_bundle(bundle_dir: str | os.PathLike[str], verify: bool = True,
                require_checksum: bool = False) -> Manifest:
    """Read a bundle's manifest and (by default) verify every file's sha256.

    Raises BundleError naming the file when a hash differs, a listed file is missing, a file
    exists beside the manifest without being listed, or manifest.json itself does not match
    its `manifest_sha256` (checked whenever present; required with `require_checksum`).
    """
    root = Path(bundle_dir)
    if not root.is_dir():
        raise BundleError(f"{root}: bundle folder does not exist")
    manifest = read_manifest(root, require_checksum)
    if verify:
        verify_files(root, manifest)
        check_declared(manifest, str(root / MANIFEST_FILE))
    return manifest


def check_declared(manifest: Manifest, where: str = "manifest.json") -> None:
    """The manifest's declared signatures, files, name maps and special ids must be the
    contract's: what both `seqserve verify` and the server check before running anything."""
    for name in GRAPHS_BY_TASK[manifest.task]:
        got = manifest.graphs[name]
        want = expected_spec(name, [t.name for t in got.outputs], [t.name for t in got.inputs])
        if (got.inputs, got.outputs) != (want.inputs, want.outputs):
            raise BundleError(
                f"{where}: graph {name} declares inputs {names(got.inputs)} -> outputs "
                f"{names(got.outputs)}; the contract (docs/bundle-format.md) is "
                f"{names(want.inputs)} -> {names(want.outputs)} with the dims and dtypes "
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
    if manifest.words is not None and manifest.task != "tagger":
        raise BundleError(f"{where}: words is a tagger's field, not a {manifest.task}'s")
    if manifest.crf is not None and not manifest.spec.crf:
        raise BundleError(f"{where}: crf is a tagger's field, not a {manifest.task}'s")
    if manifest.chat_template is not None and not manifest.spec.chat:
        raise BundleError(f"{where}: chat_template is a language model's field, not a "
                          f"{manifest.task}'s")
    if manifest.words == "tokenizer" and manifest.tokenizer.kind != "tokenizers":
        raise BundleError(f"{where}: words \"tokenizer\" labels the words of a tokenizer.json's "
                          f"pre-tokenizer; {manifest.tokenizer.file} is a "
                          f"{manifest.tokenizer.kind} model, whose words are whitespace words")
    if manifest.task == "translator":
        gives = any(t.name == "keys" for t in manifest.graphs["encoder"].outputs)
        takes = any(t.name == "keys" for t in manifest.graphs["decoder_step"].inputs)
        if gives != takes:
            raise BundleError(f"{where}: the encoder {'returns' if gives else 'has no'} keys "
                              f"but the decoder_step {'takes' if takes else 'has no'} keys "
                              "input: the projected attention keys come from the one and go "
                              "to the other, in both graphs or in neither")
    if manifest.task == "lm":
        takes = any(t.name == "initial_state" for t in manifest.graphs["prefill"].inputs)
        if takes != (manifest.state_dim is not None):
            raise BundleError(f"{where}: state_dim {manifest.state_dim} but the prefill "
                              f"{'takes' if takes else 'has no'} initial_state: state_dim is "
                              "the width of its flat state, given exactly when it takes one")
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
    if limit * manifest.features > MAX_SERIES_VALUES:
        raise BundleError(f"{where}: limits.max_steps {limit} x features {manifest.features} "
                          f"is over {MAX_SERIES_VALUES} values per series")


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


def _relative_paths(value: Any) -> Any:
    """`value` with every absolute path in it (a string, POSIX or Windows) replaced by its
    last part, through nested dicts and lists."""
    if isinstance(value, dict):
        return {k: _relative_paths(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_relative_paths(v) for v in value]
    if isinstance(value, str) and (PurePosixPath(value).is_absolute()
                                   or PureWindowsPath(value).is_absolute()):
        return PureWindowsPath(value).name or value
    return value
