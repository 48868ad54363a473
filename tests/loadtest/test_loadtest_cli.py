"""`seqserve loadtest` end to end against the stub server: report, files, plots, markdown;
and the Locust file against the same server."""

from __future__ import annotations

import argparse
import csv
import importlib.util
import json
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
    assert "no saturation: highest rate reached 40 req/s offered" in printed.out
    assert "plots against rate skipped: one rate" in printed.out
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
    for name in ("latency_over_time.png", "latency_hist.png"):
        _assert_png(out / name)
    # One rate: no plots against rate (a dot each).
    assert not (out / "latency_vs_rate.png").exists()
    assert not (out / "throughput_vs_rate.png").exists()

    md = tmp_path / "perf.md"
    assert _main(["--report-md", str(md), "--from", str(out)]) == 0
    text = md.read_text()
    assert "### stub translate" in text and "| 40/s | 40 | 40 | 0 |" in text
    assert "no saturation: highest rate reached 40 req/s" in text
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
    assert "saturated at 20 req/s offered" in printed  # every request refused
    assert "highest rate without saturating: none" in printed
    res = json.loads((out / "results.json").read_text())
    assert res["best_rate"] is None and res["passed"] == [False]  # stopped after the failure
    step = res["steps"][0]
    assert step["shed"] == step["sent"] > 0 and set(step["errors_by_status"]) == {"429"}
    _assert_png(out / "latency_hist.png")  # plots still drawn without a successful request
    _assert_png(out / "latency_over_time.png")


def test_cli_user_errors(texts_file: Path) -> None:
    with pytest.raises(UserError, match="--rate"):
        _main(["http://127.0.0.1:1", "--model", "m", "--texts", str(texts_file)])
    with pytest.raises(UserError, match="URL"):
        _main(["--rate", "3"])
    with pytest.raises(UserError, match="START:STOP:STEP"):
        _main(["http://127.0.0.1:1", "--model", "m", "--sweep", "5"])
    with pytest.raises(UserError, match="result files"):
        _main(["--report-md", "-"])


NO_SEQSERVE = "import sys; sys.modules['seqserve'] = None; "
"""Python code that makes `import seqserve` fail (the venv has it installed, editable)."""


@pytest.mark.skipif(importlib.util.find_spec("locust") is None, reason="locust not installed")
def test_locustfile_agrees_with_the_load_tool(tmp_path: Path) -> None:
    """The locustfile's own copy of the protocol facts (bodies, shed statuses, texts files)
    gives what seqserve.loadtest gives, read in an interpreter that cannot import seqserve."""
    from seqserve.loadtest.protocol import SHED_STATUSES, build_payload
    from seqserve.loadtest.texts import TEXT_KEYS, load_text_file

    plain = tmp_path / "plain.txt"
    plain.write_text("  one two \n\nthree\n{not json at line 3\n", encoding="utf-8")
    jsonl = tmp_path / "texts.jsonl"
    jsonl.write_text('{"source": "un"}\n"deux"\n{"id": 3, "text": "trois", "src": "x"}\n',
                     encoding="utf-8")
    cases = [("classify", ["a b", "c"], 1), ("translate", ["x"], 5), ("translate", [], 2)]
    probe = NO_SEQSERVE + (
        "import importlib.util, json; "
        "spec = importlib.util.spec_from_file_location('lf', sys.argv[1]); "
        "lf = importlib.util.module_from_spec(spec); spec.loader.exec_module(lf); "
        "cases = json.loads(sys.argv[2]); "
        "print(json.dumps({'bodies': [lf.request_body(*c) for c in cases], "
        "'shed': sorted(lf.SHED_STATUSES), 'keys': list(lf.TEXT_KEYS), "
        "'texts': [list(lf.load_texts(p)) for p in sys.argv[3:]]}))"
    )
    cmd = [sys.executable, "-I", "-c", probe, str(REPO / "deploy/loadtest/locustfile.py"),
           json.dumps(cases), str(plain), str(jsonl)]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=50, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = json.loads(proc.stdout.splitlines()[-1])
    assert got["bodies"] == [build_payload(*c) for c in cases]
    assert got["shed"] == sorted(SHED_STATUSES) and got["keys"] == list(TEXT_KEYS)
    assert got["texts"] == [load_text_file(plain), load_text_file(jsonl)]
