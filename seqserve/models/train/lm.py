"""Training a language model: corpus -> tokenizer -> contiguous streams -> truncated BPTT.

`run_lm_training(data, out_dir, model_overrides, train_overrides)` writes the run directory of
docs/contracts.md (config.json with task "lm", tokenizer.model, model.safetensors,
metrics.json, metrics.csv, curves.png, test_metrics.json, DONE last) and returns the test
metrics: perplexity per token and bits per character.

Each split's documents become one stream `bos d1 eos bos d2 eos ...` (so the model learns to
start after bos, as prompts are read, and to end a document with eos), cut into
`batch_size` contiguous rows (the remainder, under one token per row, is dropped). Training
walks the rows in chunks of `tbptt` tokens with teacher forcing, carrying each layer's state
detached from chunk to chunk (truncated BPTT: values of full BPTT, gradients cut at chunk
boundaries); gradients are clipped to `clip_norm`. Evaluation runs the same way without
dropout and scores every target but the bos tokens (predicting the start of the next document
after an eos is free and would flatter the figures). Bits per character = total NLL / ln 2 /
characters those targets stand for (each document's characters plus one for its end).
"""

from __future__ import annotations

import csv
import json
import math
import random
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor
from tqdm import tqdm

from seqserve.models.checkpoint import (
    CHECKPOINT,
    CONFIG,
    TOKENIZER,
    load_checkpoint,
    save_checkpoint,
)
from seqserve.models.config import TrainConfig
from seqserve.models.data.pydoc_corpus import TextCorpus, load_text_corpus
from seqserve.models.errors import DataError, UserError
from seqserve.models.nn.lm import LanguageModel, LMConfig, perplexity
from seqserve.models.text.tokenizer import Tokenizer, train_tokenizer
from seqserve.models.train.loop import LRSchedule
from seqserve.models.train.metrics import grad_norms
from seqserve.models.train.plots import epoch_figure, save_epoch_figure

DEFAULT_TBPTT = 64
"""Chunk length when the run does not set --tbptt."""
EVAL_ROWS = 8
EVAL_CHUNK = 256

DEMO_LM: dict[str, Any] = {
    "task": "lm",
    "data": "pydoc-topics",
    "model": {"vocab_size": 1024, "cell": "lstm", "embed_size": 128, "hidden_size": 256,
              "num_layers": 1, "dropout": 0.1, "tie_weights": False, "max_length": 256},
    "train": {"epochs": 3, "batch_size": 32, "lr": 5e-3, "max_minutes": 1.0, "patience": 2,
              "num_threads": 1, "tokenizer_type": "unigram", "tbptt": 48, "warmup_steps": 20,
              "tokenizer_normalization": "nmt_nfkc", "clip_norm": 1.0},
}
"""Demo language model on the Python Language Reference (pydoc-topics): one LSTM layer of
256 over a 1024-piece unigram vocabulary that keeps case (docs/data.md says why pieces, not
characters)."""


def run_lm_training(data: str | list[str] | TextCorpus, out_dir: str | Path,
                    model_overrides: dict[str, Any] | None = None,
                    train_overrides: dict[str, Any] | None = None, progress: bool = True,
                    data_seed: int = 0) -> dict[str, Any]:
    """Train a language model on `data` (built-in corpus name, text files, or a corpus) into
    `out_dir`; returns the test metrics (also in test_metrics.json)."""
    try:
        cfg = TrainConfig.from_dict({**TrainConfig().to_dict(), **(train_overrides or {})})
    except (ValueError, TypeError) as exc:
        raise UserError(f"bad training option: {exc}") from exc
    tbptt = cfg.tbptt or DEFAULT_TBPTT
    cfg = cfg.replace(tbptt=tbptt)
    torch.set_num_threads(cfg.num_threads)
    torch.manual_seed(cfg.seed)
    random.seed(cfg.seed)
    corpus = data if isinstance(data, TextCorpus) else load_text_corpus(data, data_seed)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "DONE").unlink(missing_ok=True)
    started = time.monotonic()
    overrides = dict(model_overrides or {})
    normalization = cfg.tokenizer_normalization or "nmt_nfkc"
    tok = train_tokenizer(corpus.splits["train"], out / TOKENIZER,
                          int(overrides.get("vocab_size", LMConfig.vocab_size)),
                          model_type=cfg.tokenizer_type, seed=cfg.seed,  # type: ignore[arg-type]
                          normalization=normalization)
    fixed = {"vocab_size": tok.vocab_size, "pad_id": tok.pad_id, "bos_id": tok.bos_id,
             "eos_id": tok.eos_id}
    try:
        model_cfg = LMConfig.from_dict({**LMConfig().to_dict(), **overrides, **fixed})
    except (ValueError, TypeError) as exc:
        raise UserError(f"bad model option: {exc}") from exc
    torch.manual_seed(cfg.seed)
    model = LanguageModel(model_cfg)
    model.tbptt = tbptt
    streams = {k: encode_stream(v, tok) for k, v in corpus.splits.items()}
    chars = {k: sum(len(d) + 1 for d in v) for k, v in corpus.splits.items()}
    config = {"task": "lm", "model": model_cfg.to_dict(), "train": cfg.to_dict(), "labels": [],
              "data": {"spec": data if not isinstance(data, TextCorpus) else corpus.name,
                       "name": corpus.name, "seed": data_seed, "counts": corpus.counts(),
                       "tokens": {k: len(v) for k, v in streams.items()}},
              "tokenizer": {"file": TOKENIZER, "vocab_size": tok.vocab_size,
                            "model_type": cfg.tokenizer_type, "normalization": normalization},
              "parameters": sum(p.numel() for p in model.parameters())}
    (out / CONFIG).write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")
    history, best, stop = _fit(model, streams, chars, cfg, out, progress)
    load_checkpoint(model, out / CHECKPOINT)
    test = evaluate(model, streams["test"], chars["test"], tok.bos_id)
    metrics: dict[str, Any] = {
        "split": "test", "perplexity": test["perplexity"], "bits_per_char": test["bpc"],
        "loss": test["loss"], "tokens": test["tokens"], "best_epoch": best,
        "epochs_run": len(history), "stop_reason": stop,
        "valid_perplexity": history[best - 1]["valid_perplexity"] if best else None,
        "train_seconds": history[-1]["seconds"] if history else 0.0,
        "total_seconds": round(time.monotonic() - started, 2)}
    (out / "test_metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")
    (out / "DONE").write_text(time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()) + "\n")
    if progress:
        tqdm.write(f"lm test: perplexity {metrics['perplexity']:.2f} per token, "
                   f"{metrics['bits_per_char']:.3f} bits per character")
    return metrics


def encode_stream(docs: list[str], tok: Tokenizer) -> list[int]:
    """`bos d1 eos bos d2 eos ...` as token ids."""
    out: list[int] = []
    for d in docs:
        out += [tok.bos_id, *tok.encode(d), tok.eos_id]
    return out


def batchify(stream: list[int], rows: int) -> Tensor:
    """The stream as `rows` contiguous rows (B, N); the remainder is dropped."""
    n = len(stream) // rows
    if n < 2:
        raise DataError(f"a split of {len(stream)} tokens is too short for {rows} rows")
    return torch.tensor(stream[: n * rows], dtype=torch.int64).view(rows, n)


def _fit(model: LanguageModel, streams: dict[str, list[int]], chars: dict[str, int],
         cfg: TrainConfig, out: Path, progress: bool) -> tuple[list[dict[str, Any]], int, str]:
    data = batchify(streams["train"], cfg.batch_size)  # (B, N)
    chunks = list(range(0, data.shape[1] - 1, cfg.tbptt))
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    start = time.monotonic()
    budget = cfg.max_minutes * 60 if cfg.max_minutes > 0 else math.inf
    schedule = LRSchedule(cfg, len(chunks) * cfg.epochs, start, budget)
    history: list[dict[str, Any]] = []
    best, best_ppl, stale, stop = 0, math.inf, 0, "max epochs"
    bos = model.config.bos_id
    for epoch in range(1, cfg.epochs + 1):
        model.train()
        state = None
        losses, weights, norm_sum, norm_n = 0.0, 0, 0.0, 0
        layer_norms: dict[str, float] = {}
        out_of_time, lr = False, cfg.lr
        bar = tqdm(chunks, desc=f"lm epoch {epoch}", disable=not progress, leave=False,
                   dynamic_ncols=True)
        for step, at in enumerate(bar):
            x = data[:, at : at + cfg.tbptt]
            y = data[:, at + 1 : at + 1 + cfg.tbptt]
            x = x[:, : y.shape[1]]
            logits, state = model(x, state)
            state = model.detach(state)
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            if step % 20 == 0:
                layer_norms = grad_norms(model)
            if cfg.clip_norm > 0:
                total = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.clip_norm)
                norm_sum, norm_n = norm_sum + float(total), norm_n + 1
            lr = schedule.apply(optimizer)
            optimizer.step()
            losses += float(loss.detach()) * y.numel()
            weights += y.numel()
            if step % 10 == 0:
                bar.set_postfix(loss=f"{losses / weights:.3f}")
            if time.monotonic() - start > budget:
                out_of_time = True
                break
        valid = evaluate(model, streams["valid"], chars["valid"], bos)
        row = {"epoch": epoch, "train_loss": losses / max(weights, 1), "lr": lr,
               "valid_loss": valid["loss"], "valid_perplexity": valid["perplexity"],
               "valid_bpc": valid["bpc"], "batches": step + 1,
               "grad_norm_total": norm_sum / norm_n if norm_n else float("nan"),
               "grad_norm": layer_norms, "seconds": round(time.monotonic() - start, 2)}
        history.append(row)
        if valid["perplexity"] < best_ppl:
            best, best_ppl, stale = epoch, valid["perplexity"], 0
            save_checkpoint(model, out / CHECKPOINT)
        else:
            stale += 1
        _write_history(history, best, stop, out, plot=False)
        if progress:
            tqdm.write(f"lm epoch {epoch}: train_loss={row['train_loss']:.4f} "
                       f"valid_perplexity={valid['perplexity']:.2f} valid_bpc={valid['bpc']:.3f} "
                       f"({row['seconds']:.0f}s)")
        if out_of_time:
            stop = f"time budget of {cfg.max_minutes} min"
            break
        if cfg.patience and stale >= cfg.patience:
            stop = f"early stopping: no improvement for {stale} epochs"
            break
    _write_history(history, best, stop, out, plot=True)
    return history, best, stop


@torch.no_grad()
def evaluate(model: LanguageModel, stream: list[int], chars: int, bos_id: int
             ) -> dict[str, float]:
    """NLL over the stream (bos targets excluded): loss, perplexity, bits per char, tokens."""
    model.eval()
    rows = max(1, min(EVAL_ROWS, len(stream) // 4))
    data = batchify(stream, rows)
    state, nll, count = None, 0.0, 0
    for at in range(0, data.shape[1] - 1, EVAL_CHUNK):
        x = data[:, at : at + EVAL_CHUNK]
        y = data[:, at + 1 : at + 1 + EVAL_CHUNK]
        x = x[:, : y.shape[1]]
        logits, state = model(x, state)
        losses = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1),
                                 reduction="none")
        keep = y.reshape(-1) != bos_id
        nll += float(losses[keep].sum())
        count += int(keep.sum())
    total_targets = sum(1 for t in stream if t != bos_id)
    scored_chars = chars * count / max(total_targets, 1)
    return {"loss": nll / max(count, 1), "perplexity": perplexity(nll, count),
            "bpc": nll / math.log(2) / max(scored_chars, 1.0), "tokens": float(count)}


def _write_history(history: list[dict[str, Any]], best: int, stop: str, out: Path,
                   plot: bool) -> None:
    summary = {"best_epoch": best, "stop_reason": stop,
               "train_seconds": history[-1]["seconds"] if history else 0.0, "epochs": history}
    (out / "metrics.json").write_text(json.dumps(summary, indent=2) + "\n")
    flat = [{k: v for k, v in row.items() if k != "grad_norm"} for row in history]
    columns = list(dict.fromkeys(k for row in flat for k in row))
    with (out / "metrics.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns)
        writer.writeheader()
        writer.writerows(flat)
    if plot and history:
        plot_lm_curves(history, out / "curves.png")


def plot_lm_curves(history: list[dict[str, Any]], path: Path) -> None:
    """Loss, validation perplexity and bits per character per epoch."""
    plt, fig, axes = epoch_figure(3, 13)
    epochs = [r["epoch"] for r in history]
    for key in ("train_loss", "valid_loss"):
        axes[0].plot(epochs, [r[key] for r in history], marker="o", label=key)
    axes[0].set_title("loss (nats per token)")
    axes[0].legend(fontsize=7)
    axes[1].plot(epochs, [r["valid_perplexity"] for r in history], marker="o")
    axes[1].set_title("validation perplexity per token")
    axes[2].plot(epochs, [r["valid_bpc"] for r in history], marker="o")
    axes[2].set_title("validation bits per character")
    save_epoch_figure(plt, fig, axes, path)
