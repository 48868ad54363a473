"""bench/opengen.c (the C load generator of bench/overload.py --generator c) against a real
server on the tiny bundles: it is built, its closed and open loops send the loadtest's bodies,
and its records (status, Server-Timing, drops at its connection cap) add up. No timing
assertions."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from service_fakes import serve_in_thread, settings

from bench import opengen
from seqserve.service.server.app import create_app

pytestmark = [pytest.mark.timeout(120),
              pytest.mark.skipif(shutil.which("gcc") is None, reason="gcc is not installed")]


@pytest.fixture(scope="module")
def url(tiny_repo: Path) -> Iterator[str]:
    with serve_in_thread(create_app(settings(tiny_repo))) as base:
        yield base


def spec(url: str, texts: Path, **more: object) -> dict[str, object]:
    return {"url": url, "model": "tiny-clf", "task": "classify", "texts_per_request": 3,
            "duration_s": 1.0, "texts_file": str(texts), **more}


@pytest.fixture
def texts(tmp_path: Path) -> Path:
    path = tmp_path / "texts.txt"
    path.write_text("one two\nun deux\nthree four five\nquatre\n", encoding="utf-8")
    return path


def test_a_closed_loop_is_answered_with_server_timing(url: str, texts: Path) -> None:
    res = opengen.run(spec(url, texts, concurrency=4))
    assert res["ok"] > 10 and res["ok"] == res["scheduled"]
    assert res["dropped"] == res["refused"] == res["other_errors"] == 0
    assert len(res["queue_ms"]) == len(res["compute_ms"]) == len(res["latency_s"]) == res["ok"]
    assert all(q >= 0 for q in res["queue_ms"]) and all(c > 0 for c in res["compute_ms"])
    # the server's total (Server-Timing) holds its queue and compute; the rest of each
    # latency lies outside it (never below 0 but for the two clocks' rounding)
    assert len(res["server_total_ms"]) == len(res["outside_ms"]) == res["ok"]
    assert all(t + 0.01 >= q + c for t, q, c in zip(res["server_total_ms"], res["queue_ms"],
                                                    res["compute_ms"], strict=True))
    assert all(o > -0.01 for o in res["outside_ms"])
    assert 0 < res["load_cpu_s"] < res["wall_s"]


def test_an_open_loop_drops_at_its_connection_cap_and_counts_every_arrival(
        url: str, texts: Path) -> None:
    res = opengen.run(spec(url, texts, rate=400.0, max_in_flight=1))
    assert 200 < res["scheduled"] < 650  # Poisson arrivals at 400/s for 1 s
    assert res["ok"] + res["dropped"] + res["refused"] + res["other_errors"] == res["scheduled"]
    assert res["ok"] > 0 and len(res["send_lag_s"]) == res["scheduled"] - res["dropped"]


def test_errors_are_counted_by_status(url: str, texts: Path) -> None:
    res = opengen.run(spec(url, texts, model="no-such-model", concurrency=2))
    assert res["ok"] == 0 and res["scheduled"] > 0
    assert res["statuses"] == {"404": res["scheduled"]} and res["other_errors"] == res["scheduled"]


def test_the_requests_are_the_loadtests_bodies(texts: Path) -> None:
    raw = opengen.render(spec("http://127.0.0.1:9", texts), ["a b", "c"], 3)
    first = raw[4:4 + int.from_bytes(raw[:4], "little")]
    head, body = first.split(b"\r\n\r\n", 1)
    assert head.startswith(b"POST /v1/models/tiny-clf/classify HTTP/1.1\r\n")
    assert f"content-length: {len(body)}".encode() in head.lower()
    assert body.startswith(b'{"texts":[') and body.count(b'"') == 2 + 2 * 3
