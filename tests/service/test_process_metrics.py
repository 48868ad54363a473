"""Process metrics of every server process (`core.metrics.Metrics.watch_process`): a real
`seqserve serve` with two API processes and an engine process reports the CPU seconds,
resident and virtual memory, open and most file descriptors and start time of each live
process, one series per process with its role and pid; `/metrics` is gzipped when the
scraper accepts it and the same text when decompressed."""

from __future__ import annotations

import gzip
import time
from pathlib import Path

import httpx
from process_support import serve
from prometheus_client.parser import text_string_to_metric_families

PROCESS = ("process_cpu_seconds_total", "process_resident_memory_bytes",
           "process_virtual_memory_bytes", "process_open_fds", "process_max_fds",
           "process_start_time_seconds")


def _process_samples(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in PROCESS:
                out.setdefault(sample.name, []).append((sample.labels, sample.value))
    return out


def test_every_process_reports_its_own_process_metrics_and_metrics_gzip(
        tiny_repo: Path) -> None:
    with serve(tiny_repo, "--layout", "engine", "--api-workers", "2") as server:
        assert httpx.post(f"{server.url}/v1/models/tiny-clf/classify",
                          json={"texts": ["one two"]}, timeout=30).status_code == 200
        plain = httpx.get(f"{server.url}/metrics", headers={"accept-encoding": "identity"},
                          timeout=30)
        with httpx.stream("GET", f"{server.url}/metrics", headers={"accept-encoding": "gzip"},
                          timeout=30) as zipped:
            raw = b"".join(zipped.iter_raw())  # the bytes sent, not decoded
    assert plain.headers.get("content-encoding") is None
    assert zipped.headers["content-encoding"] == "gzip"
    assert "accept-encoding" in zipped.headers["vary"].lower()
    samples = _process_samples(plain.text)
    assert set(samples) == set(PROCESS), sorted(samples)
    roles = sorted(labels["role"] for labels, _ in samples["process_resident_memory_bytes"])
    assert roles == ["api", "api", "engine", "supervisor"], roles
    pids = {labels["pid"] for labels, _ in samples["process_start_time_seconds"]}
    assert len(pids) == 4 and str(server.proc.pid) in pids, pids
    now = time.time()
    for labels, value in samples["process_start_time_seconds"]:
        assert now - 600 < value <= now + 1, (labels, value)
    for labels, value in samples["process_resident_memory_bytes"]:
        assert 10 << 20 < value < 8 << 30, (labels, value)  # a Python process's size
    for (labels, fds), (_, most) in zip(samples["process_open_fds"],
                                        samples["process_max_fds"], strict=True):
        assert 3 <= fds <= most, (labels, fds, most)
    cpu = sorted((labels["role"], labels["pid"]) for labels, value in
                 samples["process_cpu_seconds_total"] if value > 0)
    assert [role for role, _ in cpu] == roles and {pid for _, pid in cpu} == pids, cpu
    unzipped = gzip.decompress(raw).decode()  # the same exposition, a tenth of the bytes
    assert set(_process_samples(unzipped)) == set(PROCESS)
    assert len(raw) * 3 < len(unzipped), (len(raw), len(unzipped))
