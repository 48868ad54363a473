"""Training entry point: data -> tokenizer -> model -> fit -> test, written to a run directory.

`run_training(task, data, out_dir, model_overrides, train_overrides)` produces the run
directory of docs/contracts.md (config.json, tokenizer.model, model.safetensors, metrics.json,
metrics.csv, curves.png, test_metrics.json, DONE last) and returns the test metrics.

`DEMO_CLASSIFIER`, `DEMO_TRANSLATOR` and `DEMO_TAGGER` describe the demo runs: {"task", "data",
"model": model overrides, "train": training overrides}, used as
`run_training(d["task"], d["data"], out_dir, d["model"], d["train"])`.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from seqserve.models.checkpoint import CHECKPOINT, CONFIG, TASKS, TOKENIZER, load_checkpoint
from seqserve.models.config import (
    ClassifierConfig,
    TaggerConfig,
    TrainConfig,
    TranslatorConfig,
    translator_overrides,
)
from seqserve.models.data.dataset import Dataset
from seqserve.models.data.registry import load_dataset
from seqserve.models.diagnostics.forms import SEARCH_NAME, SERVER_BEAM_SIZE, SERVER_LENGTH_PENALTY
from seqserve.models.errors import DataError, UserError
from seqserve.models.nn.classifier import Classifier
from seqserve.models.nn.tagger import Tagger
from seqserve.models.nn.translator import Translator
from seqserve.models.text.tokenizer import Tokenizer, train_tokenizer
from seqserve.models.train.batches import EncodedExample, encode_classification, encode_translation
from seqserve.models.train.evaluate import evaluate_classifier, evaluate_translator
from seqserve.models.train.loop import (
    FitResult,
    TaskSpec,
    example_task,
    fit,
    gradient_monitor,
    seed_everything,
)
from seqserve.models.train.tagger import collate_tagging, encode_tagging, evaluate_tagger

DEMO_CLASSIFIER: dict[str, Any] = {
    "task": "classifier",
    "data": "langid",
    "model": {"vocab_size": 1000},
    "train": {"epochs": 4, "batch_size": 64, "lr": 3e-3, "max_minutes": 2.0, "patience": 2,
              "num_threads": 1, "tokenizer_type": "unigram"},
}
"""Demo language-ID run: the canonical classifier shape (BiLSTM 2x128, additive pooling) with a
small unigram vocabulary (1000 pieces compose unseen number words far better than 4000).
One torch thread: on a shared 2-core machine two threads contend badly."""

DEMO_TRANSLATOR: dict[str, Any] = {
    "task": "translator",
    "data": "numbers-en-fr",
    "model": {"vocab_size": 4000, "cell": "gru", "hidden_size": 256, "embed_size": 128,
              "num_layers": 1, "dropout": 0.1, "decoder": "luong", "attention": "additive"},
    "train": {"epochs": 4, "batch_size": 64, "lr": 3e-3, "max_minutes": 2.0, "patience": 2,
              "num_threads": 1, "tokenizer_type": "word", "max_eval_examples": 1000},
}
"""Demo en->fr numbers run: word-level (about 450 words) GRU translator, Luong decoder with the
additive (concat) score and no input feeding: measured against Bahdanau and input feeding on
this data it was as accurate, the fastest to train and the cheapest decoder step
(docs/decoders.md). The tokenizer takes the dataset's `nmt_nfkc_cf_punct` normalization, so
case, punctuation and spacing never reach the model; it learns the variations in the words
(commas aside: "and" or not, hyphens or spaces, "a hundred"). Three epochs (about 45-90 s on a
shared 2-core CPU) reach every surface form; the 2-minute budget is the ceiling under heavy
contention."""

DEMO_TAGGER: dict[str, Any] = {
    "task": "tagger",
    "data": "numbers-tags",
    "data_size": 6000,
    "model": {"vocab_size": 800, "cell": "lstm", "hidden_size": 64, "embed_size": 48,
              "num_layers": 1, "dropout": 0.1, "max_length": 64},
    "train": {"epochs": 8, "batch_size": 32, "lr": 5e-3, "max_minutes": 0.75, "patience": 3,
              "num_threads": 1, "tokenizer_type": "unigram"},
}
"""Demo number-word tagger: 1-layer BiLSTM 64 on 6000 tagged phrases in every surface form,
well under a minute. Its `data_size` goes to `run_training(..., data_size=...)`."""

_TASK_DATA = {"classifier": "classification", "translator": "translation", "tagger": "tagging"}
Model = Classifier | Translator | Tagger
ModelConfig = ClassifierConfig | TranslatorConfig | TaggerConfig


def run_training(task: str, data: str | Path | Dataset, out_dir: str | Path,
                 model_overrides: dict[str, Any] | None = None,
                 train_overrides: dict[str, Any] | None = None, progress: bool = True,
                 data_size: int | None = None, data_seed: int = 0) -> dict[str, Any]:
    """Train `task` (classifier | translator) on `data` (built-in name, folder, file or a
    Dataset) into `out_dir`; returns the test-split metrics (also in test_metrics.json)."""
    if task not in TASKS:
        raise UserError(f"unknown task {task!r}: use one of {', '.join(TASKS)}")
    if task == "lm":  # its own loop: contiguous streams and truncated BPTT
        from seqserve.models.train.lm import run_lm_training

        if isinstance(data, Dataset):
            raise DataError("a language model trains on a text corpus, not a labelled Dataset")
        return run_lm_training(str(data), out_dir, model_overrides, train_overrides, progress,
                               data_seed)
    cfg = TrainConfig.from_overrides(train_overrides, "training")
    seed_everything(cfg)
    ds = data if isinstance(data, Dataset) else load_dataset(data, size=data_size, seed=data_seed)
    if ds.task != _TASK_DATA[task]:
        raise DataError(f"{ds.name} is a {ds.task} dataset; a {task} needs "
                        f"{_TASK_DATA[task]} data")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "DONE").unlink(missing_ok=True)
    started = time.monotonic()
    tok = _train_tokenizer(ds, out, task, model_overrides or {}, cfg)
    model_cfg = _model_config(task, model_overrides or {}, tok, ds)
    torch.manual_seed(cfg.seed)
    model = _build(model_cfg, cfg)
    splits = _encode_splits(ds, tok, model_cfg, cfg)
    config = {"task": task, "model": model_cfg.to_dict(), "train": cfg.to_dict(),
              "labels": list(ds.labels) if task != "translator" else [],
              "data": {"spec": str(data) if not isinstance(data, Dataset) else ds.name,
                       "name": ds.name, "size": data_size, "seed": data_seed,
                       "counts": ds.counts()},
              "tokenizer": {"file": TOKENIZER, "vocab_size": tok.vocab_size,
                            "model_type": cfg.tokenizer_type,
                            "normalization": tok_normalization(cfg, ds)},
              "parameters": sum(p.numel() for p in model.parameters())}
    (out / CONFIG).write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")
    valid = _limit(splits["valid"], cfg.max_eval_examples)
    spec = _task_spec(model, splits["train"][0], valid, ds, tok, cfg,
                      gradient_monitor(model, cfg, out, progress))
    result = fit(model, spec, cfg, out, progress)
    load_checkpoint(model, out / CHECKPOINT)
    test_metrics = _test(model, splits["test"], ds.splits["test"], tok, cfg, result, started,
                         ds.labels)
    (out / "test_metrics.json").write_text(json.dumps(test_metrics, indent=2) + "\n")
    (out / "DONE").write_text(time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()) + "\n")
    return test_metrics


def _build(model_cfg: ModelConfig, cfg: TrainConfig) -> Model:
    """The fresh model; truncated BPTT (cfg.tbptt) is switched on in its RNN."""
    model: Model
    if isinstance(model_cfg, ClassifierConfig):
        model = Classifier(model_cfg)
    elif isinstance(model_cfg, TaggerConfig):
        model = Tagger(model_cfg)
    else:
        if cfg.tbptt:
            raise UserError("--tbptt applies to classifiers and taggers, not translators")
        return Translator(model_cfg)
    model.rnn.tbptt = cfg.tbptt
    return model


def _train_tokenizer(ds: Dataset, out: Path, task: str, overrides: dict[str, Any],
                     cfg: TrainConfig) -> Tokenizer:
    """The sentencepiece model on the training split (joint source+target for translators)."""
    default = {"classifier": ClassifierConfig.vocab_size, "tagger": TaggerConfig.vocab_size,
               "translator": TranslatorConfig.vocab_size}[task]
    size = int(overrides.get("vocab_size", default))
    return train_tokenizer(ds.texts("train"), out / TOKENIZER, size,
                           model_type=cfg.tokenizer_type, seed=cfg.seed,  # type: ignore[arg-type]
                           normalization=tok_normalization(cfg, ds))


def tok_normalization(cfg: TrainConfig, ds: Dataset) -> str:
    """The tokenizer normalization of a run: the option, else the dataset's, else nmt_nfkc_cf."""
    return cfg.tokenizer_normalization or ds.normalization or "nmt_nfkc_cf"


def _model_config(task: str, overrides: dict[str, Any], tok: Tokenizer,
                  ds: Dataset) -> ModelConfig:
    """Defaults + overrides, with vocab (and labels) taken from the tokenizer and data."""
    fixed: dict[str, Any] = {"vocab_size": tok.vocab_size, "pad_id": tok.pad_id}
    if task == "translator":
        fixed.update(bos_id=tok.bos_id, eos_id=tok.eos_id)
        return TranslatorConfig.from_overrides({**translator_overrides(overrides), **fixed},
                                               "model")
    fixed["num_labels"] = len(ds.labels)
    family = ClassifierConfig if task == "classifier" else TaggerConfig
    return family.from_overrides({**overrides, **fixed}, "model")


Split = tuple[list[EncodedExample], list[str]]
LossFn = Callable[[nn.Module, dict[str, Tensor], float], Tensor]


def _encode_splits(ds: Dataset, tok: Tokenizer, model_cfg: ModelConfig,
                   cfg: TrainConfig) -> dict[str, Split]:
    """Tokenized splits with their raw references (translation targets; empty otherwise)."""
    out: dict[str, Split] = {}
    for name in ("train", "valid", "test"):
        rows = ds.splits.get(name, [])
        if name == "train" and cfg.max_train_examples:
            rows = rows[: cfg.max_train_examples]
        if not rows:
            raise DataError(f"{ds.name}: the {name} split is empty")
        if isinstance(model_cfg, TaggerConfig):
            out[name] = (encode_tagging(rows, tok, ds.labels, model_cfg.max_length), [])
        elif isinstance(model_cfg, ClassifierConfig):
            out[name] = (encode_classification(rows, tok, ds.labels, model_cfg.max_length), [])
        else:
            out[name] = (encode_translation(rows, tok, model_cfg.max_length),
                         [r["target"] for r in rows])
    return out


def _limit(split: Split, n: int) -> Split:
    return (split[0][:n], split[1][:n]) if n else split


def _task_spec(model: Model, train: list[EncodedExample], valid: Split, ds: Dataset,
               tok: Tokenizer, cfg: TrainConfig,
               monitor: Callable[[int], object] | None) -> TaskSpec:
    if isinstance(model, Tagger):
        tagger = model
        return example_task("tagger", _tagger_loss(cfg.label_smoothing),
                            lambda m: evaluate_tagger(tagger, valid[0], cfg.eval_batch_size,
                                                      ds.labels),
                            ("token_accuracy", "macro_f1"), train, cfg,
                            (0, 0, model.config.pad_id), collate_tagging, monitor)
    if isinstance(model, Classifier):
        return example_task("classifier", _classifier_loss(cfg.label_smoothing),
                            lambda m: evaluate_classifier(model, valid[0], cfg.eval_batch_size),
                            ("accuracy", "macro_f1"), train, cfg, monitor=monitor)
    mc = model.config
    return example_task("translator", _translator_loss(cfg.label_smoothing),
                        lambda m: evaluate_translator(model, valid[0], valid[1], tok,
                                                      cfg.eval_batch_size),
                        ("exact_match", "chrf"), train, cfg, (mc.bos_id, mc.eos_id, mc.pad_id),
                        monitor=monitor)


def _classifier_loss(smoothing: float) -> LossFn:
    def loss(model: nn.Module, batch: dict[str, Tensor], prob: float) -> Tensor:
        logits, _ = model(batch["ids"], batch["lengths"])
        return F.cross_entropy(logits, batch["labels"], label_smoothing=smoothing)

    return loss


def _tagger_loss(smoothing: float) -> LossFn:
    def loss(model: nn.Module, batch: dict[str, Tensor], prob: float) -> Tensor:
        logits, _ = model(batch["ids"], batch["lengths"])  # (B, T, C)
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch["tags"].reshape(-1),
                               ignore_index=-100, label_smoothing=smoothing)

    return loss


def _translator_loss(smoothing: float) -> LossFn:
    def loss(model: nn.Module, batch: dict[str, Tensor], prob: float) -> Tensor:
        _, value = model(batch["ids"], batch["lengths"], batch["tgt_in"], batch["tgt_out"],
                         sampling_prob=prob, label_smoothing=smoothing)
        assert value is not None
        return value

    return loss


def _test(model: Model, test: Split, test_rows: list[dict[str, Any]], tok: Tokenizer,
          cfg: TrainConfig, result: FitResult, started: float,
          labels: list[str]) -> dict[str, Any]:
    """Best checkpoint on the full test split (per surface form where rows name one;
    translators decode with the server's default search), plus run facts."""
    forms = [row.get("form", "") for row in test_rows]
    if not any(forms):
        forms = []
    if isinstance(model, Tagger):
        metrics: dict[str, Any] = evaluate_tagger(model, test[0], cfg.eval_batch_size, labels,
                                                  forms=forms or None)
    elif isinstance(model, Classifier):
        metrics = evaluate_classifier(model, test[0], cfg.eval_batch_size)
    else:
        metrics = evaluate_translator(model, test[0], test[1], tok, cfg.eval_batch_size,
                                      SERVER_BEAM_SIZE, SERVER_LENGTH_PENALTY, forms or None)
        metrics["search"] = SEARCH_NAME
    metrics.update(split="test", examples=len(test[0]), best_epoch=result.best_epoch,
                   epochs_run=len(result.history), stop_reason=result.stop_reason,
                   train_seconds=round(result.seconds, 2),
                   total_seconds=round(time.monotonic() - started, 2))
    return metrics
