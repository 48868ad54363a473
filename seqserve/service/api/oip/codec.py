"""OIP (KServe v2) tensor coding: JSON `data` and the binary tensor data extension.

Binary extension: the body is the JSON header (its length in the `Inference-Header-Content-
Length` header) followed by each binary input's bytes in input order, sized by the input's
`parameters.binary_data_size`. BYTES elements are 4-byte little-endian lengths + bytes.
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass
from typing import Any

import numpy as np
from pydantic import ValidationError

from seqserve.service.api.common import describe_errors
from seqserve.service.api.oip.schemas import ProtocolParameters, V2InferRequest, V2RequestInput
from seqserve.service.core.errors import BadRequest

HEADER = "inference-header-content-length"
PROTOCOL_PARAMETERS = frozenset(ProtocolParameters.model_fields)
"""Request-level parameters that belong to the protocol (encoding, transport), not to the
model: removed before a task sees the parameters."""
NUMERIC = {
    "BOOL": np.bool_, "INT8": np.int8, "INT16": np.int16, "INT32": np.int32, "INT64": np.int64,
    "UINT8": np.uint8, "UINT16": np.uint16, "UINT32": np.uint32, "UINT64": np.uint64,
    "FP16": np.float16, "FP32": np.float32, "FP64": np.float64,
}
DATATYPES = (*NUMERIC, "BYTES")
MAX_DIMS = 32
"""Most dims of an input's shape (numpy's own limit in 1.x)."""
MAX_ELEMENTS = 2**63 - 1
"""Most elements a shape may describe, its zero dims left out (numpy's, int64's limit): each
dim, and the product of the others, is checked against it with Python ints before anything
is allocated, then against the data actually sent."""
MAX_HEADER_DIGITS = 18
"""Most digits of an Inference-Header-Content-Length (any body is far shorter)."""


@dataclass
class V2Tensor:
    """One decoded OIP tensor (inputs and outputs): data flattened row-major."""

    name: str
    datatype: str
    shape: list[int]
    data: list[Any]


def parse_request(body: bytes, header_length: str | None) -> tuple[V2InferRequest, bytes]:
    """Split and validate the JSON header; returns it and the binary tail."""
    split = len(body)
    if header_length is not None:
        digits = header_length.isascii() and header_length.isdigit()
        if not digits or len(header_length.lstrip("0")) > MAX_HEADER_DIGITS \
                or int(header_length) > len(body):
            shown = header_length if len(header_length) <= 40 else header_length[:40] + "..."
            raise BadRequest(f"bad Inference-Header-Content-Length {shown!r}")
        split = int(header_length)
    try:
        text = body[:split].decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BadRequest("request body is not valid UTF-8") from exc
    try:
        data = json.loads(text)
    except RecursionError as exc:
        raise BadRequest("malformed JSON: nested too deeply") from exc
    except ValueError as exc:  # JSONDecodeError, or an integer over Python's digit limit
        raise BadRequest(f"malformed JSON: {exc}") from exc
    try:
        return V2InferRequest.model_validate(data), body[split:]
    except ValidationError as exc:
        raise BadRequest(f"invalid inference request: {describe_errors(exc.errors())}") from exc


def decode_inputs(request: V2InferRequest, tail: bytes) -> dict[str, V2Tensor]:
    """Every input as a V2Tensor with flat data (BYTES as bytes or str)."""
    out: dict[str, V2Tensor] = {}
    offset = 0
    for inp in request.inputs:
        if inp.datatype not in DATATYPES:
            raise BadRequest(f"input {inp.name!r}: unknown datatype {inp.datatype!r} (one of "
                             f"{', '.join(DATATYPES)})")
        count = element_count(inp.name, inp.shape)
        params = inp.parameters or {}
        if "binary_data_size" in params:
            size = params["binary_data_size"]
            if not isinstance(size, int) or isinstance(size, bool) or size < 0 \
                    or offset + size > len(tail):
                raise BadRequest(f"input {inp.name!r}: binary_data_size does not fit the body")
            data = _from_binary(inp, tail[offset: offset + size], count)
            offset += size
        else:
            data = _elements(inp)
            if len(data) == count:
                _check_values(inp.name, inp.datatype, data)
        if len(data) != count:
            raise BadRequest(
                f"input {inp.name!r}: shape {inp.shape} needs {count} elements, got {len(data)}"
            )
        if inp.name in out:
            raise BadRequest(f"input {inp.name!r} given twice")
        out[inp.name] = V2Tensor(inp.name, inp.datatype, list(inp.shape), data)
    if offset != len(tail):
        raise BadRequest("binary body is longer than the inputs' binary_data_size")
    return out


def element_count(name: str, shape: list[int]) -> int:
    """The number of elements `shape` describes (Python ints: no overflow), or BadRequest for
    a shape no tensor can have: over MAX_DIMS dims, a negative dim, over MAX_ELEMENTS
    elements (zero dims left out, so [0, 2**62, 2**62] is refused too)."""
    if len(shape) > MAX_DIMS:
        raise BadRequest(f"input {name!r}: shape has {len(shape)} dims, at most {MAX_DIMS}")
    if any(d < 0 for d in shape):
        raise BadRequest(f"input {name!r}: shape {shape} has a negative dim")
    if math.prod(d for d in shape if d) > MAX_ELEMENTS:
        raise BadRequest(f"input {name!r}: shape {shape} describes more than 2**63 - 1 "
                         "elements")
    return math.prod(shape)


def _check_values(name: str, datatype: str, data: list[Any]) -> None:
    """Every JSON element fits the input's datatype: BYTES a string, BOOL true or false, an
    integer type an integer within its range, a float type a number (an integer within its
    range; NaN, infinities and floats beyond it are left to the task), else BadRequest naming
    the input and the element."""
    if datatype == "BYTES":
        want = "a string"
        bad = next((i for i, x in enumerate(data) if not isinstance(x, str)), None)
    elif datatype == "BOOL":
        want = "true or false"
        bad = next((i for i, x in enumerate(data) if not isinstance(x, bool)), None)
    elif np.dtype(NUMERIC[datatype]).kind in "iu":
        info = np.iinfo(NUMERIC[datatype])
        lo, hi = int(info.min), int(info.max)
        want = f"an integer within {datatype}'s range [{lo}, {hi}]"
        bad = next((i for i, x in enumerate(data)
                    if type(x) is not int or not lo <= x <= hi), None)
    else:
        big = float(np.finfo(NUMERIC[datatype]).max)
        want = f"a number within {datatype}'s range"
        bad = next((i for i, x in enumerate(data) if type(x) is not float
                    and (type(x) is not int or not -big <= x <= big)), None)
    if bad is not None:
        x = data[bad]
        out_of_range = type(x) is int and datatype not in ("BYTES", "BOOL")
        got = "an integer out of that range" if out_of_range else f"a {type(x).__name__}"
        raise BadRequest(f"input {name!r}: element {bad} must be {want}, got {got}")


def _elements(inp: V2RequestInput) -> list[Any]:
    """An input's JSON `data` flattened row-major: a flat list, or lists nested exactly as
    its shape (anything else is a 400)."""
    if inp.data is None:
        raise BadRequest(f"input {inp.name!r} has no data")
    if not isinstance(inp.data, list):
        raise BadRequest(f"input {inp.name!r}: data must be a list")
    if not any(isinstance(x, list) for x in inp.data):
        return inp.data
    return _nested(inp.data, list(inp.shape), inp.name)


def _nested(data: Any, shape: list[int], name: str) -> list[Any]:
    if not shape:
        if isinstance(data, list):
            raise BadRequest(f"input {name!r}: data is nested deeper than its shape")
        return [data]
    if not isinstance(data, list) or len(data) != shape[0]:
        raise BadRequest(f"input {name!r}: data nesting does not follow its shape")
    flat: list[Any] = []
    for x in data:
        flat += _nested(x, shape[1:], name)
    return flat


def _from_binary(inp: V2RequestInput, raw: bytes, count: int) -> list[Any]:
    """An input's binary data: its size checked against its shape's `count` before anything
    is decoded (a BYTES element takes at least its 4 length bytes)."""
    if inp.datatype == "BYTES":
        if count * 4 > len(raw):
            raise BadRequest(f"input {inp.name!r}: shape {inp.shape} needs {count} BYTES "
                             f"elements, more than {len(raw)} bytes can hold")
        items, pos = [], 0
        while pos < len(raw):
            if pos + 4 > len(raw):
                raise BadRequest(f"input {inp.name!r}: truncated BYTES element")
            (n,) = struct.unpack_from("<I", raw, pos)
            pos += 4
            if pos + n > len(raw):
                raise BadRequest(f"input {inp.name!r}: truncated BYTES element")
            items.append(raw[pos: pos + n])
            pos += n
        return items
    dtype = NUMERIC[inp.datatype]
    if len(raw) != count * np.dtype(dtype).itemsize:
        raise BadRequest(f"input {inp.name!r}: shape {inp.shape} of {inp.datatype} needs "
                         f"{count * np.dtype(dtype).itemsize} bytes, binary_data_size is "
                         f"{len(raw)}")
    return list(np.frombuffer(raw, dtype=dtype).tolist())


def request_parameters(request: V2InferRequest) -> dict[str, Any]:
    """The request-level parameters a model sees: the protocol's own keys checked (400 when
    one has the wrong type) and removed."""
    given = request.parameters or {}
    try:
        ProtocolParameters.model_validate({k: v for k, v in given.items()
                                           if k in PROTOCOL_PARAMETERS})
    except ValidationError as exc:
        raise BadRequest(f"bad parameters: {describe_errors(exc.errors())}") from exc
    return {k: v for k, v in given.items() if k not in PROTOCOL_PARAMETERS}


def check_target(request: V2InferRequest, model: str, version: str | None) -> None:
    """The body's `model_name` / `model_version` (the KServe SDK sends them) must name the
    path's model and version; 400 naming the mismatch."""
    if request.model_name is not None and request.model_name != model:
        raise BadRequest(f"model_name {request.model_name!r} in the body does not match the "
                         f"path's model {model!r}")
    if request.model_version not in (None, "") and version is not None \
            and request.model_version != version:
        raise BadRequest(f"model_version {request.model_version!r} in the body does not match "
                         f"the path's version {version!r}")


def timeout_s(request: V2InferRequest) -> float | None:
    """The request's own deadline (the `timeout` parameter, microseconds) in seconds."""
    value = (request.parameters or {}).get("timeout")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not value >= 1:
        raise BadRequest("parameters.timeout must be a whole number of microseconds >= 1")
    return float(value) / 1e6


def check_outputs(request: V2InferRequest, produced: list[str]) -> list[str]:
    """The names of the requested outputs (empty: all); 400 for an output this model does not
    produce or an extension this server does not implement."""
    asked = [o.name for o in request.outputs or []]
    unknown = sorted(set(asked) - set(produced))
    if unknown:
        raise BadRequest(f"unknown requested output(s) {unknown}; this model has "
                         f"{sorted(produced)}")
    for out in request.outputs or []:
        if out.parameters is not None and out.parameters.classification is not None:
            raise BadRequest(f"output {out.name!r}: the classification extension is not "
                             "supported; ask for 'probabilities' (classifiers) instead")
    return asked


def input_texts(inputs: dict[str, V2Tensor], name: str = "text") -> list[str]:
    """The texts of an infer request: exactly one input `name` ("text"; a language model's
    "text_input"), BYTES, shape [n] or [n, 1] (Triton's examples send [n, 1]), n >= 1, each
    element a str or UTF-8 bytes (every task takes its texts this way)."""
    text = inputs.get(name)
    if text is None or len(inputs) != 1:
        raise BadRequest(f"expected exactly one input named {name!r}, got {sorted(inputs)}")
    if text.datatype != "BYTES" or not (
            len(text.shape) == 1 or len(text.shape) == 2 and text.shape[1] == 1):
        raise BadRequest(f"input {name!r} must be BYTES with shape [n] or [n, 1], got "
                         f"{text.datatype} {text.shape}")
    texts = [_as_text(x, i) for i, x in enumerate(text.data)]
    if not texts:
        raise BadRequest(f"input {name!r} is empty")
    return texts


def _as_text(x: object, i: int) -> str:
    if isinstance(x, str):
        return x
    if isinstance(x, bytes):
        try:
            return x.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise BadRequest(f"text[{i}] is not valid UTF-8") from exc
    raise BadRequest(f"text[{i}] must be a string, got {type(x).__name__}")


def wants_binary(request: V2InferRequest, name: str) -> bool:
    """Whether output `name` was asked for in binary (per output, else request-wide)."""
    for out in request.outputs or []:
        if out.name == name and out.parameters and out.parameters.binary_data is not None:
            return out.parameters.binary_data
    return bool((request.parameters or {}).get("binary_data_output", False))


def encode_binary(t: V2Tensor) -> bytes:
    if t.datatype == "BYTES":
        parts = []
        for x in t.data:
            b = x if isinstance(x, bytes) else str(x).encode("utf-8")
            parts.append(struct.pack("<I", len(b)) + b)
        return b"".join(parts)
    return np.asarray(t.data, dtype=NUMERIC[t.datatype]).tobytes()
