"""What a bundle expects and returns (`seqserve inspect BUNDLE`), read from its manifest and
its ONNX graphs (the `onnx` package, graphs only: no weights are run, torch is never
imported): each graph's tensors (the contract's name, the name in the file, dtype, shape with
its dynamic axes), the tokenizer and its special tokens, the limits (and the server's flag
that caps them), the labels, and a request to send: the native route and its body, the Open
Inference Protocol (KServe v2) body and a ready `curl` command."""

from __future__ import annotations

import json
import os
import shlex
from pathlib import Path
from typing import Any

from seqserve.export.contract import DATA_DIMS
from seqserve.export.manifest import MANIFEST_FILE, Manifest, read_manifest
from seqserve.models.errors import BundleError, UserError

ROUTES = {"classifier": "classify", "tagger": "tag", "translator": "translate",
          "lm": "generate", "sequence-classifier": "predict", "sequence-tagger": "predict"}
"""The native (/v1) route of each task."""
RETURNS = {
    "classifier": "per text: label, probability, the top_k labels with their probabilities "
                  "(return_attention: attention over its tokens, when the graph has it)",
    "tagger": "per text: tokens, one per word (token, start, end, label, probability)",
    "translator": "per text: translation, score (log-probability), n_best hypotheses with "
                  "beam_size > 1 (return_attention: attention per target token)",
    "lm": "per prompt: the generated text and its tokens; /score gives per-token "
          "log-probabilities, /v1/completions the OpenAI shape",
    "sequence-classifier": "per series: outputs (k numbers){labels}",
    "sequence-tagger": "per series: outputs, k numbers per step, and steps{labels}",
}
ONNX_TYPES = {1: "float32", 2: "uint8", 3: "int8", 5: "int16", 6: "int32", 7: "int64",
              9: "bool", 10: "float16", 11: "float64", 16: "bfloat16"}
SAMPLE_TEXT = "your text here"


def version_dir(path: str | os.PathLike[str]) -> tuple[Path, list[int]]:
    """The version folder of `path` (a version folder, or a model folder: its highest
    version) and the model's versions (empty when `path` is a version folder)."""
    path = Path(path)
    if (path / MANIFEST_FILE).is_file():
        return path, []
    if not path.is_dir():
        raise UserError(f"{path}: no such folder (give a bundle: model_repository/NAME or "
                        "model_repository/NAME/VERSION)")
    versions = sorted(int(p.name) for p in path.iterdir()
                      if p.is_dir() and p.name.isdigit() and (p / MANIFEST_FILE).is_file())
    if not versions:
        raise UserError(f"{path}: not a bundle: no {MANIFEST_FILE} in it nor in a version "
                        "folder (NAME/1/manifest.json)")
    return path / str(versions[-1]), versions


def _dims(value_type: Any) -> list[str | int]:
    shape = value_type.tensor_type.shape
    return [d.dim_param or (int(d.dim_value) if d.HasField("dim_value") else "?")
            for d in shape.dim]


def _graph_file(bundle: Path, file: str) -> dict[str, list[tuple[str, str, list[str | int]]]]:
    """The inputs and outputs of an ONNX file as (name, dtype, dims), its weights not read."""
    import onnx

    try:
        model = onnx.load(str(bundle / file), load_external_data=False)
    except Exception as exc:  # onnx raises DecodeError and others for a damaged file
        raise BundleError(f"{file}: not a readable ONNX graph ({exc})") from exc
    inits = {i.name for i in model.graph.initializer}

    def rows(values: Any) -> list[tuple[str, str, list[str | int]]]:
        return [(v.name, ONNX_TYPES.get(v.type.tensor_type.elem_type, "other"), _dims(v.type))
                for v in values if v.name not in inits]

    return {"inputs": rows(model.graph.input), "outputs": rows(model.graph.output)}


def _tensors(bundle: Path, manifest: Manifest) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, spec in manifest.graphs.items():
        in_file = _graph_file(bundle, spec.onnx) if spec.onnx else {"inputs": [], "outputs": []}
        graph: dict[str, Any] = {"onnx": spec.onnx, "torchscript": spec.torchscript}
        for side in ("inputs", "outputs"):
            found = {row[0]: row for row in in_file[side]}
            listed = []
            for t in getattr(spec, side):
                file_name = spec.tensor_names.get(t.name, t.name)
                _, dtype, dims = found.get(file_name, (file_name, t.dtype, list(t.shape)))
                dynamic = [str(got) for got, want in zip(dims, t.shape, strict=False)
                           if want in DATA_DIMS]
                listed.append({"name": t.name, "in_file": file_name, "dtype": dtype,
                               "shape": dims, "contract": list(t.shape), "dynamic": dynamic})
            graph[side] = listed
        out[name] = graph
    return out


def _specials(bundle: Path, manifest: Manifest, side: str) -> dict[str, Any]:
    from seqserve.models.text.tokenizer_files import load_tokenizer

    spec = manifest.tokenizer if side == "tokenizer" else manifest.target_tokenizer
    assert spec is not None
    tok = load_tokenizer(bundle / spec.file, spec.kind,
                         (spec.pad_id, spec.unk_id, spec.bos_id, spec.eos_id))
    specials = {}
    for what in ("pad", "unk", "bos", "eos"):
        i = getattr(spec, f"{what}_id")
        specials[what] = {"id": i, "token": tok.id_to_piece(i) if i >= 0 else None}
    return {"file": spec.file, "kind": spec.kind, "vocab_size": spec.vocab_size,
            "specials": specials}


def _sample(manifest: Manifest) -> tuple[dict[str, Any], dict[str, Any]]:
    """A request body for the native route and one for OIP infer."""
    task = manifest.task
    if manifest.has_tokenizer:
        if task == "lm":
            return ({"prompts": ["Once upon a time"], "max_new_tokens": 20},
                    {"inputs": [{"name": "text_input", "datatype": "BYTES", "shape": [1],
                                 "data": ["Once upon a time"]}],
                     "parameters": {"max_tokens": 20}})
        body: dict[str, Any] = {"texts": [SAMPLE_TEXT]}
        if task == "translator":
            body["beam_size"] = 4
        return body, {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1],
                                  "data": [SAMPLE_TEXT]}]}
    features = manifest.features or 1
    step = (list(manifest.normalization["mean"]) if manifest.normalization
            else [0.0] * features)
    series = [[round(float(x), 4) for x in step] for _ in range(3)]
    return ({"series": [series]},
            {"inputs": [{"name": "features", "datatype": "FP32", "shape": [1, 3, features],
                         "data": [x for row in series for x in row]},
                        {"name": "lengths", "datatype": "INT64", "shape": [1], "data": [3]}]})


def _limits(manifest: Manifest) -> dict[str, Any]:
    limits: dict[str, Any] = dict(manifest.limits)
    key = "max_tokens" if manifest.has_tokenizer else "max_steps"
    if key in limits:
        flag = "--max-tokens" if key == "max_tokens" else "--max-steps"
        limits["served"] = (f"the bundle's {key} {limits[key]} (`seqserve pack {flag}`) is "
                            "capped by the server's `seqserve serve --max-tokens`: the "
                            "smaller of the two is served")
    return limits


def inspect_bundle(path: str | os.PathLike[str], url: str = "http://localhost:8000"
                   ) -> dict[str, Any]:
    """What the bundle at `path` (a version or a model folder) expects and returns."""
    bundle, versions = version_dir(path)
    manifest = read_manifest(bundle)
    route = ROUTES[manifest.task]
    body, oip = _sample(manifest)
    base = url.rstrip("/")
    native = f"/v1/models/{manifest.name}/{route}"
    labels = f" and labels {manifest.labels}" if manifest.labels else ""
    info: dict[str, Any] = {
        "bundle": str(bundle), "name": manifest.name, "version": manifest.version,
        "versions": versions or [manifest.version], "task": manifest.task,
        "graphs": _tensors(bundle, manifest), "limits": _limits(manifest),
        "labels": list(manifest.labels),
    }
    if manifest.has_tokenizer:
        info["tokenizer"] = _specials(bundle, manifest, "tokenizer")
        if manifest.target_tokenizer is not None:
            info["target_tokenizer"] = _specials(bundle, manifest, "target_tokenizer")
        if manifest.task == "tagger":
            info["words"] = manifest.words or "whitespace"
    else:
        info |= {"features": manifest.features, "outputs": manifest.outputs,
                 "normalization": manifest.normalization,
                 "output_scale": manifest.output_scale, "state_dim": manifest.state_dim,
                 "sessions": manifest.state_dim is not None}
    if manifest.task == "translator":
        info["decoder"] = manifest.decoder
        info["attention"] = manifest.has_attention
    info["request"] = {"method": "POST", "path": native, "body": body}
    info["returns"] = RETURNS[manifest.task].format(
        labels=" (labels: label and probabilities too)" if manifest.labels else "")
    info["oip"] = {"path": f"/v2/models/{manifest.name}/infer", "body": oip}
    info["curl"] = (f"curl -s -X POST {base}{native} -H 'content-type: application/json' "
                    f"-d {shlex.quote(json.dumps(body))}")
    if labels:
        info["returns"] += f"; labels in logit order: {', '.join(manifest.labels)}"
    return info


def format_inspection(info: dict[str, Any]) -> str:
    """`inspect_bundle`'s answer for a person to read."""
    lines = [f"{info['bundle']}: {info['task']} {info['name']} v{info['version']}"
             + (f" (versions {', '.join(map(str, info['versions']))}; the highest shown)"
                if len(info["versions"]) > 1 else "")]
    lines.append("graphs (contract name <- name in the file: dtype [shape]; * marks the axes "
                 "that change from call to call):")
    for name, graph in info["graphs"].items():
        files = ", ".join(f for f in (graph["onnx"], graph["torchscript"]) if f)
        lines.append(f"  {name} ({files})")
        for side in ("inputs", "outputs"):
            for t in graph[side]:
                own = "" if t["in_file"] == t["name"] else f" <- {t['in_file']}"
                shape = ", ".join(f"{d}*" if want in DATA_DIMS else str(d)
                                  for d, want in zip(t["shape"], t["contract"], strict=False))
                lines.append(f"    {side[:-1]:6} {t['name']}{own}: {t['dtype']} [{shape}]")
    for key in ("tokenizer", "target_tokenizer"):
        tok = info.get(key)
        if tok:
            specials = ", ".join(f"{w} {s['id']}" + (f" {s['token']!r}" if s["token"] else "")
                                 for w, s in tok["specials"].items())
            lines.append(f"{key.replace('_', ' ')}: {tok['file']} ({tok['kind']}, vocabulary "
                         f"{tok['vocab_size']}); specials: {specials} (-1: none)")
    if "words" in info:
        lines.append(f"words: {info['words']} (the unit that gets one label)")
    if "features" in info:
        lines.append(f"features per step: {info['features']}; outputs: {info['outputs']}; "
                     f"sessions (state kept between chunks): "
                     f"{'yes' if info['sessions'] else 'no'}")
        if info["normalization"]:
            lines.append(f"normalization (the server applies it; send raw values): "
                         f"{json.dumps(info['normalization'])}")
    limits = dict(info["limits"])
    served = limits.pop("served", None)
    lines.append(f"limits: {json.dumps(limits)}" + (f"; {served}" if served else ""))
    if info["labels"]:
        lines.append(f"labels ({len(info['labels'])}): {', '.join(info['labels'])}")
    req = info["request"]
    lines += [f"request: {req['method']} {req['path']}", f"  {json.dumps(req['body'])}",
              f"returns: {info['returns']}",
              f"Open Inference Protocol: POST {info['oip']['path']}",
              f"  {json.dumps(info['oip']['body'])}", "curl:", f"  {info['curl']}"]
    return "\n".join(lines)
