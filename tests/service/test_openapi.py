"""The OpenAPI document is valid and tells the truth, for a real server with one model of every
task (a language model and a feature-sequence model's predict included) and API keys on:
openapi-spec-validator finds the live document valid (unique operation ids, every reference
resolved, the health routes in it), and schemathesis (`st run --checks all`) finds zero
failures and zero errors. The schemathesis run is bounded (a few examples per operation, one
worker, so that no request meets a queue: no 429 or 503 from load) and its seed fixed.

One operation is left out: OIP infer of a feature-sequence model, whose body ties `shape` to
the amount of `data` (n x steps x features numbers) and each `lengths` value to the steps,
which JSON Schema cannot say for a variable n and steps (the text models' infer enumerates its
n, 1 to max_texts); the bad-input table and tests/export/test_pack_series.py cover it. Bodies
with a state token or `return_state` are filtered out (st_hooks.py: a signed token is valid by
its MAC, which no schema says; their own tests cover them): the operations that take one run
without the coverage phase, which hooks do not filter (chat completions too: its
`logit_bias` keys are token ids, which the schema cannot bound per model, as completions').
The language model's generic paths (`/v1/models/{name}/generate`, ...) are fuzzed with
the served model's name and version.

Every check runs: no 5xx, documented status codes, content types, headers and bodies, every
schema-valid request accepted and every schema-violating one refused, 405 with Allow for
undocumented methods, 401 without the key. The seed is fixed so that CI runs the same cases
every time; `SEQSERVE_SCHEMATHESIS_SEED` and `SEQSERVE_SCHEMATHESIS_EXAMPLES` explore more.
"""

from __future__ import annotations

import contextlib
import dataclasses
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

from seqserve.export.manifest import read_manifest, write_manifest
from seqserve.models.text.chat_template import DEFAULT_CHAT_TEMPLATE
from seqserve.service.server.app import create_app

KEY = "schemathesis-test-key"
EXCLUDED = "^v2_infer_tiny_series"
"""The feature-sequence model's OIP infer operations (module doc)."""
MIN_CASES = 1000
ST_CONFIG = """[[operations]]
include-path-regex = "/(generate|generate_stream|score)$"
phases.coverage.enabled = false
parameters = { "path.name" = "tiny-lm", "path.version" = "1" }

[[operations]]
include-path-regex = "(/predict|/infer|^/v1/completions|^/v1/chat/completions)$"
phases.coverage.enabled = false
"""
"""The operations that take state tokens run without the coverage phase (module doc); the
language model's generic paths name it."""


def _repo(tmp_path: Path, full: Path, series: Path, lm: Path) -> Path:
    """A repository with one model of every task, the language model with a chat template
    (/v1/chat/completions takes it, the other models are not in its `model` enum)."""
    repo = tmp_path / "repo"
    shutil.copytree(full, repo)
    shutil.copytree(series / "tiny-series", repo / "tiny-series")
    shutil.copytree(lm / "tiny-lm", repo / "tiny-lm")
    bundle = repo / "tiny-lm" / "1"
    write_manifest(bundle, dataclasses.replace(read_manifest(bundle),
                                               chat_template=DEFAULT_CHAT_TEMPLATE))
    return repo


def test_the_live_document_is_valid(tiny_full_repo: Path, tiny_series_repo: Path,
                                    tiny_lm_repo: Path, tmp_path: Path) -> None:
    from openapi_spec_validator import validate

    repo = _repo(tmp_path, tiny_full_repo, tiny_series_repo, tiny_lm_repo)
    app = create_app(settings(repo, max_texts=4, max_chars=200, api_key=KEY))
    with serve_app(app) as url:
        doc = httpx.get(f"{url}/openapi.json", headers={"Authorization": f"Bearer {KEY}"},
                        timeout=30).json()
        public = httpx.get(f"{url}/openapi.json", timeout=30).json()
    validate(doc)
    validate(public)
    ids = [op["operationId"] for item in doc["paths"].values() for op in item.values()]
    assert len(ids) == len(set(ids))
    assert {"v1_classify_tiny_clf", "v1_classify_tiny_clf_v1", "v2_infer_tiny_lm"} <= set(ids)
    refs = set(re.findall(r'"\$ref": "([^"]+)"', json.dumps(doc)))
    assert refs and refs <= {f"#/components/schemas/{k}" for k in doc["components"]["schemas"]}
    assert {"/health/live", "/health/ready", "/v2/health/live", "/health"} <= set(doc["paths"])
    lm = doc["paths"]["/v2/models/tiny-lm/infer"]["post"]["requestBody"]["content"][
        "application/json"]["schema"]
    assert lm["properties"]["inputs"]["items"]["properties"]["name"] == {"const": "text_input"}
    assert "max_tokens" in lm["properties"]["parameters"]["anyOf"][0]["properties"]
    chat = doc["components"]["schemas"]["ChatRequest"]["properties"]
    assert chat["model"]["enum"] == ["tiny-lm"]  # the one with a chat template
    assert "enum" not in public["components"]["schemas"]["ChatRequest"]["properties"]["model"]


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
                                       tiny_lm_repo: Path, tmp_path: Path) -> None:
    repo = _repo(tmp_path, tiny_full_repo, tiny_series_repo, tiny_lm_repo)
    # warm-up on, as served: it measures the models' costs, which admission needs to refuse
    # (429) a deadline too short to meet instead of missing it (504)
    app = create_app(settings(repo, max_texts=4, max_chars=200, truncate=True,
                              warmup=True, api_key=KEY))
    seed = os.environ.get("SEQSERVE_SCHEMATHESIS_SEED", "20261130")
    examples = os.environ.get("SEQSERVE_SCHEMATHESIS_EXAMPLES", "2")
    work = tmp_path / "st"
    work.mkdir()
    (work / "schemathesis.toml").write_text(ST_CONFIG)
    report = work / "report.json"
    with serve_app(app) as url, _heap_frozen():
        doc = httpx.get(f"{url}/openapi.json", headers={"Authorization": f"Bearer {KEY}"},
                        timeout=30).json()
        ids = [op["operationId"] for item in doc["paths"].values() for op in item.values()]
        excluded = [i for i in ids if re.match(EXCLUDED, i)]
        assert len(excluded) == 2
        assert "v1_predict_tiny_series_v1" in ids
        run = subprocess.run(
            [_st(), "run", f"{url}/openapi.json", "--checks", "all", "--workers", "1",
             "--max-examples", examples, "--seed", seed, "--no-color",
             "--exclude-operation-id-regex", EXCLUDED,
             "--header", f"Authorization: Bearer {KEY}",
             "--report", "json", "--report-json-path", str(report)],
            cwd=work, capture_output=True, text=True, timeout=240,
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
