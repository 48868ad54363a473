"""Shared session fixtures: tiny run directories and a tiny model repository.

- `make_run(task, seed=0, gain=3.0, **model_overrides)`: factory writing a finished run
  directory (config.json, tokenizer.model, model.safetensors, DONE) for a freshly initialised
  tiny model, without training (well under a second). Parameters are scaled by `gain` so that
  the untrained model's outputs depend visibly on its input (at gain 1 a random translator
  repeats one token whatever the source).
- `tiny_classifier_run`, `tiny_translator_run`: real runs of
  `seqserve.models.train.run.run_training` on small built-in data, a few seconds each: LSTM
  language-ID classifier (16 labels, max 80 tokens) and word-level GRU en->fr
  numbers translator (max 72 tokens; it emits eos).
- `tiny_repo`: a model_repository with "tiny-clf" v1 and "tiny-mt" v1 exported from them
  (ONNX + TorchScript, parity checked). Shared: copy it before changing anything in it.
- `http_front`, `kernel`: each HTTP front, each beam search step implementation, in turn.

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
_WORDS = [
    "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven",
    "twelve", "twenty", "thirty", "forty", "fifty", "hundred", "thousand", "and", "un", "deux",
    "trois", "quatre", "cinq", "six", "sept", "huit", "neuf", "dix", "vingt", "trente", "cent",
    "mille", "et",
]


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
    # forget_bias None: the gain would turn a forget bias of 1 into 3, and an LSTM encoder
    # that saturated drifts 1.4e-5 (eager, 64 steps) between batch sizes, over the 1e-5 bound
    return {"vocab_size": vocab_size, "embed_size": 16, "hidden_size": 32, "num_layers": 1,
            "cell": "gru", "bidirectional": True, "attention": "additive", "max_length": 72,
            "dropout": 0.1, "forget_bias": None}


def write_tiny_run(out: Path, task: str, seed: int = 0, gain: float = 3.0,
                   **overrides: Any) -> Path:
    """A finished run directory for a tiny randomly initialised model (see module doc)."""
    import torch

    from seqserve.models.checkpoint import build_model, save_checkpoint
    from seqserve.models.config import TrainConfig
    from seqserve.models.text.tokenizer import train_tokenizer

    out.mkdir(parents=True, exist_ok=True)
    tok = train_tokenizer(tiny_texts(), out / "tokenizer.model", vocab_size=64)
    model_cfg = {**_base_config(task, tok.vocab_size), **overrides}
    torch.manual_seed(seed)
    model = build_model(task, model_cfg)
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(gain)
    save_checkpoint(model, out / "model.safetensors")
    config = {"task": task, "model": model.config.to_dict(), "train": TrainConfig().to_dict(),
              "data": "synthetic (tests/conftest.py)"}
    if task == "classifier":
        config["labels"] = TINY_LABELS
    (out / "config.json").write_text(json.dumps(config, indent=2))
    (out / "DONE").write_text("")
    return out


_WARMING: list[Any] = []


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The client virtualenvs the collected tests use (their module's `VENV_NAME`) that are
    missing start being made now, in the background (`client_venvs.warm`): once per run (the
    first xdist worker), while the other tests run."""
    worker = getattr(config, "workerinput", {}).get("workerid", "gw0")
    names = {getattr(getattr(item, "module", None), "VENV_NAME", None) for item in items}
    names.discard(None)
    if worker == "gw0" and names:
        from client_venvs import warm

        _WARMING.append(warm(sorted(names)))


def pytest_sessionfinish(session: pytest.Session) -> None:
    for process in _WARMING:
        if process is not None:
            process.wait()


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

    def make(task: str, seed: int = 0, gain: float = 3.0, **overrides: Any) -> Path:
        out = tmp_path_factory.mktemp(f"run-{task}-{next(counter)}")
        return write_tiny_run(out, task, seed, gain, **overrides)

    return make


def _train_tiny(out: Path, task: str) -> Path:
    from seqserve.models.train.run import run_training

    common = {"batch_size": 16, "num_threads": 1, "warmup_steps": 10, "lr": 1e-2}
    if task == "classifier":
        run_training("classifier", "langid", out, progress=False, data_size=300,
                     model_overrides={"vocab_size": 500, "embed_size": 16, "hidden_size": 16,
                                      "head_size": 16, "max_length": 80},
                     train_overrides={**common, "epochs": 2, "max_eval_examples": 100})
    else:
        run_training("translator", "numbers-en-fr", out, progress=False, data_size=1500,
                     model_overrides={"vocab_size": 300, "embed_size": 32, "hidden_size": 64,
                                      "cell": "gru", "max_length": 72},
                     train_overrides={**common, "epochs": 3, "batch_size": 32, "lr": 5e-3,
                                      "tokenizer_type": "word", "max_eval_examples": 100})
    return out


@pytest.fixture(scope="session")
def tiny_classifier_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _train_tiny(tmp_path_factory.mktemp("tiny-classifier-run"), "classifier")


@pytest.fixture(scope="session")
def tiny_translator_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _train_tiny(tmp_path_factory.mktemp("tiny-translator-run"), "translator")


@pytest.fixture(scope="session")
def tiny_repo(tmp_path_factory: pytest.TempPathFactory, tiny_classifier_run: Path,
              tiny_translator_run: Path) -> Path:
    """model_repository with tiny-clf/1 and tiny-mt/1 (do not modify: shared by all tests)."""
    from seqserve.export.bundle import export_run

    repo = tmp_path_factory.mktemp("model_repository")
    export_run(tiny_classifier_run, repo, "tiny-clf", version=1, progress=False)
    export_run(tiny_translator_run, repo, "tiny-mt", version=1, progress=False)
    return repo


@pytest.fixture(scope="session")
def tiny_tagger_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tagger_support import train_tiny_tagger

    return train_tiny_tagger(tmp_path_factory.mktemp("tiny-tagger-run"))


@pytest.fixture(scope="session")
def tiny_full_repo(tmp_path_factory: pytest.TempPathFactory, tiny_repo: Path,
                   tiny_tagger_run: Path) -> Path:
    """tiny_repo plus "tiny-tag" v1: one model of every task (do not modify: shared)."""
    import shutil

    from seqserve.export.bundle import export_run

    repo = tmp_path_factory.mktemp("full_repository") / "repo"
    shutil.copytree(tiny_repo, repo)
    export_run(tiny_tagger_run, repo, "tiny-tag", version=1, progress=False)
    return repo


@pytest.fixture(scope="session")
def tiny_series_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """model_repository with "tiny-series" v1 only: a stateful GRU sequence-tagger (3 features,
    1 output, normalisation and output scale; tests/series_support.py). Do not modify."""
    from series_support import pack_tiny_series

    repo = tmp_path_factory.mktemp("series_repository")
    pack_tiny_series(repo)
    return repo


def train_tiny_lm(out: Path, **model: Any) -> Path:
    """A real language-model run on tiny_texts (one document per line), about 2 s: a GRU of
    32 over a 64-piece vocabulary, max 48 tokens."""
    from seqserve.models.train.lm import run_lm_training

    data = out.parent / f"{out.name}-docs.txt"
    data.write_text("\n".join(tiny_texts(240)) + "\n", encoding="utf-8")
    run_lm_training(str(data), out, {"vocab_size": 64, "embed_size": 16, "hidden_size": 32,
                                     "cell": "gru", "max_length": 48, **model},
                    {"epochs": 4, "batch_size": 8, "tbptt": 16, "lr": 1e-2, "num_threads": 1,
                     "warmup_steps": 5}, progress=False)
    return out


@pytest.fixture(scope="session")
def tiny_lm_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return train_tiny_lm(tmp_path_factory.mktemp("tiny-lm") / "run")


@pytest.fixture(scope="session")
def tiny_lm_repo(tmp_path_factory: pytest.TempPathFactory, tiny_lm_run: Path) -> Path:
    """model_repository with "tiny-lm" v1 only (do not modify: shared)."""
    from seqserve.export.bundle import export_run

    repo = tmp_path_factory.mktemp("lm_repository")
    export_run(tiny_lm_run, repo, "tiny-lm", version=1, progress=False,
               grid={"batch_sizes": (1, 3), "lengths": (1, 7)})
    return repo


@pytest.fixture(scope="session")
def tiny_chat_repo(tmp_path_factory: pytest.TempPathFactory, tiny_lm_repo: Path) -> Path:
    """model_repository with "tiny-chat" v1: tiny-lm's bundle with the demo LM's chat
    template (`chat_template.DEFAULT_CHAT_TEMPLATE`, as `seqserve demo` exports it), the
    manifest rewritten (do not modify: shared)."""
    import dataclasses
    import shutil

    from seqserve.export.manifest import read_manifest, write_manifest
    from seqserve.models.text.chat_template import DEFAULT_CHAT_TEMPLATE

    repo = tmp_path_factory.mktemp("chat_repository")
    bundle = repo / "tiny-chat" / "1"
    shutil.copytree(tiny_lm_repo / "tiny-lm" / "1", bundle)
    manifest = read_manifest(bundle)
    write_manifest(bundle, dataclasses.replace(manifest, name="tiny-chat",
                                               chat_template=DEFAULT_CHAT_TEMPLATE))
    return repo


@pytest.fixture(scope="session")
def endless_lm_repo(tmp_path_factory: pytest.TempPathFactory, tiny_lm_run: Path) -> Path:
    """model_repository with "endless-lm" v1: tiny_lm_run's tokenizer and shape, random
    weights, and an output bias that makes eos (and bos, pad, unk) all but impossible, so a
    generation runs to its max_new_tokens (disconnect and continuous-batching tests)."""
    import shutil

    import torch

    from seqserve.export.bundle import export_run
    from seqserve.models.checkpoint import build_model, save_checkpoint

    run = tmp_path_factory.mktemp("endless-lm") / "run"
    run.mkdir()
    config = json.loads((tiny_lm_run / "config.json").read_text())
    shutil.copyfile(tiny_lm_run / "tokenizer.model", run / "tokenizer.model")
    torch.manual_seed(0)
    model = build_model("lm", config["model"])
    with torch.no_grad():
        model.output.bias[:4] = -60.0  # type: ignore[index]
    save_checkpoint(model, run / "model.safetensors")
    (run / "config.json").write_text(json.dumps(config))
    (run / "DONE").write_text("")
    repo = tmp_path_factory.mktemp("endless_repository")
    export_run(run, repo, "endless-lm", version=1, progress=False,
               grid={"batch_sizes": (1, 3), "lengths": (1, 7)})
    return repo


@pytest.fixture(params=["uvicorn", "native"])
def http_front(request: pytest.FixtureRequest) -> str:
    """Each HTTP front in turn (`--front`); the native one only where it is built."""
    if request.param == "native":
        from seqserve.service.server.native import native_front

        if native_front()[0] is None:
            pytest.skip("the native front is not built (native/build.sh)")
    return str(request.param)


@pytest.fixture(params=[False, True], ids=["numpy", "kernel"])
def kernel(request: pytest.FixtureRequest) -> bool:
    """Each implementation of the beam search's step in turn (`Beams(kernel=...)`): numpy,
    and the compiled one only where it is built (native/beam/build.sh). (In this conftest:
    a conftest.py of its own in tests/service/scheduling/ took the name `conftest` from the
    loadtest tests' `from conftest import ...` on a shared test worker.)"""
    if request.param:
        from seqserve.service.scheduling import beam_native

        if not beam_native.AVAILABLE:
            pytest.skip("the beam kernel is not built (native/beam/build.sh)")
    return bool(request.param)
