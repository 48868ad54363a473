"""Tiny tagger runs for export and service tests: a trained one and untrained variants."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

TAGGER_MODEL = {"vocab_size": 300, "embed_size": 24, "hidden_size": 24, "num_layers": 1,
                "max_length": 40}


def train_tiny_tagger(out: Path, **model_overrides: Any) -> Path:
    """A real short training run on numbers-tags (a few seconds on one thread)."""
    from seqserve.models.train.run import run_training

    run_training("tagger", "numbers-tags", out, {**TAGGER_MODEL, **model_overrides},
                 {"epochs": 2, "batch_size": 32, "lr": 1e-2, "warmup_steps": 10,
                  "num_threads": 1, "max_eval_examples": 100},
                 progress=False, data_size=1200)
    return out


def write_untrained_tagger(out: Path, seed: int = 0, gain: float = 2.0,
                           **model_overrides: Any) -> Path:
    """A finished run directory for a freshly initialised tiny tagger (no training)."""
    import torch

    from seqserve.models.checkpoint import build_model, save_checkpoint
    from seqserve.models.config import TrainConfig
    from seqserve.models.data.registry import generate
    from seqserve.models.data.tags import TAGS
    from seqserve.models.text.tokenizer import train_tokenizer

    out.mkdir(parents=True, exist_ok=True)
    tok = train_tokenizer(generate("numbers-tags", size=300).texts(), out / "tokenizer.model",
                          vocab_size=120)
    config = {**TAGGER_MODEL, "vocab_size": tok.vocab_size, "num_labels": len(TAGS),
              "hidden_size": 12, "embed_size": 12, "max_length": 24, **model_overrides}
    torch.manual_seed(seed)
    model = build_model("tagger", config)
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(gain)
    save_checkpoint(model, out / "model.safetensors")
    run_config = {"task": "tagger", "model": model.config.to_dict(),
                  "train": TrainConfig().to_dict(), "labels": list(TAGS),
                  "data": "synthetic (tests/export/tagger_support.py)"}
    (out / "config.json").write_text(json.dumps(run_config, indent=2))
    (out / "DONE").write_text("")
    return out
