"""Checkpoints as safetensors (nothing pickled) and rebuilding a finished run's eager model."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from safetensors.torch import load_file, save_file
from torch import nn

from seqserve.models.config import ClassifierConfig, TaggerConfig, TranslatorConfig
from seqserve.models.errors import UserError
from seqserve.models.nn.classifier import Classifier
from seqserve.models.nn.lm import LanguageModel, LMConfig
from seqserve.models.nn.tagger import Tagger
from seqserve.models.nn.translator import Translator

if TYPE_CHECKING:
    from seqserve.models.text.tokenizer import Tokenizer

TASKS = ("classifier", "translator", "tagger", "lm")
CHECKPOINT = "model.safetensors"
CONFIG = "config.json"
TOKENIZER = "tokenizer.model"


Model = Classifier | Translator | Tagger | LanguageModel


def build_model(task: str, model_config: dict[str, Any]) -> Model:
    """A freshly initialised model from a task name and a model config dict."""
    if task == "classifier":
        return Classifier(ClassifierConfig.from_dict(model_config))
    if task == "tagger":
        return Tagger(TaggerConfig.from_dict(model_config))
    if task == "translator":
        return Translator(TranslatorConfig.from_dict(model_config))
    if task == "lm":
        return LanguageModel(LMConfig.from_dict(model_config))
    raise UserError(f"unknown task {task!r}: use one of {', '.join(TASKS)}")


def save_checkpoint(model: nn.Module, path: str | Path) -> None:
    """Write the model's parameters and buffers as safetensors (contiguous CPU copies; tied
    weights, such as a language model's shared embedding and output, as separate copies:
    safetensors refuses shared storage, and loading fills the one parameter twice)."""
    tensors = {k: v.detach().cpu().contiguous().clone() for k, v in model.state_dict().items()}
    save_file(tensors, str(path), metadata={"format": "pt"})


def load_checkpoint(model: nn.Module, path: str | Path) -> None:
    """Load safetensors weights into `model` (strict: every key must match)."""
    model.load_state_dict(load_file(str(path)), strict=True)


def read_run_config(run_dir: str | Path) -> dict[str, Any]:
    """The resolved `config.json` of a run directory."""
    path = Path(run_dir) / CONFIG
    if not path.is_file():
        raise UserError(f"{path} not found: is {run_dir} a training run directory?")
    config: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return config


def load_run(run_dir: str | Path) -> tuple[Model, dict[str, Any], Tokenizer]:
    """Rebuild a run's best eager model (eval mode), its resolved config and its tokenizer."""
    from seqserve.models.text.tokenizer import Tokenizer

    run = Path(run_dir)
    config = read_run_config(run)
    weights = run / CHECKPOINT
    if not weights.is_file():
        raise UserError(f"{weights} not found: the run has no checkpoint yet")
    model = build_model(config["task"], config["model"])
    load_checkpoint(model, weights)
    model.eval()
    tokenizer = Tokenizer.load(str(run / TOKENIZER))
    return model, config, tokenizer
