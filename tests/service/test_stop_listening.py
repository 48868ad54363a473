"""Stopping loses nothing a client sent (issue 37): real `seqserve serve` processes, raw sockets.

- requests pipelined on a connection before SIGTERM are all answered: the drain closes the
  connection after the last one, never inside the pipeline (it answered the first with
  `Connection: close` and dropped the rest);
- requests sent on new connections just before the listener closes (waiting in the listen
  queue) and on idle keep-alive connections are answered (200, or 503 with `Connection:
  close`), none reset;
- a connection opened before SIGTERM that sends its first request a moment after it (its
  client connected to send one) is answered, not closed under it; one that never sends is
  closed soon after (not held for the header deadline);
- SIGTERM with requests and a stream in flight, the stream longer than the shutdown delay:
  every admitted request answered, the stream whole, exit 0 (the API processes are given
  shutdown delay + drain to stop, not the delay alone).
"""

from __future__ import annotations

import json
import signal
import socket
import threading
import time
from pathlib import Path

import httpx
import pytest
from process_support import serve
from server_support import RawConnection

BODY = json.dumps({"texts": ["one two three"]}).encode()
HEAVY = json.dumps({"texts": ["one two three four five six seven eight"] * 16}).encode()
PATH = "/v1/models/tiny-clf/classify"


def request_bytes(host: str, body: bytes = BODY) -> bytes:
    return (f"POST {PATH} HTTP/1.1\r\nhost: {host}\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\n\r\n").encode() + body


def answers_until_close(conn: RawConnection, expected: int) -> list[tuple[int, str]]:
    """Read `expected` answers (status, Connection field), then the server's close: a clean
    end of stream (a reset or an early close raises)."""
    out = []
    for _ in range(expected):
        status, headers, _ = conn.read_response()
        out.append((status, headers.get("connection", "")))
    assert conn.buffer == b"" and conn.sock.recv(1) == b"", out
    return out


@pytest.mark.parametrize("layout", ["replicated", "engine"])
def test_pipelined_and_queued_requests_sent_before_sigterm_are_all_answered(
        tiny_repo: Path, layout: str) -> None:
    with serve(tiny_repo, "--layout", layout, "--api-workers", "2", "--max-batch-size", "1",
               "--queue-size", "4096",
               "--max-queue-wait-s", "600", "--request-timeout-s", "600",
               "--shutdown-delay-s", "0") as server:
        host = server.url.removeprefix("http://")
        kept = [RawConnection(server.url) for _ in range(20)]
        for conn in kept:  # accepted and answered once: idle keep-alive connections now
            assert conn.request("GET", "/v2/health/live")[0] == 200
        piped = kept[:10]
        fresh = [RawConnection(server.url) for _ in range(20)]  # likely still queued
        for conn in fresh:
            conn.sock.sendall(request_bytes(host, HEAVY))
        for conn in kept[10:]:  # one more on each idle one
            conn.sock.sendall(request_bytes(host, HEAVY))
        for conn in piped:  # three requests at once on each, just before the signal
            conn.sock.sendall(request_bytes(host, HEAVY) * 3)
        server.proc.send_signal(signal.SIGTERM)
        got = {"piped": [answers_until_close(c, 3) for c in piped],
               "fresh": [answers_until_close(c, 1) for c in fresh],
               "idle": [answers_until_close(c, 1) for c in kept[10:]]}
        for conn in [*kept, *fresh]:
            conn.close()
        assert server.proc.wait(timeout=60) == 0
    for per_conn in got.values():
        for answers in per_conn:
            for status, connection in answers:
                assert status == 200 or (status == 503 and connection == "close"), got
    for answers in got["piped"]:  # closed after the last, never inside the pipeline
        assert [c for _, c in answers[:-1]] == ["", ""], answers
    assert any(a[-1][1] == "close" for a in got["piped"]), got  # the drain met pipelines


def _idle_and_fresh_around_the_close(url: str, delay_s: float) -> dict[str, int]:
    """Keep-alive connections that send a request at moments around the end of the
    shutdown delay (when the listener closes), and new connections at those moments."""
    host = url.removeprefix("http://")
    tally: dict[str, int] = {}
    lock = threading.Lock()

    def note(outcome: str) -> None:
        with lock:
            tally[outcome] = tally.get(outcome, 0) + 1

    def one(at: float, fresh: bool, conn: RawConnection | None) -> None:
        time.sleep(max(0.0, at - time.monotonic()))
        try:
            if fresh:
                conn = RawConnection(url, timeout=30)
            assert conn is not None
            if not fresh and _closed_by_server(conn.sock):
                note("closed before sending")  # the client sees it: no request was lost
                return
            conn.sock.sendall(request_bytes(host))
            status, headers, _ = conn.read_response()
            note(str(status) if status == 200 or headers.get("connection") == "close"
                 else f"{status} kept open")
        except ConnectionRefusedError:
            note("refused")  # nothing was sent: the listener had closed
        except (ConnectionResetError, BrokenPipeError):
            note("reset")
        except OSError as exc:
            note(type(exc).__name__)
        finally:
            if conn is not None:
                conn.close()

    idle = [RawConnection(url) for _ in range(40)]
    for conn in idle:
        assert conn.request("GET", "/v2/health/live")[0] == 200
    return_at = time.monotonic()
    threads = []
    end = return_at + delay_s
    for i in range(40):
        at = end - 0.2 + i * 0.01  # 0.2 s before the close to 0.2 s after
        threads.append(threading.Thread(target=one, args=(at, False, idle[i])))
        threads.append(threading.Thread(target=one, args=(at, True, None)))
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return tally


def _closed_by_server(sock: socket.socket) -> bool:
    sock.setblocking(False)
    try:
        return sock.recv(1, socket.MSG_PEEK) == b""
    except BlockingIOError:
        return False
    finally:
        sock.setblocking(True)


def test_requests_sent_as_the_listener_closes_are_answered_not_reset(tiny_repo: Path) -> None:
    delay = 1.0
    with serve(tiny_repo, "--layout", "replicated", "--api-workers", "2",
               "--shutdown-delay-s", str(delay)) as server:
        server.proc.send_signal(signal.SIGTERM)
        tally = _idle_and_fresh_around_the_close(server.url, delay)
        assert server.proc.wait(timeout=60) == 0
    assert set(tally) <= {"200", "503", "refused", "closed before sending"}, tally
    assert tally.get("200", 0) >= 20, tally


@pytest.mark.parametrize("layout", ["replicated", "engine"])
def test_a_new_connection_gets_its_first_request_answered_after_sigterm(
        tiny_repo: Path, layout: str) -> None:
    with serve(tiny_repo, "--layout", layout, "--api-workers", "2", "--shutdown-delay-s", "0",
               "--header-timeout-s", "30") as server:
        host = server.url.removeprefix("http://")
        late = [RawConnection(server.url) for _ in range(8)]
        silent = RawConnection(server.url)
        time.sleep(0.3)  # accepted by now: the listener's close does not take them
        t0 = time.monotonic()
        server.proc.send_signal(signal.SIGTERM)
        time.sleep(0.3)
        for conn in late:
            conn.sock.sendall(request_bytes(host))
        answers = [answers_until_close(conn, 1)[0] for conn in late]
        assert silent.sock.recv(1) == b""  # closed cleanly, long before the header deadline
        silent_closed = time.monotonic() - t0
        for conn in [*late, silent]:
            conn.close()
        assert server.proc.wait(timeout=60) == 0
    for status, connection in answers:
        assert status == 200 or (status == 503 and connection == "close"), answers
    assert silent_closed < 15, silent_closed


def test_sigterm_with_a_stream_and_requests_in_flight_answers_all_and_exits_0(
        tiny_repo: Path, endless_lm_repo: Path, tmp_path: Path) -> None:
    import shutil

    repo = tmp_path / "repo"
    shutil.copytree(tiny_repo, repo)
    shutil.copytree(endless_lm_repo / "endless-lm", repo / "endless-lm")
    with serve(repo, "--layout", "engine", "--api-workers", "2", "--shutdown-delay-s",
               "1", "--max-queue-wait-s", "600", "--request-timeout-s", "600") as server:
        stream: dict[str, object] = {}

        def generate() -> None:
            events = []
            with httpx.stream("POST", f"{server.url}/v1/models/endless-lm/generate",
                              json={"prompt": "one two", "max_new_tokens": 400,
                                    "stream": True, "temperature": 0}, timeout=60) as r:
                stream["status"] = r.status_code
                for line in r.iter_lines():
                    if line.startswith("data: "):
                        events.append(line[len("data: "):])
            stream["events"] = events

        streamer = threading.Thread(target=generate)
        streamer.start()
        conns = [RawConnection(server.url) for _ in range(40)]
        for conn in conns:
            conn.send("POST", PATH, BODY, {"content-type": "application/json"})
        time.sleep(0.3)
        t0 = time.monotonic()
        server.proc.send_signal(signal.SIGTERM)
        statuses = [conn.read_response()[0] for conn in conns]
        for conn in conns:
            conn.close()
        streamer.join(120)
        code = server.proc.wait(timeout=120)
        took = time.monotonic() - t0
    assert statuses == [200] * 40, statuses
    assert stream["status"] == 200
    events = stream["events"]
    assert isinstance(events, list) and events[-1] == "[DONE]", events[-3:]
    finals = [json.loads(e) for e in events[:-1] if "finish_reason" in e]
    assert any(f.get("finish_reason") == "length" for f in finals), events[-3:]
    assert code == 0
    assert took > 1.0  # the stream outlived the shutdown delay: it was drained, not cut
