"""What the API <-> engine transport costs per message: seqserve's ZeroMQ `Channel` (DEALER to
ROUTER over ipc, the engine transport) against a plain Unix stream socket with length-prefixed
frames, both driven by an asyncio loop with `add_reader` the same way, between two processes.

An echo process answers every message; the client keeps `--in-flight` messages outstanding for
`--messages` round trips. Printed per transport and in-flight count: round trips/s and CPU
microseconds per message in each process (user + system time of the whole process, its ZeroMQ
I/O thread included, from getrusage / /proc). It decides whether replacing ZeroMQ is worth it:
one classify request is one message each way.

    python bench/bench_transport.py --in-flight 1 4 64 --messages 20000
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import socket
import struct
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import zmq  # noqa: E402

from seqserve.service.engine.transport import Channel  # noqa: E402

PAYLOAD = b"p" * 300
"""About one short-text classify request's encoded size."""


def _own_cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Stream:
    """A Unix stream socket read with add_reader: 4-byte length + payload per message."""

    def __init__(self, sock: socket.socket, on_message: Callable[[bytes], None]) -> None:
        sock.setblocking(False)
        self.sock, self.on_message, self.buffer = sock, on_message, bytearray()
        asyncio.get_running_loop().add_reader(sock.fileno(), self._read)

    def send(self, payload: bytes) -> None:
        self.sock.sendall(struct.pack("<I", len(payload)) + payload)

    def _read(self) -> None:
        try:
            data = self.sock.recv(1 << 20)
        except BlockingIOError:
            return
        buf = self.buffer
        buf += data
        at = 0
        while len(buf) - at >= 4:
            (n,) = struct.unpack_from("<I", buf, at)
            if len(buf) - at - 4 < n:
                break
            self.on_message(bytes(buf[at + 4: at + 4 + n]))
            at += 4 + n
        del buf[:at]


async def _echo(kind: str, address: str) -> None:
    if kind == "zmq":
        sock: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.ROUTER)
        sock.bind(address)
        channel: list[Channel] = []
        channel.append(Channel(sock, lambda frames: channel[0].send(frames)))
    else:
        listener = socket.socket(socket.AF_UNIX)
        listener.bind(address)
        listener.listen()
        listener.setblocking(False)
        streams: list[Stream] = []

        def accept() -> None:
            conn, _ = listener.accept()
            streams.append(Stream(conn, lambda m: streams[-1].send(m)))

        asyncio.get_running_loop().add_reader(listener.fileno(), accept)
    await asyncio.sleep(3600)


async def _drive(kind: str, address: str, messages: int, in_flight: int) -> tuple[float, float]:
    done = asyncio.Event()
    count = {"answered": 0, "sent": 0}
    send: Callable[[], None]

    def answered(_: object) -> None:
        count["answered"] += 1
        if count["sent"] < messages:
            count["sent"] += 1
            send()
        if count["answered"] >= messages:
            done.set()

    if kind == "zmq":
        sock: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.DEALER)
        sock.connect(address)
        channel = Channel(sock, answered)

        def send() -> None:
            channel.send([PAYLOAD])
    else:
        conn = socket.socket(socket.AF_UNIX)
        conn.connect(address)
        stream = Stream(conn, answered)

        def send() -> None:
            stream.send(PAYLOAD)
    await asyncio.sleep(0.3)
    cpu0, t0 = _own_cpu_s(), time.perf_counter()
    for _ in range(in_flight):
        count["sent"] += 1
        send()
    await done.wait()
    return _own_cpu_s() - cpu0, time.perf_counter() - t0


def measure(kind: str, messages: int, in_flight: int, folder: Path) -> dict[str, float]:
    path = folder / f"{kind}-{in_flight}.sock"
    address = f"ipc://{path}" if kind == "zmq" else str(path)
    pid = os.fork()
    if pid == 0:  # the echo process
        try:
            asyncio.run(_echo(kind, address))
        finally:
            os._exit(0)
    try:
        time.sleep(0.5)
        echo0 = _cpu_s(pid)
        client_s, wall_s = asyncio.run(_drive(kind, address, messages, in_flight))
        echo_s = _cpu_s(pid) - echo0
    finally:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
    return {"per_s": messages / wall_s, "client_us": 1e6 * client_s / messages,
            "echo_us": 1e6 * echo_s / messages}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--messages", type=int, default=20000)
    ap.add_argument("--in-flight", type=int, nargs="+", default=[1, 4, 64])
    args = ap.parse_args(argv)
    print(f"load average {os.getloadavg()[0]:.2f}; {args.messages} round trips of "
          f"{len(PAYLOAD)} bytes")
    print("| transport | in flight | round trips/s | client CPU us/msg | echo CPU us/msg |")
    print("| --- | ---: | ---: | ---: | ---: |")
    with tempfile.TemporaryDirectory() as tmp:
        for in_flight in args.in_flight:
            for kind in ("zmq", "unix"):
                r = measure(kind, args.messages, in_flight, Path(tmp))
                print(f"| {kind} | {in_flight} | {r['per_s']:.0f} | {r['client_us']:.1f} | "
                      f"{r['echo_us']:.1f} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
