"""The OpenAPI document tells the truth: schemathesis (`st run --checks all`) against a real
server with one model of every task (a feature-sequence model's predict included) and API keys
on, zero failures and zero errors.

One operation is left out: OIP infer of a feature-sequence model, whose body ties `shape` to
the amount of `data` (n x steps x features numbers) and each `lengths` value to the steps,
which JSON Schema cannot say for a variable n and steps (the text models' infer enumerates its
n, 1 to max_texts); the bad-input table and tests/export/test_pack_series.py cover it. Bodies
with a state token or `return_state` are filtered out (st_hooks.py: a signed token is valid by
its MAC, which no schema says; their own tests cover them).

Every check runs: no 5xx, documented status codes, content types, headers and bodies, every
schema-valid request accepted and every schema-violating one refused, 405 with Allow for
undocumented methods, 401 without the key. The seed is fixed so that CI runs the same cases
every time; `SEQSERVE_SCHEMATHESIS_SEED` and `SEQSERVE_SCHEMATHESIS_EXAMPLES` explore more.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
from server_support import serve_app
from service_fakes import settings

from seqserve.service.server.app import create_app

KEY = "schemathesis-test-key"
EXCLUDED = "^v2_infer_tiny_series"
"""The feature-sequence model's OIP infer operations (module doc)."""
MIN_CASES = 1000


def _st() -> str:
    found = shutil.which("st", path=str(Path(sys.executable).parent)) or shutil.which("st")
    assert found, "schemathesis is not installed (pip install -e '.[dev]')"
    return found


@contextlib.contextmanager
def _heap_frozen() -> Iterator[None]:
    """The start-up heap out of the collector's reach, as a served process has it
    (`core.process.freeze_heap`): else a full collection of this test process's heap (tens
    of ms) can land inside a fuzzed request's deadline of a few ms and make it a 504."""
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def test_schemathesis_finds_no_failure(tiny_full_repo: Path, tiny_series_repo: Path,
                                       tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    shutil.copytree(tiny_full_repo, repo)
    shutil.copytree(tiny_series_repo / "tiny-series", repo / "tiny-series")
    # warm-up on, as served: it measures the models' costs, which admission needs to refuse
    # (429) a deadline too short to meet instead of missing it (504)
    app = create_app(settings(repo, max_texts=4, max_chars=200, truncate=True,
                              warmup=True, api_key=KEY))
    seed = os.environ.get("SEQSERVE_SCHEMATHESIS_SEED", "20261130")
    examples = os.environ.get("SEQSERVE_SCHEMATHESIS_EXAMPLES", "12")
    work = tmp_path / "st"
    work.mkdir()
    # the operations that take state tokens: fuzzed with st_hooks.py's filter (the coverage
    # phase, which hooks do not filter, would send them schema-valid tokens that no MAC
    # verifies); /v1/completions, whose fuzzing cannot resolve one of its references, keeps
    # its coverage phase with a 400 allowed for a valid body (a token refused); every other
    # operation runs every phase and check unchanged
    (work / "schemathesis.toml").write_text(
        '[[operations]]\ninclude-path-regex = "/(generate|score|predict|infer)$"\n'
        'phases.coverage.enabled = false\n\n'
        '[[operations]]\ninclude-path-regex = "^/v1/completions$"\n'
        'checks.positive_data_acceptance.expected-statuses = '
        '["2xx", "3xx", "400", "401", "403", "404", "409", "429", "5xx"]\n')
    report = work / "report.json"
    with serve_app(app) as url, _heap_frozen():
        doc = httpx.get(f"{url}/openapi.json", headers={"Authorization": f"Bearer {KEY}"},
                        timeout=30).json()
        ids = [op["operationId"] for item in doc["paths"].values() for op in item.values()]
        excluded = [i for i in ids if re.match(EXCLUDED, i)]
        assert len(excluded) == 2
        assert any(i.startswith("predict") and i.endswith("_tiny-series_v1") for i in ids)
        run = subprocess.run(
            [_st(), "run", f"{url}/openapi.json", "--checks", "all", "--workers", "1",
             "--max-examples", examples, "--seed", seed, "--no-color",
             "--exclude-operation-id-regex", EXCLUDED,
             "--header", f"Authorization: Bearer {KEY}",
             "--report", "json", "--report-json-path", str(report)],
            cwd=work, capture_output=True, text=True, timeout=300,
            env={**os.environ, "SCHEMATHESIS_HOOKS": "st_hooks",
                 "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent),
                                                os.environ.get("PYTHONPATH", "")])})
    assert report.exists(), run.stdout[-3000:] + run.stderr[-3000:]
    result = json.loads(report.read_text())
    summary = run.stdout[-6000:]
    assert result["failures"] == [] and result["errors"] == [], summary
    assert result["exit_code"] == 0 and result["complete"], summary
    tested, total = result["operations"]["tested"], result["operations"]["total"]
    assert tested == total - len(excluded) >= 20, summary
    assert result["test_cases"]["generated"] >= MIN_CASES, summary
    print(f"schemathesis: {result['test_cases']['generated']} cases, "
          f"{result['operations']['tested']} operations, 0 failures")
