"""The gRPC front's idle bound (issue 50): a connection with no RPC is closed after
`grpc_idle_timeout_s`, as HTTP closes an idle keep-alive connection; one that keeps calling
stays open. Seen on a raw socket that speaks only the HTTP/2 preface and SETTINGS."""

from __future__ import annotations

import socket
import time
from pathlib import Path

import grpc
from grpc_support import serve_with_grpc
from service_fakes import settings

from seqserve.service.api.grpc import messages as pb
from seqserve.service.server.app import create_app

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
SETTINGS = b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"
"""An empty SETTINGS frame: length 0, type 4, no flags, stream 0."""
GOAWAY = 7


def _until_closed(where: str, limit_s: float) -> tuple[float | None, list[int]]:
    """Seconds until the server closed a connection that sent the preface and nothing else
    (None: still open after `limit_s`), and the types of the frames it sent."""
    host, port = where.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=limit_s) as sock:
        sock.sendall(PREFACE + SETTINGS)
        start = time.monotonic()
        data = b""
        sock.settimeout(0.2)
        while time.monotonic() - start < limit_s:
            try:
                chunk = sock.recv(65536)
            except TimeoutError:
                continue
            except ConnectionResetError:
                chunk = b""
            if not chunk:
                return time.monotonic() - start, _frame_types(data)
            data += chunk
    return None, _frame_types(data)


def _frame_types(data: bytes) -> list[int]:
    types, at = [], 0
    while at + 9 <= len(data):
        length = int.from_bytes(data[at:at + 3], "big")
        types.append(data[at + 3])
        at += 9 + length
    return types


def test_idle_grpc_connections_are_closed_after_the_idle_timeout(tiny_repo: Path) -> None:
    app = create_app(settings(tiny_repo, grpc_port=0, grpc_idle_timeout_s=0.5))
    with serve_with_grpc(app) as running:
        took, frames = _until_closed(running.grpc, 5.0)
        # a channel that calls more often than the timeout keeps its connection
        with grpc.insecure_channel(running.grpc) as channel:
            live = channel.unary_unary(
                f"/{pb.INFERENCE}/ServerLive",
                request_serializer=pb.ServerLiveRequest.SerializeToString,
                response_deserializer=pb.ServerLiveResponse.FromString)
            states: list[grpc.ChannelConnectivity] = []
            channel.subscribe(states.append)
            for _ in range(8):
                assert live(pb.ServerLiveRequest(), timeout=10).live
                time.sleep(0.1)
            busy = list(states)
            time.sleep(1.5)  # idle now: the server closes it and the channel goes IDLE
            idle = list(states)
    assert took is not None and 0.4 <= took <= 3.0, (took, frames)
    assert GOAWAY in frames, frames
    assert busy.count(grpc.ChannelConnectivity.READY) == 1 and \
        grpc.ChannelConnectivity.IDLE not in busy[busy.index(grpc.ChannelConnectivity.READY):]
    assert idle[-1] in (grpc.ChannelConnectivity.IDLE, grpc.ChannelConnectivity.CONNECTING,
                        grpc.ChannelConnectivity.TRANSIENT_FAILURE), idle


def test_without_a_short_timeout_an_idle_connection_stays_open(tiny_repo: Path) -> None:
    """The control: at the default (30 s) the same connection is open 2 s later."""
    app = create_app(settings(tiny_repo, grpc_port=0))
    with serve_with_grpc(app) as running:
        took, _ = _until_closed(running.grpc, 2.0)
    assert took is None


def test_an_idle_model_stream_infer_stream_is_ended_a_busy_one_is_not(tiny_repo: Path) -> None:
    """`stream_idle_timeout_s`: a ModelStreamInfer stream whose client sends a request more
    often than the bound stays open; once it sends none (and none is in flight) for that
    long, the server ends it UNAVAILABLE, saying why."""
    import queue

    import numpy as np
    import pytest

    grpcclient = pytest.importorskip("tritonclient.grpc")
    app = create_app(settings(tiny_repo, grpc_port=0, stream_idle_timeout_s=0.6))
    got: queue.Queue[tuple[object, object]] = queue.Queue()
    with serve_with_grpc(app) as running:
        client = grpcclient.InferenceServerClient(url=running.grpc)
        client.start_stream(lambda result, error: got.put((result, error)))
        try:
            for i in range(6):  # busy: a request every 0.25 s for 1.5 s
                text = grpcclient.InferInput("text", [1], "BYTES")
                text.set_data_from_numpy(np.array([b"one two"], dtype=object))
                client.async_stream_infer("tiny-clf", [text], request_id=f"r{i}")
                result, error = got.get(timeout=30)
                answered = time.monotonic()
                assert error is None and result is not None, error
                time.sleep(0.25)
            _, error = got.get(timeout=30)  # idle now: the server ends the stream
            took = time.monotonic() - answered
        finally:
            client.stop_stream()
            client.close()
    assert error is not None and "idle" in str(error), error
    assert "UNAVAILABLE" in str(error) or "Unavailable" in str(error), error
    assert took >= 0.5, took  # not before the bound (its end: the wait's 30 s above)
