"""Locust scenarios for seqserve with the same request mixes as `seqserve loadtest`.

Self-contained: it needs `pip install locust` and nothing of seqserve, so it runs from any
machine that can reach the server. Each request carries texts drawn uniformly (with
replacement) from a texts file, so request lengths replay the file's distribution; 429/503
answers count as failures named "shed". The few protocol facts it needs (the request bodies,
the shed statuses, how a texts file is read) are restated here in a few lines; a test checks
that they agree with the load tool's own (`seqserve.loadtest.protocol`, `.texts`), so both
tools send the same requests.

    SEQSERVE_LOADTEST_TEXTS=texts.txt SEQSERVE_LOADTEST_MODEL=langid \\
      locust -f deploy/loadtest/locustfile.py --host http://127.0.0.1:8000 ClassifyUser

Environment (read when a user starts, not at import):
  SEQSERVE_LOADTEST_TEXTS              texts file: one per line, or JSONL with text/source
  SEQSERVE_LOADTEST_MODEL              classifier model name (default langid)
  SEQSERVE_LOADTEST_TRANSLATE_MODEL    translator model name (default numbers-en-fr)
  SEQSERVE_LOADTEST_BEAM_SIZE          translate beam size (default 5)
  SEQSERVE_LOADTEST_TEXTS_PER_REQUEST  texts per request (default 1)
  SEQSERVE_LOADTEST_WAIT               seconds between a user's requests (default 0: closed
                                       loop; use locust's --users for concurrency)

Pick the mix with user classes on the command line (ClassifyUser, TranslateUser) or run both;
their weights come from the class attributes below.
"""

from __future__ import annotations

import json
import os
import random
from functools import lru_cache
from pathlib import Path
from typing import Any

from locust import HttpUser, constant, task

SHED_STATUSES = frozenset({429, 503})
"""Statuses that mean "overloaded, come back later" (load shedding)."""

TEXT_KEYS = ("text", "source", "src", "sentence")
"""JSON fields read, in order, from each JSONL line."""

FALLBACK_TEXTS = (
    "hello world",
    "forty two thousand and seven",
    "the sixteenth of september twenty forty-seven",
    "bonjour tout le monde",
)


def request_body(task_name: str, texts: list[str], beam_size: int) -> dict[str, Any]:
    """The JSON body of a classify or translate request."""
    if task_name == "translate":
        return {"texts": texts, "beam_size": beam_size}
    return {"texts": texts}


def _json_text(line: str) -> str:
    obj = json.loads(line)
    if isinstance(obj, dict):
        obj = next((obj[k] for k in TEXT_KEYS if isinstance(obj.get(k), str)), None)
    if not isinstance(obj, str):
        raise ValueError(f"JSON line without a string field {'/'.join(TEXT_KEYS)}: {line[:80]}")
    return obj


@lru_cache(maxsize=4)
def load_texts(path: str | None) -> tuple[str, ...]:
    """Texts of a file: one per line, or JSONL (a `.jsonl`/`.json` name or a first line
    starting with `{`) with a text/source field; empty lines skipped. A small built-in list
    without a file."""
    if not path:
        return FALLBACK_TEXTS
    lines = [line for line in Path(path).read_text(encoding="utf-8").splitlines() if line.strip()]
    if not lines:
        raise ValueError(f"{path}: no texts (the file is empty)")
    if Path(path).suffix in {".jsonl", ".json"} or lines[0].lstrip().startswith("{"):
        return tuple(_json_text(line) for line in lines)
    return tuple(line.strip() for line in lines)


def _env_int(name: str, default: int) -> int:
    return int(os.environ.get(name, default))


class _SeqserveUser(HttpUser):
    abstract = True
    wait_time = constant(float(os.environ.get("SEQSERVE_LOADTEST_WAIT", "0")))

    def on_start(self) -> None:
        self.texts = load_texts(os.environ.get("SEQSERVE_LOADTEST_TEXTS"))
        self.rng = random.Random(id(self))
        self.per_request = _env_int("SEQSERVE_LOADTEST_TEXTS_PER_REQUEST", 1)

    def draw(self) -> list[str]:
        """Texts of one request, uniformly with replacement."""
        return [self.rng.choice(self.texts) for _ in range(self.per_request)]

    def post(self, path: str, name: str, body: dict[str, Any]) -> None:
        with self.client.post(path, json=body, name=name, catch_response=True) as response:
            if response.status_code in SHED_STATUSES:
                response.failure(f"shed {response.status_code}")
            elif response.status_code >= 400:
                response.failure(f"HTTP {response.status_code}")
            else:
                response.success()


class ClassifyUser(_SeqserveUser):
    """POST /v1/models/{model}/classify {"texts": [...]}."""

    weight = 3

    @task
    def classify(self) -> None:
        model = os.environ.get("SEQSERVE_LOADTEST_MODEL", "langid")
        self.post(f"/v1/models/{model}/classify", "classify",
                  request_body("classify", self.draw(), 1))


class TranslateUser(_SeqserveUser):
    """POST /v1/models/{model}/translate {"texts": [...], "beam_size": K}."""

    weight = 1

    @task
    def translate(self) -> None:
        model = os.environ.get("SEQSERVE_LOADTEST_TRANSLATE_MODEL", "numbers-en-fr")
        beam = _env_int("SEQSERVE_LOADTEST_BEAM_SIZE", 5)
        self.post(f"/v1/models/{model}/translate", "translate",
                  request_body("translate", self.draw(), beam))
