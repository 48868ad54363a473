"""KServe v2 gRPC tensors: a `ModelInferRequest` as the HTTP OIP's request, outputs as a
`ModelInferResponse`.

A request becomes the same `V2InferRequest` (pydantic) and binary tail that the HTTP front
reads from a JSON body, so every check after that is HTTP's own (`oip/codec.py`: datatypes,
shapes, element counts and values, parameters, requested outputs; `oip/tasks.py`: each task's
inputs):

- `raw_input_contents` (one entry per input, all inputs or none: tritonclient sends every
  input this way) are the binary tensor extension's data: each input's entry is its
  `binary_data_size` bytes of the tail, BYTES elements as 4-byte little-endian lengths and
  their bytes, exactly as over HTTP;
- typed `contents` are the JSON `data`: the field of the input's datatype (Triton's table,
  `TYPED`: INT8..INT32 in `int_contents`, FP32 in `fp32_contents`, ...); BYTES elements
  (`bytes_contents`) go through the binary coding, so bytes that are not UTF-8 are the same
  400 as over HTTP; FP16 and BF16 have no typed field (raw only);
- `InferParameter`s are the JSON parameters (bool, int64, string, double, uint64 as the
  Python value).

An answer mirrors the request, as KServe's servers do: raw outputs (`raw_output_contents`,
Triton's only form) unless the request sent its data as typed `contents`.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Mapping
from typing import Any

from pydantic import ValidationError

from seqserve.service.api.common import describe_errors
from seqserve.service.api.grpc import messages as pb
from seqserve.service.api.oip.codec import NUMERIC, V2Tensor, encode_binary
from seqserve.service.api.oip.schemas import V2InferRequest
from seqserve.service.core.errors import BadRequest

TYPED = {
    "BOOL": "bool_contents", "INT8": "int_contents", "INT16": "int_contents",
    "INT32": "int_contents", "INT64": "int64_contents", "UINT8": "uint_contents",
    "UINT16": "uint_contents", "UINT32": "uint_contents", "UINT64": "uint64_contents",
    "FP32": "fp32_contents", "FP64": "fp64_contents", "BYTES": "bytes_contents",
}
"""The `InferTensorContents` field that holds each datatype's typed data."""
CONTENTS = tuple(sorted(set(TYPED.values())))
INT64 = (-(2**63), 2**63 - 1)


def parameters_of(given: Mapping[str, Any]) -> dict[str, Any]:
    """A map of `InferParameter`s as plain values (one without a value: None)."""
    out: dict[str, Any] = {}
    for key, parameter in given.items():
        which = parameter.WhichOneof("parameter_choice")
        out[key] = None if which is None else getattr(parameter, which)
    return out


def set_parameter(target: Any, value: Any) -> None:
    """Write a plain value into an `InferParameter` (an int beyond int64: uint64)."""
    if isinstance(value, bool):
        target.bool_param = value
    elif isinstance(value, int):
        if INT64[0] <= value <= INT64[1]:
            target.int64_param = value
        else:
            target.uint64_param = value
    elif isinstance(value, float):
        target.double_param = value
    else:
        target.string_param = str(value)


def set_parameters(target: Any, values: Mapping[str, Any]) -> None:
    for key, value in values.items():
        if value is not None:
            set_parameter(target[key], value)


def bytes_elements(items: Iterable[bytes | str]) -> bytes:
    """BYTES elements in the binary coding: 4-byte little-endian length, then the bytes."""
    parts = []
    for x in items:
        b = x if isinstance(x, bytes) else x.encode("utf-8")
        parts.append(struct.pack("<I", len(b)) + b)
    return b"".join(parts)


def typed_data(request: Any) -> bool:
    """Whether the request sends its inputs' data as typed `contents` (no raw contents)."""
    return not request.raw_input_contents and any(
        len(getattr(inp.contents, f)) for inp in request.inputs for f in CONTENTS)


def v2_request(request: Any) -> tuple[V2InferRequest, bytes]:
    """The `V2InferRequest` and binary tail of a `ModelInferRequest` (module doc); BadRequest
    for what does not fit the protocol."""
    raw = list(request.raw_input_contents)
    if raw and len(raw) != len(request.inputs):
        raise BadRequest(f"raw_input_contents has {len(raw)} entries for "
                         f"{len(request.inputs)} inputs: one per input, or none")
    inputs: list[dict[str, Any]] = []
    tail: list[bytes] = []
    for i, inp in enumerate(request.inputs):
        item: dict[str, Any] = {"name": inp.name, "datatype": inp.datatype,
                                "shape": list(inp.shape)}
        parameters = parameters_of(inp.parameters)
        given = [f for f in CONTENTS if len(getattr(inp.contents, f))]
        blob: bytes | None = None
        if raw:
            if given:
                raise BadRequest(f"input {inp.name!r}: data in both contents and "
                                 "raw_input_contents")
            blob = raw[i]
        else:
            field = TYPED.get(inp.datatype)
            if given and given != [field]:
                where = f"contents.{field}" if field else "raw_input_contents"
                raise BadRequest(f"input {inp.name!r}: {inp.datatype} data goes in {where}, "
                                 f"got {', '.join('contents.' + g for g in given)}")
            if field is None and inp.datatype in NUMERIC:
                raise BadRequest(f"input {inp.name!r}: {inp.datatype} data goes in "
                                 "raw_input_contents (it has no typed contents)")
            if field == "bytes_contents":
                blob = bytes_elements(inp.contents.bytes_contents)
            elif field is not None:
                item["data"] = list(getattr(inp.contents, field))
            else:
                item["data"] = []  # an unknown datatype: refused, named, by the OIP codec
        if blob is not None:
            parameters["binary_data_size"] = len(blob)
            tail.append(blob)
        if parameters:
            item["parameters"] = parameters
        inputs.append(item)
    doc: dict[str, Any] = {"inputs": inputs}
    if request.id:
        doc["id"] = request.id
    if request.parameters:
        doc["parameters"] = parameters_of(request.parameters)
    if request.outputs:
        doc["outputs"] = [{"name": o.name, **({"parameters": parameters_of(o.parameters)}
                                              if o.parameters else {})}
                          for o in request.outputs]
    try:
        return V2InferRequest.model_validate(doc), b"".join(tail)
    except ValidationError as exc:
        raise BadRequest(f"invalid inference request: {describe_errors(exc.errors())}") from exc


def infer_response(name: str, version: str, request_id: str, outputs: list[V2Tensor],
                   asked: list[str], parameters: Mapping[str, Any] | None = None,
                   typed: bool = False) -> Any:
    """A `ModelInferResponse` with the `asked` outputs (all when none were named), raw or,
    with `typed`, as typed contents, and the answer's own `parameters`."""
    response = pb.ModelInferResponse(model_name=name, model_version=version, id=request_id)
    set_parameters(response.parameters, parameters or {})
    for t in outputs:
        if asked and t.name not in asked:
            continue
        out = response.outputs.add(name=t.name, datatype=t.datatype, shape=t.shape)
        if not typed:
            response.raw_output_contents.append(encode_binary(t))
        elif t.datatype == "BYTES":
            out.contents.bytes_contents.extend(
                x if isinstance(x, bytes) else str(x).encode("utf-8") for x in t.data)
        else:
            getattr(out.contents, TYPED[t.datatype]).extend(t.data)
    return response


def text_response(name: str, version: str, request_id: str, text: str,
                  parameters: Mapping[str, Any]) -> Any:
    """A language model's streamed answer: `text_output` BYTES [1] (raw) and `parameters`."""
    response = pb.ModelInferResponse(model_name=name, model_version=version, id=request_id)
    set_parameters(response.parameters, parameters)
    response.outputs.add(name="text_output", datatype="BYTES", shape=[1])
    response.raw_output_contents.append(bytes_elements([text]))
    return response
