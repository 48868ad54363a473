"""`seqserve loadtest` end to end against the stub server: report, files, plots, markdown;
and the Locust file against the same server."""

from __future__ import annotations

import argparse
import csv
import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from seqserve.cli import loadtest as command
from seqserve.models.errors import UserError

pytestmark = pytest.mark.timeout(60)
REPO = Path(__file__).resolve().parents[2]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    command.add_arguments(parser)
    return command.run(parser.parse_args(argv))


def _assert_png(path: Path) -> None:
    assert path.read_bytes()[:8] == PNG_MAGIC and path.stat().st_size > 5000


def test_cli_single_run_writes_results_and_plots(
    stub_server: Any, texts_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "single"
    argv = [stub_server.url, "--model", "fast", "--task", "translate", "--rate", "40",
            "--requests", "40", "--texts", str(texts_file), "--out", str(out),
            "--slo-p99", "5000", "--label", "stub translate"]  # fmt: skip
    assert _main(argv) == 0
    printed = capsys.readouterr()
    assert "generated tokens" in printed.out and "server queue ms" in printed.out
    assert "SLO p99 <= 5000 ms: met" in printed.out
    assert "] sent " in printed.err  # the per-second progress line
    res = json.loads((out / "results.json").read_text())
    step = res["steps"][0]
    assert step["sent"] == step["ok"] + step["errors"] == 40
    assert step["generated_tokens"] > 0 and step["tokens_per_s"] > 0
    assert res["best_rate"] == 40 and res["passed"] == [True]
    assert res["command"].startswith("seqserve loadtest http://127.0.0.1:")
    with (out / "results.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 40 and {r["outcome"] for r in rows} == {"ok"}
    assert all(float(r["latency_ms"]) >= float(r["service_ms"]) > 0 for r in rows)
    assert all(float(r["server_compute_ms"]) > 0 for r in rows)
    for name in ("latency_vs_rate.png", "throughput_vs_rate.png", "latency_hist.png"):
        _assert_png(out / name)

    md = tmp_path / "perf.md"
    assert _main(["--report-md", str(md), "--from", str(out)]) == 0
    text = md.read_text()
    assert "### stub translate" in text and "| 40/s | 40 | 40 | 0 |" in text
    assert res["command"] in text


def test_cli_sweep_reports_shed_load_and_slo_failure(
    stub_server: Any, texts_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "sweep"
    argv = [stub_server.url, "--model", "shed", "--sweep", "20:40:20", "--duration", "0.5",
            "--texts", str(texts_file), "--out", str(out), "--slo-p99", "100",
            "--quiet"]  # fmt: skip
    assert _main(argv) == 1  # no step met the SLO: every request was shed
    printed = capsys.readouterr().out
    assert "highest rate with p99 <= 100 ms: none" in printed
    res = json.loads((out / "results.json").read_text())
    assert res["best_rate"] is None and res["passed"] == [False]  # stopped after the failure
    step = res["steps"][0]
    assert step["shed"] == step["sent"] > 0 and set(step["errors_by_status"]) == {"429"}
    _assert_png(out / "latency_hist.png")  # plots still drawn without a successful request


def test_cli_user_errors(texts_file: Path) -> None:
    with pytest.raises(UserError, match="--rate"):
        _main(["http://127.0.0.1:1", "--model", "m", "--texts", str(texts_file)])
    with pytest.raises(UserError, match="URL"):
        _main(["--rate", "3"])
    with pytest.raises(UserError, match="START:STOP:STEP"):
        _main(["http://127.0.0.1:1", "--model", "m", "--sweep", "5"])
    with pytest.raises(UserError, match="result files"):
        _main(["--report-md", "-"])


@pytest.mark.skipif(importlib.util.find_spec("locust") is None, reason="locust not installed")
def test_locustfile_drives_the_server(stub_server: Any, texts_file: Path, tmp_path: Path) -> None:
    locust = shutil.which("locust", path=str(Path(sys.executable).parent)) or "locust"
    env = os.environ | {
        "SEQSERVE_LOADTEST_TEXTS": str(texts_file),
        "SEQSERVE_LOADTEST_MODEL": "locust-clf",
        "SEQSERVE_LOADTEST_TRANSLATE_MODEL": "locust-mt",
        "SEQSERVE_LOADTEST_WAIT": "0.05",
    }
    prefix = tmp_path / "locust"
    cmd = [locust, "-f", str(REPO / "deploy/loadtest/locustfile.py"), "--headless",
           "--host", stub_server.url, "-u", "4", "-r", "4", "-t", "2s", "--only-summary",
           "--csv", str(prefix), "--loglevel", "WARNING"]  # fmt: skip
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=50)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert stub_server.calls["locust-clf"] > 0 and stub_server.calls["locust-mt"] > 0
    with Path(f"{prefix}_stats.csv").open() as f:
        stats = {row["Name"]: row for row in csv.DictReader(f)}
    assert int(stats["classify"]["Request Count"]) > 0
    assert int(stats["translate"]["Request Count"]) > 0
    assert int(stats["Aggregated"]["Failure Count"]) == 0
