"""The OpenAPI operation of one served model's OIP infer route, with that model's exact body.

An OIP request body depends on the model behind the path (its outputs, its parameters), which
a path template cannot say, so the live document (`seqserve.service.server.openapi`) lists one infer
operation per served model and version, each with the JSON body this server accepts for it:
exactly one input `text` (BYTES, shape [n] with n texts, n from 1 to max_texts), the model's
output names, its parameters (the translate options for translators, none for the others)
and the protocol's own (`binary_data_output`, `content_type`, `headers`, `timeout`). The
binary tensor data extension is described in words: its body is not JSON.
"""

from __future__ import annotations

from typing import Any

from seqserve.service.api.oip.schemas import ProtocolParameters
from seqserve.service.api.translate import TranslateOptions

BINARY = ("Binary tensor data extension: send the JSON header followed by the tensors' bytes, "
          "with its length in the `Inference-Header-Content-Length` header and each binary "
          "input's size in its `parameters.binary_data_size` (BYTES elements: 4-byte "
          "little-endian length + bytes). Outputs asked with `binary_data` (or "
          "`binary_data_output`) come back the same way, as application/octet-stream.")


def _nullable(schema: dict[str, Any]) -> dict[str, Any]:
    return {"anyOf": [schema, {"type": "null"}]}


def _protocol_properties() -> dict[str, Any]:
    props: dict[str, Any] = ProtocolParameters.model_json_schema()["properties"]
    return props


def parameters_schema(task: str) -> dict[str, Any]:
    """The request `parameters` a model of `task` accepts."""
    if task == "translator":
        options = TranslateOptions.model_json_schema()
        schema = {**options, "properties": {**options["properties"],
                                            **_protocol_properties()}}
        schema.pop("title", None)
        return _nullable(schema)
    return _nullable({"type": "object", "additionalProperties": False,
                      "properties": _protocol_properties()})


def text_input_schema(max_texts: int, text: dict[str, Any]) -> dict[str, Any]:
    """The one input: `text`, BYTES, shape [n] with exactly n strings."""
    counts = [{"properties": {"shape": {"const": [n]},
                              "data": {"minItems": n, "maxItems": n}}}
              for n in range(1, max_texts + 1)]
    return {
        "type": "object", "additionalProperties": False,
        "required": ["name", "datatype", "shape", "data"],
        "properties": {
            "name": {"const": "text"},
            "datatype": {"const": "BYTES"},
            "shape": {"type": "array", "items": {"type": "integer"}, "minItems": 1,
                      "maxItems": 1, "description": "[n]: the number of texts."},
            "data": {"type": "array", "items": text},
            "parameters": _nullable({"type": "object",
                                     "not": {"required": ["binary_data_size"]}}),
        },
        "anyOf": counts,
    }


def infer_body_schema(task: str, outputs: list[str], max_texts: int,
                      text: dict[str, Any]) -> dict[str, Any]:
    """The JSON body of an infer request to a model of `task` with `outputs`."""
    output = {
        "type": "object", "additionalProperties": False, "required": ["name"],
        "properties": {
            "name": {"enum": outputs},
            "parameters": _nullable({"type": "object", "additionalProperties": False,
                                     "properties": {"binary_data": _nullable(
                                         {"type": "boolean"})}}),
        },
    }
    return {
        "type": "object", "additionalProperties": False, "required": ["inputs"],
        "properties": {
            "id": _nullable({"type": "string"}),
            "parameters": parameters_schema(task),
            "inputs": {"type": "array", "minItems": 1, "maxItems": 1,
                       "items": text_input_schema(max_texts, text)},
            "outputs": _nullable({"type": "array", "items": output,
                                  "description": "Outputs to return (default: all)."}),
        },
    }


def infer_operation(name: str, version: int | None, task: str, outputs: list[str],
                    max_texts: int, text: dict[str, Any],
                    errors: dict[str, Any]) -> dict[str, Any]:
    """The OpenAPI operation object of POST /v2/models/NAME[/versions/V]/infer."""
    which = f"version {version}" if version is not None else "the default version"
    slug = "".join(c if c.isalnum() else "_" for c in name)
    return {
        "tags": ["v2"],
        "summary": f"Infer: {name} ({task}, {which})",
        "description": f"OIP inference with {which} of {name}. {BINARY}",
        "operationId": f"v2_infer_{slug}" + (f"_v{version}" if version is not None else ""),
        "requestBody": {"required": True, "content": {"application/json": {
            "schema": infer_body_schema(task, outputs, max_texts, text)}}},
        "responses": {
            "200": {"description": "The outputs.", "content": {
                "application/json": {"schema": {"$ref": "#/components/schemas/V2InferResponse"}},
                "application/octet-stream": {"schema": {"type": "string",
                                                        "format": "binary"}}}},
            **errors,
        },
    }


def series_infer_operation(name: str, version: int | None, task: str, outputs: list[str],
                           features: int, errors: dict[str, Any]) -> dict[str, Any]:
    """The OpenAPI operation of POST /v2/models/NAME[/versions/V]/infer for a feature-sequence
    model: `features` FP32 [n, steps, features] and optionally `lengths` INT64 [n]."""
    which = f"version {version}" if version is not None else "the default version"
    slug = "".join(c if c.isalnum() else "_" for c in name)
    number = {"type": "number"}
    feats = {
        "type": "object", "additionalProperties": False, "required": ["name", "datatype",
                                                                     "shape"],
        "properties": {
            "name": {"const": "features"}, "datatype": {"const": "FP32"},
            "shape": {"type": "array", "minItems": 3, "maxItems": 3,
                      "prefixItems": [{"type": "integer", "minimum": 1},
                                      {"type": "integer", "minimum": 1},
                                      {"const": features}],
                      "description": f"[n, steps, {features}]: n series right-padded to "
                      "steps; data holds n x steps x features finite numbers, flat or nested."},
            "data": {"type": "array", "items": {"anyOf": [number, {"type": "array"}]}},
            "parameters": _nullable({"type": "object"}),
        },
    }
    lengths = {
        "type": "object", "additionalProperties": False,
        "required": ["name", "datatype", "shape"],
        "properties": {
            "name": {"const": "lengths"}, "datatype": {"enum": ["INT64", "INT32"]},
            "shape": {"type": "array", "minItems": 1, "maxItems": 1,
                      "items": {"type": "integer"}, "description": "[n]"},
            "data": {"type": "array", "items": {"type": "integer", "minimum": 1}},
            "parameters": _nullable({"type": "object"}),
        },
    }
    output = {"type": "object", "additionalProperties": False, "required": ["name"],
              "properties": {"name": {"enum": outputs}, "parameters": _nullable({
                  "type": "object", "additionalProperties": False,
                  "properties": {"binary_data": _nullable({"type": "boolean"})}})}}
    body = {"type": "object", "additionalProperties": False, "required": ["inputs"],
            "properties": {"id": _nullable({"type": "string"}),
                           "parameters": parameters_schema(task),
                           "inputs": {"type": "array", "minItems": 1, "maxItems": 2,
                                      "items": {"anyOf": [feats, lengths]}},
                           "outputs": _nullable({"type": "array", "items": output})}}
    return {
        "tags": ["v2"],
        "summary": f"Infer: {name} ({task}, {which})",
        "description": f"OIP inference with {which} of {name}: `features` FP32 [n, steps, "
        f"{features}] (raw values; the server normalises) and `lengths` INT64 [n] (each 1 to "
        "steps; without it every series is steps long) -> `outputs` FP32 [n, k] (sequence "
        "classifier) or [n, steps, k] (sequence tagger, zeros past each length). " + BINARY,
        "operationId": f"v2_infer_{slug}" + (f"_v{version}" if version is not None else ""),
        "requestBody": {"required": True, "content": {"application/json": {"schema": body}}},
        "responses": {
            "200": {"description": "The outputs.", "content": {
                "application/json": {"schema": {"$ref": "#/components/schemas/V2InferResponse"}},
                "application/octet-stream": {"schema": {"type": "string",
                                                        "format": "binary"}}}},
            **errors,
        },
    }
