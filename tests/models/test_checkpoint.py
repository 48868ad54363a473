"""Checkpoints: safetensors round trip, and `load_run` rebuilding a run's eager model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from seqserve.models.checkpoint import build_model, load_checkpoint, load_run, save_checkpoint
from seqserve.models.config import ClassifierConfig, TranslatorConfig
from seqserve.models.errors import UserError
from seqserve.models.nn.classifier import Classifier
from seqserve.models.nn.translator import Translator
from seqserve.models.text.tokenizer import train_tokenizer

torch.set_num_threads(1)

TEXTS = ["one two three", "four five six", "seven eight nine ten", "un deux trois quatre"]


def _run_dir(tmp_path: Path, task: str, model: Classifier | Translator) -> Path:
    tok = train_tokenizer(TEXTS, tmp_path / "tokenizer.model", 30, model_type="word")
    save_checkpoint(model, tmp_path / "model.safetensors")
    config = {"task": task, "model": model.config.to_dict(), "train": {}, "labels": ["a", "b"]}
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert tok.vocab_size <= model.config.vocab_size
    return tmp_path


def test_classifier_round_trip_gives_identical_outputs(tmp_path: Path) -> None:
    torch.manual_seed(0)
    cfg = ClassifierConfig(vocab_size=30, num_labels=2, embed_size=8, hidden_size=8,
                           head_size=8)
    model = Classifier(cfg).eval()
    run = _run_dir(tmp_path, "classifier", model)
    loaded, config, tok = load_run(run)
    assert isinstance(loaded, Classifier) and not loaded.training
    assert config["labels"] == ["a", "b"] and tok.pad_id == 0
    ids = torch.tensor([[5, 6, 7], [8, 0, 0]])
    lengths = torch.tensor([3, 1])
    expected, got = model.classify(ids, lengths), loaded.classify(ids, lengths)
    assert torch.equal(expected[0], got[0]) and torch.equal(expected[1], got[1])


def test_translator_round_trip_gives_identical_outputs(tmp_path: Path) -> None:
    torch.manual_seed(1)
    cfg = TranslatorConfig(vocab_size=30, embed_size=8, hidden_size=8, cell="lstm",
                           attention="general", max_length=10)
    model = Translator(cfg).eval()
    run = _run_dir(tmp_path, "translator", model)
    loaded, _, _ = load_run(run)
    assert isinstance(loaded, Translator) and loaded.config == cfg
    ids, lengths = torch.tensor([[5, 6, 7, 9]]), torch.tensor([4])
    for a, b in zip(model.encode(ids, lengths), loaded.encode(ids, lengths), strict=True):
        assert torch.equal(a, b)


def test_checkpoint_is_plain_safetensors_with_every_weight(tmp_path: Path) -> None:
    model = build_model("classifier", {"vocab_size": 30, "num_labels": 3, "hidden_size": 4,
                                       "embed_size": 4, "head_size": 4})
    path = tmp_path / "model.safetensors"
    save_checkpoint(model, path)
    with safe_open(str(path), framework="pt") as f:
        assert set(f.keys()) == set(model.state_dict())
    other = build_model("classifier", model.config.to_dict())
    load_checkpoint(other, path)
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, other.state_dict()[name])
    wrong = build_model("classifier", {**model.config.to_dict(), "hidden_size": 6})
    with pytest.raises(RuntimeError):
        load_checkpoint(wrong, path)


def test_load_run_explains_what_is_missing(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="config.json"):
        load_run(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"task": "classifier", "model": {}}))
    with pytest.raises(UserError, match="model.safetensors"):
        load_run(tmp_path)
    with pytest.raises(UserError, match="unknown task"):
        build_model("parser", {})
