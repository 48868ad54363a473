"""Locust scenarios for seqserve with the same request mixes as `seqserve loadtest`.

Each request carries texts drawn uniformly (with replacement) from a texts file, so request
lengths replay the file's distribution; 429/503 answers count as failures named "shed". Texts,
sampling and request bodies come from the load tool's own modules (`seqserve.loadtest.texts`,
`seqserve.loadtest.protocol`), so both tools send the same requests.

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

import os
from functools import lru_cache

from locust import HttpUser, constant, task

from seqserve.loadtest.protocol import SHED_STATUSES, build_payload
from seqserve.loadtest.texts import TextSampler, load_text_file

FALLBACK_TEXTS = (
    "hello world",
    "forty two thousand and seven",
    "the sixteenth of september twenty forty-seven",
    "bonjour tout le monde",
)


@lru_cache(maxsize=4)
def load_texts(path: str | None) -> tuple[str, ...]:
    """Texts from a file (the load tool's reader: one per line or JSONL); a small built-in
    list without a file."""
    return tuple(load_text_file(path)) if path else FALLBACK_TEXTS


def _env_int(name: str, default: int) -> int:
    return int(os.environ.get(name, default))


class _SeqserveUser(HttpUser):
    abstract = True
    wait_time = constant(float(os.environ.get("SEQSERVE_LOADTEST_WAIT", "0")))

    def on_start(self) -> None:
        texts = load_texts(os.environ.get("SEQSERVE_LOADTEST_TEXTS"))
        self.sampler = TextSampler(texts, seed=id(self))
        self.per_request = _env_int("SEQSERVE_LOADTEST_TEXTS_PER_REQUEST", 1)

    def draw(self) -> list[str]:
        return self.sampler.draw(self.per_request)

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
        self.post(f"/v1/models/{model}/classify", "classify",
                  build_payload("classify", self.draw(), 1))


class TranslateUser(_SeqserveUser):
    """POST /v1/models/{model}/translate {"texts": [...], "beam_size": K}."""

    weight = 1

    @task
    def translate(self) -> None:
        model = os.environ.get("SEQSERVE_LOADTEST_TRANSLATE_MODEL", "numbers-en-fr")
        beam = _env_int("SEQSERVE_LOADTEST_BEAM_SIZE", 5)
        self.post(f"/v1/models/{model}/translate", "translate",
                  build_payload("translate", self.draw(), beam))
