"""The KServe SDK's own v2 REST client (kserve 0.21) against a real server: readiness,
infer with JSON and with binary tensors, as its users call it. Every infer of the SDK
answered 400 before ("model_name: Extra inputs are not permitted": the SDK puts the model's
name in the body). The SDK runs in its own environment (`.client-venvs/kserve`, made once
from the registry: about 30 s), as a subprocess."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
from client_venvs import client_python
from service_fakes import serve_in_thread

from seqserve.service.server.app import create_app
from seqserve.service.web.settings import Settings

VENV_NAME = "kserve"
MODEL = "tiny-clf"


@pytest.fixture(scope="module")
def kserve_python() -> Path:
    return client_python(VENV_NAME)


@pytest.fixture(scope="module")
def url(tiny_repo: Path) -> Iterator[str]:
    with serve_in_thread(create_app(Settings(repo=tiny_repo, warmup=False))) as base:
        yield base


def test_the_kserve_sdk_infers(kserve_python: Path, url: str, tiny_repo: Path) -> None:
    script = Path(__file__).with_name("kserve_client.py")
    done = subprocess.run([str(kserve_python), str(script), url, MODEL], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["live"] and got["ready"] and got["model_ready"]
    ours = httpx.post(f"{url}/v1/models/{MODEL}/classify",
                      json={"texts": ["one two three", "cent"], "top_k": 100}).json()
    labels = json.loads((tiny_repo / MODEL / "1" / "manifest.json").read_text())["labels"]
    for kind in ("json", "binary"):
        assert got[kind]["label"] == [r["label"] for r in ours["results"]], kind
        probs = np.asarray(got[kind]["probabilities"], dtype=np.float32).reshape(2, -1)
        for row, result in zip(probs, ours["results"], strict=True):
            by_label = {t["label"]: t["probability"] for t in result["top_k"]}
            assert np.allclose(row, [by_label[x] for x in labels], atol=1e-6)
    assert "400" in got["mismatch"] and "does not match" in got["mismatch"]
    assert sys.executable != str(kserve_python)
