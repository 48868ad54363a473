"""gRPC server reflection against a real server: grpcio-reflection's own client-side
descriptor database lists the served services and fetches their files by symbol (as grpcurl
does), from the private descriptor pool the front's messages live in: the inference service
with every method of inference.proto, health, and reflection itself."""

from __future__ import annotations

from pathlib import Path

import grpc
from google.protobuf import descriptor_pool
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
    ProtoReflectionDescriptorDatabase,
)
from grpc_support import serve_with_grpc
from service_fakes import settings

from seqserve.service.api.grpc import messages as pb
from seqserve.service.server.app import create_app

REFLECTION = "grpc.reflection.v1alpha.ServerReflection"


def test_reflection_lists_the_services_and_serves_their_files(tiny_repo: Path) -> None:
    app = create_app(settings(tiny_repo, grpc_port=0))
    with serve_with_grpc(app) as running, grpc.insecure_channel(running.grpc) as channel:
        database = ProtoReflectionDescriptorDatabase(channel)
        assert set(database.get_services()) == {pb.INFERENCE, pb.HEALTH, REFLECTION}
        found = descriptor_pool.DescriptorPool(database)
        service = found.FindServiceByName(pb.INFERENCE)
        ours = pb.POOL.FindServiceByName(pb.INFERENCE)
        assert [m.name for m in service.methods] == [m.name for m in ours.methods]
        assert {"ModelInfer", "ModelReady", "ModelStreamInfer", "ModelMetadata"} <= {
            m.name for m in service.methods}
        infer = service.methods_by_name["ModelInfer"]
        assert infer.input_type.full_name == "inference.ModelInferRequest"
        assert [f.name for f in infer.input_type.fields] == [
            f.name for f in pb.POOL.FindMessageTypeByName("inference.ModelInferRequest").fields]
        # a file by symbol: the one inference.proto (its import, model_config.proto, too)
        file = found.FindFileContainingSymbol("inference.ModelInferResponse")
        assert file.name == "inference.proto"
        assert [d.name for d in file.dependencies] == ["model_config.proto"]
        assert [m.name for m in found.FindServiceByName(pb.HEALTH).methods] == ["Check",
                                                                                "Watch"]
        assert found.FindServiceByName(REFLECTION).methods_by_name["ServerReflectionInfo"]
        # the front still answers beside it
        live = channel.unary_unary(f"/{pb.INFERENCE}/ServerLive",
                                   request_serializer=pb.ServerLiveRequest.SerializeToString,
                                   response_deserializer=pb.ServerLiveResponse.FromString)
        assert live(pb.ServerLiveRequest(), timeout=10).live
