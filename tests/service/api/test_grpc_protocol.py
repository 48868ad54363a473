"""The gRPC front's protocol definition: every field and method seqserve declares is the one
tritonclient's generated module (Triton's grpc_service.proto) and grpcio-health-checking's
declare, on the wire (number, type, cardinality, message type); the checked-in descriptors are
what `python -m seqserve.service.api.grpc.build` writes from the .proto files; the server's
message classes live in a pool of their own beside tritonclient's; statuses and settings."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf import descriptor_pool

from seqserve.cli import build_parser
from seqserve.cli.serve import settings_from_args
from seqserve.models.errors import UserError
from seqserve.service.api.grpc import build, front
from seqserve.service.api.grpc import messages as pb
from seqserve.service.core import errors
from seqserve.service.web.settings import Settings

service_pb2 = pytest.importorskip("tritonclient.grpc.service_pb2")
health_pb2 = pytest.importorskip("grpc_health.v1.health_pb2")


def wire(message: Any) -> dict[str, tuple[Any, ...]]:
    """A message's fields as the wire sees them, nested types (map entries too) included."""
    out: dict[str, tuple[Any, ...]] = {}
    for f in message.fields:
        out[f"{message.full_name}.{f.name}"] = (
            f.number, f.type, f.is_repeated, f.message_type.full_name if f.message_type else None,
            f.enum_type.full_name if f.enum_type else None,
            f.containing_oneof.name if f.containing_oneof else None)
    for nested in message.nested_types:
        out |= wire(nested)
    return out


def file_of(name: str) -> Any:
    return pb.POOL.FindFileByName(name)


@pytest.mark.parametrize(("ours", "theirs"), [("inference.proto", service_pb2.DESCRIPTOR),
                                              ("health.proto", health_pb2.DESCRIPTOR)],
                         ids=["inference", "health"])
def test_every_field_and_method_is_the_protocols(ours: str, theirs: Any) -> None:
    mine = file_of(ours)
    assert mine.package == theirs.package
    for name, message in mine.message_types_by_name.items():
        assert wire(message) == wire(theirs.message_types_by_name[name]), name
    for name, service in mine.services_by_name.items():
        other = theirs.services_by_name[name]
        for method in service.methods:
            twin = other.methods_by_name[method.name]
            assert (method.input_type.full_name, method.output_type.full_name,
                    method.client_streaming, method.server_streaming) == (
                twin.input_type.full_name, twin.output_type.full_name,
                twin.client_streaming, twin.server_streaming), method.name
    for name, enum in mine.enum_types_by_name.items():
        assert {v.name: v.number for v in enum.values} == {
            v.name: v.number for v in theirs.enum_types_by_name[name].values}


def test_the_inference_service_is_kserve_v2_plus_triton_streaming() -> None:
    methods = set(pb.method_types(pb.INFERENCE))
    assert methods == {"ServerLive", "ServerReady", "ModelReady", "ServerMetadata",
                       "ModelMetadata", "ModelInfer", "ModelStreamInfer", "ModelConfig",
                       "ModelStatistics", "RepositoryIndex", "RepositoryModelLoad",
                       "RepositoryModelUnload"}
    assert set(pb.method_types(pb.HEALTH)) == {"Check", "Watch"}


def test_checked_in_descriptors_are_what_the_build_writes() -> None:
    pytest.importorskip("grpc_tools")
    target = Path(build.__file__).with_name("descriptors.py")
    assert target.read_text(encoding="utf-8") == build.render(build.compile_descriptors()), (
        "descriptors.py is stale: run `python -m seqserve.service.api.grpc.build`")


def test_messages_live_in_a_pool_of_their_own() -> None:
    """tritonclient registered `inference.*` in protobuf's default pool; ours are apart, and
    the bytes are the same."""
    default = descriptor_pool.Default()
    assert default.FindMessageTypeByName("inference.ModelInferRequest").file.name == \
        "grpc_service.proto"
    assert pb.POOL is not default and pb.ModelInferRequest is not service_pb2.ModelInferRequest
    request = pb.ModelInferRequest(model_name="m", raw_input_contents=[b"\x01"])
    request.parameters["sequence_id"].uint64_param = 2**64 - 1
    request.inputs.add(name="text", datatype="BYTES", shape=[1])
    theirs = service_pb2.ModelInferRequest.FromString(request.SerializeToString())
    assert theirs.parameters["sequence_id"].uint64_param == 2**64 - 1
    assert pb.ModelInferRequest.FromString(theirs.SerializeToString()) == request


@pytest.mark.parametrize(("error", "code"), [
    (errors.BadRequest, grpc.StatusCode.INVALID_ARGUMENT),
    (errors.TextNotTokenizable, grpc.StatusCode.INVALID_ARGUMENT),
    (errors.ModelNotFound, grpc.StatusCode.NOT_FOUND),
    (errors.SessionNotFound, grpc.StatusCode.NOT_FOUND),
    (errors.ModelNotReady, grpc.StatusCode.UNAVAILABLE),
    (errors.ShuttingDown, grpc.StatusCode.UNAVAILABLE),
    (errors.EngineUnavailable, grpc.StatusCode.UNAVAILABLE),
    (errors.QueueFull, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (errors.TooManySessions, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (errors.SessionBusy, grpc.StatusCode.ABORTED),
    (errors.DeadlineExceeded, grpc.StatusCode.DEADLINE_EXCEEDED),
    (errors.ClientGone, grpc.StatusCode.CANCELLED),
    (errors.InferenceFailed, grpc.StatusCode.INTERNAL),
    (front.Unauthenticated, grpc.StatusCode.UNAUTHENTICATED),
])
def test_each_error_has_its_grpc_status(error: type[errors.ServiceError],
                                        code: grpc.StatusCode) -> None:
    assert front.code_of(error.status) == code
    assert front.code_of(413) == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert all(front.code_of(s) != grpc.StatusCode.INTERNAL for s in range(400, 500))


def test_grpc_settings_and_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    s = settings_from_args(build_parser().parse_args(["serve"]))
    assert s.grpc and s.grpc_port == 8001
    s = settings_from_args(build_parser().parse_args(["serve", "--no-grpc"]))
    assert not s.grpc
    s = settings_from_args(build_parser().parse_args(["serve", "--grpc-port", "9001"]))
    assert s.grpc_port == 9001
    with pytest.raises(UserError, match="grpc_port"):
        settings_from_args(build_parser().parse_args(["serve", "--port", "9000",
                                                      "--grpc-port", "9000"]))
    monkeypatch.setenv("SEQSERVE_GRPC", "false")
    assert not Settings().grpc
