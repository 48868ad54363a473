"""The OpenAPI operation of one served model's OIP infer route, with that model's exact body.

An OIP request body depends on the model behind the path (its outputs, its parameters), which
a path template cannot say, so the live document (`seqserve.service.server.openapi`) lists one infer
operation per served model and version, each with the JSON body this server accepts for it:
exactly one input named as the model's metadata names it (`oip.tasks.signature`: `text`, a
language model's `text_input`; BYTES, shape [n] or [n, 1] with n texts, n from 1 to
max_texts), the model's output names, its parameters (the translate options for translators,
the generate extension's for language models, none for the others) and the protocol's own
(`binary_data_output`, `content_type`, `headers`, `timeout`, `priority`), and the
`model_name` / `model_version` a client may repeat in the body (the path's). The binary
tensor data extension is described in words: its body is not JSON. Operation ids are
`v2_infer_<model>` and `v2_infer_<model>_v<version>` (`operation_id`).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from seqserve.service.api.oip.generate import GenerateParameters
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


def slug(name: str) -> str:
    """A model's name as it goes into an operation id (letters, digits and `_`)."""
    return "".join(c if c.isalnum() else "_" for c in name)


def operation_id(prefix: str, name: str, version: int | None) -> str:
    """The operation id of `prefix`'s operation for model `name` (`version`, or None for
    the default version's path)."""
    return f"{prefix}_{slug(name)}" + (f"_v{version}" if version is not None else "")


RETURN_STATE = {"return_state": {"type": "boolean",
                                  "description": "Answer the output `state` (a state token)."}}
SEQUENCE = {
    "sequence_id": {"anyOf": [{"type": "string"}, {"type": "integer", "minimum": 1,
                                                   "maximum": 2**64 - 1}],
                    "description": "A session's id (one series per request)."},
    "sequence_start": {"type": "boolean"}, "sequence_end": {"type": "boolean"},
    **RETURN_STATE}
"""A stateful model's parameters (`oip.tasks.sequence_of`, `return_state`)."""


TASK_PARAMETERS: dict[str, type[BaseModel]] = {"translator": TranslateOptions,
                                               "lm": GenerateParameters}
"""The model of a task's own request parameters (what its infer validates them with)."""


def parameters_schema(task: str, stateful: bool = False) -> dict[str, Any]:
    """The request `parameters` a model of `task` accepts (`stateful`: a feature-sequence
    model with state, which takes a session's or a state token's parameters)."""
    task_model = TASK_PARAMETERS.get(task)
    extra = RETURN_STATE if task == "lm" else SEQUENCE if stateful else {}
    if task_model is not None:
        options = task_model.model_json_schema()
        schema = {**options, "properties": {**options["properties"], **extra,
                                            **_protocol_properties()}}
        schema.pop("title", None)
        return _nullable(schema)
    return _nullable({"type": "object", "additionalProperties": False,
                      "properties": {**extra, **_protocol_properties()}})


def text_input_schema(max_texts: int, text: dict[str, Any], name: str) -> dict[str, Any]:
    """The one input: `name`, BYTES, shape [n] or [n, 1] with exactly n strings."""
    counts = [{"properties": {"shape": {"enum": [[n], [n, 1]]},
                              "data": {"minItems": n, "maxItems": n}}}
              for n in range(1, max_texts + 1)]
    return {
        "type": "object", "additionalProperties": False,
        "required": ["name", "datatype", "shape", "data"],
        "properties": {
            "name": {"const": name},
            "datatype": {"const": "BYTES"},
            "shape": {"type": "array", "items": {"type": "integer"}, "minItems": 1,
                      "maxItems": 2, "description": "[n] or [n, 1]: n texts."},
            "data": {"type": "array", "items": text},
            "parameters": _nullable({"type": "object",
                                     "not": {"required": ["binary_data_size"]}}),
        },
        "anyOf": counts,
    }


def target_properties(name: str, version: int | None) -> dict[str, Any]:
    """`model_name` and `model_version` in an infer body: the path's, when given
    (`codec.check_target`; on the default version's path any version is accepted)."""
    return {"model_name": _nullable({"const": name}),
            "model_version": _nullable({"type": "string"} if version is None
                                       else {"enum": ["", str(version)]})}


def infer_body_schema(task: str, outputs: list[str], max_texts: int, text: dict[str, Any],
                      input_name: str, target: dict[str, Any]) -> dict[str, Any]:
    """The JSON body of an infer request to a model of `task` with one text input
    `input_name` and `outputs`; `target`: `target_properties`."""
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
            **target,
            "id": _nullable({"type": "string"}),
            "parameters": parameters_schema(task),
            "inputs": {"type": "array", "minItems": 1, "maxItems": 1,
                       "items": text_input_schema(max_texts, text, input_name)},
            "outputs": _nullable({"type": "array", "items": output,
                                  "description": "Outputs to return (default: all)."}),
        },
    }


def infer_operation(name: str, version: int | None, task: str, outputs: list[str],
                    max_texts: int, text: dict[str, Any], input_name: str,
                    errors: dict[str, Any]) -> dict[str, Any]:
    """The OpenAPI operation object of POST /v2/models/NAME[/versions/V]/infer."""
    which = f"version {version}" if version is not None else "the default version"
    body = infer_body_schema(task, outputs, max_texts, text, input_name,
                             target_properties(name, version))
    return {
        "tags": ["v2"],
        "summary": f"Infer: {name} ({task}, {which})",
        "description": f"OIP inference with {which} of {name}. {BINARY}",
        "operationId": operation_id("v2_infer", name, version),
        "requestBody": {"required": True, "content": {"application/json": {
            "schema": body}}},
        "responses": {
            "200": {"description": "The outputs.", "content": {
                "application/json": {"schema": {"$ref": "#/components/schemas/V2InferResponse"}},
                "application/octet-stream": {"schema": {"type": "string",
                                                        "format": "binary"}}}},
            **errors,
        },
    }


def series_infer_operation(name: str, version: int | None, task: str, outputs: list[str],
                           features: int, stateful: bool,
                           errors: dict[str, Any]) -> dict[str, Any]:
    """The OpenAPI operation of POST /v2/models/NAME[/versions/V]/infer for a feature-sequence
    model: `features` FP32 [n, steps, features] and optionally `lengths` INT64 [n]."""
    which = f"version {version}" if version is not None else "the default version"
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
            "properties": {**target_properties(name, version),
                           "id": _nullable({"type": "string"}),
                           "parameters": parameters_schema(task, stateful),
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
        "operationId": operation_id("v2_infer", name, version),
        "requestBody": {"required": True, "content": {"application/json": {"schema": body}}},
        "responses": {
            "200": {"description": "The outputs.", "content": {
                "application/json": {"schema": {"$ref": "#/components/schemas/V2InferResponse"}},
                "application/octet-stream": {"schema": {"type": "string",
                                                        "format": "binary"}}}},
            **errors,
        },
    }
