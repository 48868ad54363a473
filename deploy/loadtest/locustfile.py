"""Locust scenarios for seqserve with the same request mixes as `seqserve loadtest`.

Each request carries texts drawn uniformly (with replacement) from a texts file, so request
lengths replay the file's distribution; 429/503 answers count as failures named "shed".

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

from locust import HttpUser, constant, task

TEXT_KEYS = ("text", "source", "src", "sentence")
FALLBACK_TEXTS = (
    "hello world",
    "forty two thousand and seven",
    "the sixteenth of september twenty forty-seven",
    "bonjour tout le monde",
)
SHED_STATUSES = (429, 503)


def _line_text(line: str) -> str | None:
    if not line.lstrip().startswith("{"):
        return line.strip() or None
    obj = json.loads(line)
    return next((obj[k] for k in TEXT_KEYS if isinstance(obj.get(k), str)), None)


@lru_cache(maxsize=4)
def load_texts(path: str | None) -> tuple[str, ...]:
    """Texts from a file (one per line or JSONL); a small built-in list without a file."""
    if not path:
        return FALLBACK_TEXTS
    lines = Path(path).read_text(encoding="utf-8").splitlines()
    texts = tuple(t for t in (_line_text(line) for line in lines if line.strip()) if t)
    if not texts:
        raise ValueError(f"{path}: no texts")
    return texts


def _env_int(name: str, default: int) -> int:
    return int(os.environ.get(name, default))


class _SeqserveUser(HttpUser):
    abstract = True
    wait_time = constant(float(os.environ.get("SEQSERVE_LOADTEST_WAIT", "0")))

    def on_start(self) -> None:
        self.texts = load_texts(os.environ.get("SEQSERVE_LOADTEST_TEXTS"))
        self.per_request = _env_int("SEQSERVE_LOADTEST_TEXTS_PER_REQUEST", 1)
        self.rng = random.Random()

    def draw(self) -> list[str]:
        return [self.rng.choice(self.texts) for _ in range(self.per_request)]

    def post(self, path: str, name: str, body: dict[str, object]) -> None:
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
        self.post(f"/v1/models/{model}/classify", "classify", {"texts": self.draw()})


class TranslateUser(_SeqserveUser):
    """POST /v1/models/{model}/translate {"texts": [...], "beam_size": K}."""

    weight = 1

    @task
    def translate(self) -> None:
        model = os.environ.get("SEQSERVE_LOADTEST_TRANSLATE_MODEL", "numbers-en-fr")
        beam = _env_int("SEQSERVE_LOADTEST_BEAM_SIZE", 5)
        body = {"texts": self.draw(), "beam_size": beam}
        self.post(f"/v1/models/{model}/translate", "translate", body)
