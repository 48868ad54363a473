"""seqserve.service.server._front (native HTTP front) with an asyncio driver and real HTTP clients.

Skipped when the extension is not built (native/build.sh).
"""

from __future__ import annotations

import http.client
import json
import socket
import sys
import threading
import time
from pathlib import Path

import pytest

_front = pytest.importorskip("seqserve.service.server._front")

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "native"))
from echo_front import LoopThread, listen  # noqa: E402


class Server:
    def __init__(self, **kw):
        self.sock = listen()
        self.port = self.sock.getsockname()[1]
        self.front = _front.Front(self.sock.fileno(), **kw)
        self.lt = LoopThread(self.front)
        self.driver = self.lt.driver

    def close(self, timeout=1.0):
        self.front.close(timeout)
        self.lt.stop()
        self.sock.close()

    def conn(self):
        return http.client.HTTPConnection("127.0.0.1", self.port, timeout=5)

    def raw(self):
        s = socket.create_connection(("127.0.0.1", self.port), timeout=5)
        return s


@pytest.fixture
def server(request):
    kw = getattr(request, "param", {})
    s = Server(**kw)
    yield s
    s.close()


def read_all(s: socket.socket) -> bytes:
    out = b""
    while True:
        try:
            d = s.recv(65536)
        except (TimeoutError, ConnectionResetError):
            break
        if not d:
            break
        out += d
    return out


def wait_for(cond, timeout=5.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.01)
    return False


def test_keep_alive_many_requests_one_connection(server):
    c = server.conn()
    for i in range(50):
        c.request("POST", f"/echo?i={i}", body=f"body{i}".encode(), headers={"X-Test": "Yes"})
        r = c.getresponse()
        assert r.status == 200
        d = json.loads(r.read())
        assert d["query"] == f"i={i}" and d["body"] == f"body{i}" and d["method"] == "POST"
        assert ["x-test", "Yes"] in d["headers"]
    st = server.front.stats()
    assert st["accepted"] == 1 and st["requests"] == 50 and st["connections"] == 1
    c.close()


def test_take_tuple_shape(server):
    server.driver.keep = True
    c = server.conn()
    before = time.monotonic()
    c.request("GET", "/echo?x=%20y")
    assert c.getresponse().status == 200
    rid, method, path, query, headers, body, client, received, whole = server.driver.taken[-1]
    assert whole is True
    assert isinstance(rid, int) and method == "GET" and path == "/echo" and query == b"x=%20y"
    assert all(isinstance(k, bytes) and isinstance(v, bytes) for k, v in headers)
    assert body == b"" and client[0] == "127.0.0.1" and isinstance(client[1], int)
    assert before - 0.5 < received < time.monotonic() + 0.01
    assert server.front.respond(rid, 200, [], b"") is False  # already answered


def test_pipelined_requests(server):
    s = server.raw()
    reqs = b"".join(
        f"GET /echo?n={i} HTTP/1.1\r\nHost: x\r\n\r\n".encode() for i in range(5)
    ) + b"GET /close HTTP/1.1\r\nHost: x\r\n\r\n"
    s.sendall(reqs)
    data = read_all(s)
    assert data.count(b"HTTP/1.1 200 OK") == 6
    order = [data.find(f'"query": "n={i}"'.encode()) for i in range(5)]
    assert all(o > 0 for o in order) and order == sorted(order)


def test_chunked_request_body(server):
    s = server.raw()
    s.sendall(
        b"POST /close HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n"
    )
    data = read_all(s)
    head, _, body = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200")
    assert json.loads(body)["body"] == "hello world"


@pytest.mark.parametrize("server", [{"max_body_bytes": 1024}], indirect=True)
def test_413_content_length_and_chunked(server):
    # a body announced over the limit: read and dropped, handed over without it (the app
    # answers its 413 by the announced length) and the connection stays usable
    c = server.conn()
    c.request("POST", "/echo", body=b"x" * 2000)
    r = c.getresponse()
    assert r.status == 200
    assert json.loads(r.read())["body"] == ""
    c.request("POST", "/echo", body=b"x" * 10)
    assert c.getresponse().status == 200
    handed = server.front.stats()["requests"]
    # a chunked body over the limit: handed over cut to max + 1 bytes (the app answers its
    # 413 from them), the rest never read: the connection closes after the answer
    s = server.raw()
    s.sendall(b"POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n")
    s.sendall(b"400\r\n" + b"y" * 1024 + b"\r\n400\r\n" + b"y" * 1024 + b"\r\n0\r\n\r\n")
    data = read_all(s)
    assert data.startswith(b"HTTP/1.1 200")
    assert json.loads(data.split(b"\r\n\r\n", 1)[1])["body"] == "y" * 1025
    assert server.front.stats()["requests"] == handed + 1
    # within the limit it passes
    c = server.conn()
    c.request("POST", "/echo", body=b"x" * 1024)
    assert c.getresponse().status == 200


@pytest.mark.parametrize("server", [{"max_headers": 10, "max_url_bytes": 100}], indirect=True)
def test_431_and_414(server):
    # more fields than max_headers (checked natively after hyper's parse)
    c = server.conn()
    c.putrequest("GET", "/echo")
    for i in range(20):
        c.putheader(f"x-h{i}", "v")
    c.endheaders()
    r = c.getresponse()
    assert r.status == 431 and json.loads(r.read())["status"] == 431
    # a head far above max_head_bytes: hyper's own 431, rewritten to the JSON answer
    s = server.raw()
    s.sendall(b"GET /echo HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 100_000 + b"\r\n\r\n")
    data = read_all(s)
    assert data.startswith(b"HTTP/1.1 431")
    assert data.endswith(b'{"error": "request header fields too large", "status": 431}')
    # a head just above max_head_bytes (16384)
    c = server.conn()
    c.request("GET", "/echo", headers={"X-Big": "b" * 17000})
    r = c.getresponse()
    assert r.status == 431 and json.loads(r.read())["status"] == 431
    # URL over max_url_bytes
    c = server.conn()
    c.request("GET", "/echo?" + "q" * 200)
    r = c.getresponse()
    assert r.status == 414
    assert json.loads(r.read()) == {"error": "request URI too long", "status": 414}
    assert server.front.stats()["requests"] == 0


def test_bad_request_json(server):
    s = server.raw()
    s.sendall(b"NOT A REQUEST\r\n\r\n")
    data = read_all(s)
    assert data.startswith(b"HTTP/1.1 400")
    assert b'"status": 400' in data


def test_sse_stream(server):
    c = server.conn()
    c.request("GET", "/sse")
    r = c.getresponse()
    assert r.status == 200
    assert r.getheader("content-type") == "text/event-stream"
    assert r.getheader("transfer-encoding") == "chunked"
    assert r.read() == b"data: 0\n\ndata: 1\n\ndata: 2\n\n"
    # the connection stays usable
    c.request("GET", "/echo")
    assert c.getresponse().status == 200


def test_gone_reported_on_disconnect(server):
    server.driver.keep = True
    s = server.raw()
    s.sendall(b"GET /never HTTP/1.1\r\nHost: x\r\n\r\n")
    assert wait_for(lambda: server.driver.taken)
    rid = server.driver.taken[-1][0]
    s.close()
    assert wait_for(lambda: rid in server.driver.gone)
    assert server.front.respond(rid, 200, [], b"late") is False
    assert server.driver.gone.count(rid) == 1
    assert server.front.stats()["pending"] == 0


def test_eventfd_and_take_limit():
    sock = listen()
    f = _front.Front(sock.fileno())
    try:
        clients = []
        for i in range(5):
            s = socket.create_connection(sock.getsockname(), timeout=5)
            s.sendall(f"GET /echo?{i} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
            clients.append(s)
        assert wait_for(lambda: f.stats()["waiting"] == 5)
        import select

        assert select.select([f.fileno()], [], [], 1)[0]
        assert len(f.take(2)) == 2
        assert select.select([f.fileno()], [], [], 0)[0]  # still readable: items remain
        rest = f.take(10)
        assert len(rest) == 3
        assert not select.select([f.fileno()], [], [], 0.05)[0]
        f.respond_many([(r[0], 200, [], b"ok") for r in rest])
        first = f.stats()
        assert first["pending"] == 2
        # the first two (taken earlier) one by one
        # (rids follow the order in which heads completed, not the connection order)
        taken_first = [rid for rid in range(1, 6) if rid not in {r[0] for r in rest}]
        assert all(f.respond(rid, 200, [], b"ok") for rid in taken_first)
        for s in clients:
            assert read_all_until(s, b"ok").startswith(b"HTTP/1.1 200")
        for s in clients:
            s.close()
    finally:
        f.close(0.5)
        sock.close()


def read_all_until(s, marker):
    out = b""
    while marker not in out:
        d = s.recv(4096)
        if not d:
            break
        out += d
    return out


@pytest.mark.parametrize("server", [{"head_timeout_s": 0.3, "keep_alive_s": 0.3}], indirect=True)
def test_head_and_keep_alive_timeouts(server):
    s = server.raw()
    s.sendall(b"GET /echo HTTP/1.1\r\nHost")
    t0 = time.monotonic()
    data = read_all(s)
    assert 0.2 < time.monotonic() - t0 < 3
    assert data.startswith(b"HTTP/1.1 408")
    s = server.raw()
    s.sendall(b"GET /echo HTTP/1.1\r\nHost: x\r\n\r\n")
    first = s.recv(65536)
    assert first.startswith(b"HTTP/1.1 200")
    t0 = time.monotonic()
    assert read_all(s) == b""  # idle keep-alive closed
    assert 0.2 < time.monotonic() - t0 < 3
    assert wait_for(lambda: server.front.stats()["connections"] == 0)


def test_close_finishes_in_flight_answers():
    srv = Server()
    try:
        result = {}

        def client():
            c = srv.conn()
            c.request("GET", "/slow?ms=300")
            r = c.getresponse()
            result["status"] = r.status
            result["body"] = json.loads(r.read())

        idle = srv.conn()
        idle.request("GET", "/echo")
        assert idle.getresponse().status == 200  # an idle keep-alive connection
        t = threading.Thread(target=client)
        t.start()
        assert wait_for(lambda: srv.front.stats()["requests"] == 2)
        t0 = time.monotonic()
        srv.front.close(5.0)  # the loop thread answers meanwhile (GIL released)
        took = time.monotonic() - t0
        t.join(5)
        assert result["status"] == 200 and result["body"]["path"] == "/slow"
        assert 0.1 < took < 3
        st = srv.front.stats()
        assert st["connections"] == 0 and st["closed"]
        # no longer accepting
        with pytest.raises(OSError):
            c = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=0.5)
            c.request("GET", "/echo")
            c.getresponse()
    finally:
        srv.lt.stop()
        srv.sock.close()


def test_close_does_not_hang_on_unanswered():
    srv = Server()
    try:
        s = srv.raw()
        s.sendall(b"GET /never HTTP/1.1\r\nHost: x\r\n\r\n")
        assert wait_for(lambda: srv.front.stats()["requests"] == 1)
        t0 = time.monotonic()
        srv.front.close(0.3)
        assert time.monotonic() - t0 < 2
        s.close()
    finally:
        srv.lt.stop()
        srv.sock.close()


def test_no_wake_up_is_lost_while_requests_keep_arriving():
    """The eventfd says "requests wait" whenever they do: a taker that sleeps in `select`
    between takes, as the event loop does, never sleeps through waiting requests while many
    clients keep sending (a `signal` between clearing the flag and reading the eventfd once
    left the flag set and nothing readable: the loop never woke again)."""
    import select

    sock = listen()
    f = _front.Front(sock.fileno())
    stop = threading.Event()
    answered = [0]
    missed: list[int] = []

    def taker() -> None:
        while not stop.is_set():
            ready = select.select([f.fileno()], [], [], 0.5)[0]
            if not ready:
                if f.stats()["waiting"]:
                    missed.append(f.stats()["waiting"])
                    return
                continue
            got = f.take(8)  # (few per take: many takes, many chances for the race)
            f.respond_many([(r[0], 200, [], b"ok") for r in got])
            answered[0] += len(got)

    def client() -> None:
        s = socket.create_connection(sock.getsockname(), timeout=5)
        try:
            while not stop.is_set():
                s.sendall(b"GET /x HTTP/1.1\r\nHost: x\r\n\r\n")
                if not read_all_until(s, b"ok").startswith(b"HTTP/1.1 200"):
                    return
        except OSError:
            return
        finally:
            s.close()

    threads = [threading.Thread(target=taker)] + [threading.Thread(target=client)
                                                  for _ in range(32)]
    try:
        for t in threads:
            t.start()
        time.sleep(4.0)
    finally:
        stop.set()
        for t in threads:
            t.join(10)
        f.close(0.5)
        sock.close()
    assert not missed, f"the eventfd was not readable with {missed[0]} requests waiting"
    assert answered[0] > 1000
