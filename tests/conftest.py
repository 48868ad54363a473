"""Shared session fixtures: tiny run directories and a tiny model repository.

- `make_run(task, **model_overrides)`: factory writing a finished run directory (config.json,
  tokenizer.model, model.safetensors, DONE) for a freshly initialised tiny model (seeded), in
  the format of docs/contracts.md. Models are built directly: no training, so it takes well
  under a second per run.
- `tiny_classifier_run`, `tiny_translator_run`: one run each (LSTM classifier with additive
  attention, 3 labels; GRU translator with additive attention).
- `tiny_repo`: a model_repository with "tiny-clf" v1 and "tiny-mt" v1 exported from them
  (ONNX + TorchScript, parity checked).

torch runs on one thread here (the machine is shared).
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

TINY_LABELS = ["alpha", "beta", "gamma"]
_WORDS = ("one two three four five six seven eight nine ten eleven twelve twenty thirty "
          "forty fifty hundred thousand and un deux trois quatre cinq six sept huit neuf dix "
          "vingt trente cent mille et").split()


def tiny_texts(n: int = 300) -> list[str]:
    """Deterministic short word sequences over a small vocabulary (tokenizer training)."""
    out = []
    cycle = itertools.cycle(_WORDS)
    for i in range(n):
        out.append(" ".join(next(cycle) for _ in range(1 + (i * 7) % 9)))
    return out


def _base_config(task: str, vocab_size: int) -> dict[str, Any]:
    if task == "classifier":
        return {"vocab_size": vocab_size, "num_labels": len(TINY_LABELS), "embed_size": 16,
                "hidden_size": 16, "num_layers": 2, "cell": "lstm", "bidirectional": True,
                "attention": "additive", "head_size": 16, "max_length": 80, "dropout": 0.1}
    return {"vocab_size": vocab_size, "embed_size": 16, "hidden_size": 32, "num_layers": 1,
            "cell": "gru", "bidirectional": True, "attention": "additive", "max_length": 40,
            "dropout": 0.1}


def write_tiny_run(out: Path, task: str, seed: int = 0, **overrides: Any) -> Path:
    """A finished run directory for a tiny randomly initialised model (see module doc)."""
    import torch

    from models.checkpoint import build_model, save_checkpoint
    from models.config import TrainConfig
    from models.tokenizer import train_tokenizer

    out.mkdir(parents=True, exist_ok=True)
    tok = train_tokenizer(tiny_texts(), out / "tokenizer.model", vocab_size=64)
    model_cfg = {**_base_config(task, tok.vocab_size), **overrides}
    torch.manual_seed(seed)
    model = build_model(task, model_cfg)
    save_checkpoint(model, out / "model.safetensors")
    config = {"task": task, "model": model.config.to_dict(), "train": TrainConfig().to_dict(),
              "data": "synthetic (tests/conftest.py)"}
    if task == "classifier":
        config["labels"] = TINY_LABELS
    (out / "config.json").write_text(json.dumps(config, indent=2))
    (out / "DONE").write_text("")
    return out


@pytest.fixture(scope="session", autouse=True)
def _one_torch_thread() -> None:
    try:
        import torch
    except ImportError:  # torch-free test environments
        return
    torch.set_num_threads(1)


@pytest.fixture(scope="session")
def make_run(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Path]:
    """Factory: make_run(task, seed=0, **model_overrides) -> a fresh finished run dir."""
    counter = itertools.count()

    def make(task: str, seed: int = 0, **overrides: Any) -> Path:
        out = tmp_path_factory.mktemp(f"run-{task}-{next(counter)}")
        return write_tiny_run(out, task, seed, **overrides)

    return make


@pytest.fixture(scope="session")
def tiny_classifier_run(make_run: Callable[..., Path]) -> Path:
    return make_run("classifier")


@pytest.fixture(scope="session")
def tiny_translator_run(make_run: Callable[..., Path]) -> Path:
    return make_run("translator")


@pytest.fixture(scope="session")
def tiny_repo(tmp_path_factory: pytest.TempPathFactory, tiny_classifier_run: Path,
              tiny_translator_run: Path) -> Path:
    """model_repository with tiny-clf/1 and tiny-mt/1 (do not modify: shared by all tests)."""
    from export.bundle import export_run

    repo = tmp_path_factory.mktemp("model_repository")
    export_run(tiny_classifier_run, repo, "tiny-clf", version=1, progress=False)
    export_run(tiny_translator_run, repo, "tiny-mt", version=1, progress=False)
    return repo
