"""`GrpcServer`: the gRPC front of one server process (grpc.aio, on its event loop).

Started by the server process once its app is loaded (`server/shutdown.py`
`DrainingServer.startup`), on `grpc_port`: in every API process, each binding the same port
with SO_REUSEPORT (grpc's default on Linux, set here explicitly), so the kernel spreads new
connections over them (the supervisor first makes sure that no other program listens there:
`check_free`); in the one-process server, once, without SO_REUSEPORT (`exclusive`: a port
another server holds, even with SO_REUSEPORT, fails the start instead of sharing its
connections with it). It keeps uvicorn's server protocol
(`close()`, `wait_closed()`): uvicorn stops it with its own listeners, so on SIGTERM it serves
as usual through the shutdown delay (readiness and health NOT_SERVING meanwhile), then stops
taking new RPCs when HTTP stops accepting, and the RPCs in flight finish within what is left of
the one drain budget (`AppState.drain_left`) before the models drain. A message over
`max_body_bytes` is refused by grpc itself (RESOURCE_EXHAUSTED), as HTTP refuses the body.
Idle connections close after `grpc_idle_timeout_s` (HTTP's keep-alive bound), and every
connection is asked to go after `grpc_max_connection_age_s`, its RPCs in flight given
`drain_timeout_s` (grpc's max_connection_idle, max_connection_age and its grace).

Server reflection (grpcio-reflection, `grpc.reflection.v1alpha.ServerReflection`, which
grpcurl and Postman fall back to) lists the served services (inference, health, reflection)
and serves their files from a private descriptor pool (`messages.new_pool`: the messages are
not in protobuf's default pool, `messages.py` says why), so a client needs no .proto file.
"""

from __future__ import annotations

import asyncio
import logging
import socket

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool
from grpc_reflection.v1alpha import reflection, reflection_pb2

from seqserve.service.api.grpc import messages as pb
from seqserve.service.api.grpc.service import InferenceService
from seqserve.service.web.state import AppState

log = logging.getLogger("seqserve.grpc")


def address(host: str, port: int) -> str:
    """`host:port` as grpc reads it (an IPv6 address in brackets)."""
    return f"[{host}]:{port}" if ":" in host and not host.startswith("[") else f"{host}:{port}"


def check_free(host: str, port: int) -> None:
    """RuntimeError when something listens on `host:port` already (another server, with
    SO_REUSEPORT or not): a socket without SO_REUSEPORT cannot bind then. (SO_REUSEADDR: the
    connections of a previous run still in TIME_WAIT are no obstacle.)"""
    if port == 0:
        return
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host.strip("[]"), port))
        except OSError as exc:
            raise RuntimeError(f"gRPC: cannot bind {address(host, port)} ({exc.strerror}): "
                               "choose another --grpc-port, or --no-grpc") from exc


REFLECTED = (pb.INFERENCE, pb.HEALTH, reflection.SERVICE_NAME)
"""The services server reflection lists."""


def reflection_pool() -> descriptor_pool.DescriptorPool:
    """The descriptor pool reflection serves: the front's .proto files and reflection's own
    (`reflection.proto`, which imports nothing)."""
    own = descriptor_pb2.FileDescriptorProto()
    reflection_pb2.DESCRIPTOR.CopyToProto(own)
    return pb.new_pool(own)


def _ms(seconds: float) -> int:
    """A grpc channel option's milliseconds (at least 1: 0 would mean "none" to some)."""
    return max(1, round(seconds * 1000))


class GrpcServer:
    """See the module doc. `port` is the bound port once started (`grpc_port` 0: a free
    one)."""

    def __init__(self, state: AppState, version: str, exclusive: bool = True) -> None:
        self.state = state
        self.exclusive = exclusive
        """The only process on its port (no SO_REUSEPORT); False: one of the API processes."""
        self.service = InferenceService(state, version)
        self.server: grpc.aio.Server | None = None
        self.port: int | None = None
        self._stopped: asyncio.Future[None] | None = None

    async def start(self) -> int:
        """Bind and serve; RuntimeError when the port cannot be bound."""
        s = self.state.settings
        server = grpc.aio.server(options=[
            ("grpc.so_reuseport", 0 if self.exclusive else 1),
            ("grpc.max_receive_message_length", s.max_body_bytes),
            ("grpc.max_connection_idle_ms", _ms(s.grpc_idle_timeout_s)),
            ("grpc.max_connection_age_ms", _ms(s.grpc_max_connection_age_s)),
            ("grpc.max_connection_age_grace_ms", _ms(s.drain_timeout_s)),
        ])
        server.add_generic_rpc_handlers(self.service.handlers())
        reflection.enable_server_reflection(REFLECTED, server, pool=reflection_pool())
        where = address(s.host, s.grpc_port)
        try:
            port = server.add_insecure_port(where)
        except RuntimeError as exc:
            raise RuntimeError(f"gRPC: cannot bind {where} ({exc}): choose another "
                               "--grpc-port, or --no-grpc") from exc
        await server.start()
        self.server, self.port = server, port
        log.info("gRPC (KServe v2 / Triton GRPCInferenceService, grpc.health.v1) on %s",
                 address(s.host, self.port))
        return self.port

    def close(self) -> None:
        """Stop taking new RPCs now; those in flight get what is left of the drain budget
        (`wait_closed` waits for them)."""
        if self.server is None or self._stopped is not None:
            return
        self.service.closing.set()
        self._stopped = asyncio.ensure_future(self.server.stop(self.state.drain_left()))

    async def wait_closed(self) -> None:
        if self._stopped is not None:
            await asyncio.shield(self._stopped)
