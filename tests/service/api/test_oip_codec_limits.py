"""The OIP codec's checks of shapes and values (issue 37), on the codec itself: every crafted
tensor is a BadRequest naming the input, before anything the size of its shape is allocated.
(tests/service/api/test_bad_inputs.py sends the ones a client can send to every route.)"""

from __future__ import annotations

import json
import struct
from typing import Any

import pytest

from seqserve.service.api.oip import codec
from seqserve.service.core.errors import BadRequest


def _decode(*inputs: dict[str, Any], tail: bytes = b"") -> dict[str, codec.V2Tensor]:
    head = json.dumps({"inputs": list(inputs)}).encode()
    request, rest = codec.parse_request(head + tail, str(len(head)) if tail else None)
    return codec.decode_inputs(request, rest)


def _input(name: str, datatype: str, shape: list[int], data: Any = None,
           size: int | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"name": name, "datatype": datatype, "shape": shape}
    if data is not None:
        out["data"] = data
    if size is not None:
        out["parameters"] = {"binary_data_size": size}
    return out


@pytest.mark.parametrize(("inp", "message"), [
    (_input("x", "FP32", [2**32, 2**32, 3], []), "more than 2\\*\\*63 - 1 elements"),
    (_input("x", "FP32", [0, 2**62, 2**62], []), "more than 2\\*\\*63 - 1 elements"),
    (_input("x", "FP32", [2**70], []), "more than 2\\*\\*63 - 1 elements"),
    (_input("x", "FP32", [-1, 2], []), "negative dim"),
    (_input("x", "BYTES", [1] * 33, ["a"]), "33 dims, at most 32"),
    (_input("x", "FP32", [2, 2], [1.0, 2.0, 3.0]), "needs 4 elements, got 3"),
    (_input("x", "FP32", [2, 2], [[1.0, 2.0], [3.0]]), "nesting does not follow"),
    (_input("x", "FP32", [1], [[[1.0]]]), "deeper than its shape"),
    (_input("x", "COMPLEX64", [1], [1.0]), "unknown datatype 'COMPLEX64'"),
    (_input("lengths", "INT64", [1], [2**63]), "'lengths': element 0 must be an integer "
                                                "within INT64's range"),
    (_input("lengths", "INT64", [2], [1, -(2**63) - 1]), "element 1 .* out of that range"),
    (_input("x", "INT32", [1], [2**31]), "INT32's range"),
    (_input("x", "UINT8", [1], [-1]), "UINT8's range"),
    (_input("x", "INT64", [1], [1.5]), "got a float"),
    (_input("x", "INT64", [1], [True]), "got a bool"),
    (_input("x", "FP32", [1], [10**400]), "FP32's range"),
    (_input("x", "FP16", [1], [70000]), "FP16's range"),
    (_input("x", "FP32", [1], ["1"]), "got a str"),
    (_input("x", "BOOL", [1], [1]), "true or false"),
    (_input("x", "BYTES", [2], ["a", 5]), "element 1 must be a string, got a int$"),
    (_input("x", "BYTES", [1], [None]), "must be a string"),
    (_input("x", "BYTES", [1], [{"a": 1}]), "must be a string"),
], ids=lambda v: v if isinstance(v, str) else None)
def test_a_crafted_json_tensor_is_a_bad_request(inp: dict[str, Any], message: str) -> None:
    with pytest.raises(BadRequest, match=message):
        _decode(inp)


def test_values_within_range_pass() -> None:
    out = _decode(_input("lengths", "INT64", [2], [2**63 - 1, -(2**63)]),
                  _input("f", "FP32", [1, 2], [[1, 2.5]]), _input("b", "BOOL", [1], [True]))
    assert out["lengths"].data == [2**63 - 1, -(2**63)] and out["f"].data == [1, 2.5]
    assert _decode(_input("x", "FP32", [0, 5], []))["x"].data == []


@pytest.mark.parametrize(("inp", "tail", "message"), [
    (_input("x", "FP32", [2**32, 2**32, 3], size=0), b"", "more than 2\\*\\*63 - 1"),
    (_input("x", "FP32", [2**40, 3], size=12), b"\0" * 12, "needs 13194139533312 bytes"),
    (_input("x", "INT64", [2], size=12), b"\0" * 12, "needs 16 bytes, binary_data_size is 12"),
    (_input("x", "BYTES", [2**40], size=8), struct.pack("<I", 4) + b"abcd",
     "more than 8 bytes can hold"),
    (_input("x", "BYTES", [2], size=8), struct.pack("<I", 4) + b"abcd", "needs 2 elements"),
    (_input("x", "BYTES", [1], size=6), struct.pack("<I", 9) + b"ab", "truncated"),
    (_input("x", "FP32", [1], size=10**30), b"\0" * 4, "does not fit the body"),
])
def test_a_crafted_binary_tensor_is_a_bad_request(inp: dict[str, Any], tail: bytes,
                                                  message: str) -> None:
    with pytest.raises(BadRequest, match=message):
        _decode(inp, tail=tail if tail else b"")


@pytest.mark.parametrize("length", ["\u00b2", "\u0663", "1" * 4400, "-1", " 5", "1e3", ""])
def test_a_bad_header_length_is_a_bad_request(length: str) -> None:
    with pytest.raises(BadRequest, match="bad Inference-Header-Content-Length"):
        codec.parse_request(b'{"inputs": []}', length)
