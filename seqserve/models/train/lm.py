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
boundaries), in the fit loop of models/train/loop.py (AdamW, warm-up and decay, clipping to
`clip_norm`, the checkpoint of the best validation perplexity, early stopping, the time
budget). Evaluation runs the same way without dropout and scores every target but the bos
tokens (predicting the start of the next document after an eos is free and would flatter the
figures). Bits per character = total NLL / ln 2 /
characters those targets stand for (each document's characters plus one for its end).
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from tqdm import tqdm

from seqserve.models.checkpoint import CHECKPOINT, CONFIG, TOKENIZER, load_checkpoint
from seqserve.models.config import TrainConfig
from seqserve.models.data.pydoc_corpus import TextCorpus, load_text_corpus
from seqserve.models.errors import DataError
from seqserve.models.nn.lm import LanguageModel, LMConfig, perplexity
from seqserve.models.nn.rnn import RNNState
from seqserve.models.text.tokenizer import Tokenizer, train_tokenizer
from seqserve.models.train.loop import TaskSpec, fit, seed_everything
from seqserve.models.train.plots import epoch_figure, plot_keys, save_epoch_figure

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
    cfg = TrainConfig.from_overrides(train_overrides, "training")
    tbptt = cfg.tbptt or DEFAULT_TBPTT
    cfg = cfg.replace(tbptt=tbptt)
    seed_everything(cfg)
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
    model_cfg = LMConfig.from_overrides({**overrides, **fixed}, "model")
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
    result = fit(model, _lm_task(model, streams, chars, cfg), cfg, out, progress)
    load_checkpoint(model, out / CHECKPOINT)
    test = evaluate(model, streams["test"], chars["test"], tok.bos_id)
    best = result.best_epoch
    metrics: dict[str, Any] = {
        "split": "test", "perplexity": test["perplexity"], "bits_per_char": test["bpc"],
        "loss": test["loss"], "tokens": test["tokens"], "best_epoch": best,
        "epochs_run": len(result.history), "stop_reason": result.stop_reason,
        "valid_perplexity": result.history[best - 1]["valid_perplexity"] if best else None,
        "train_seconds": round(result.seconds, 2),
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


def _lm_task(model: LanguageModel, streams: dict[str, list[int]], chars: dict[str, int],
             cfg: TrainConfig) -> TaskSpec:
    """The fit loop's spec (module doc): the training stream as `batch_size` rows walked in
    chunks of `tbptt` tokens, in order, each layer's state carried detached from chunk to
    chunk and reset at each epoch's start; validation perplexity ranks (lower is better)."""
    data = batchify(streams["train"], cfg.batch_size)  # (B, N)
    chunks = list(range(0, data.shape[1] - 1, cfg.tbptt))
    carried: list[list[RNNState] | None] = [None]

    def plan(epoch: int) -> list[int]:
        carried[0] = None
        return chunks

    def step(_: nn.Module, at: int, prob: float) -> tuple[Tensor, int]:
        x = data[:, at : at + cfg.tbptt]
        y = data[:, at + 1 : at + 1 + cfg.tbptt]
        logits, state = model(x[:, : y.shape[1]], carried[0])
        carried[0] = model.detach(state)
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1)), y.numel()

    def validate(_: nn.Module) -> dict[str, float]:
        valid = evaluate(model, streams["valid"], chars["valid"], model.config.bos_id)
        return {k: valid[k] for k in ("loss", "perplexity", "bpc")}

    return TaskSpec("lm", plan, step, len(chunks), validate, ("perplexity",),
                    lower_is_better=True, plot=plot_lm_curves)


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


def plot_lm_curves(history: list[dict[str, Any]], path: Path) -> None:
    """Loss, validation perplexity and bits per character per epoch."""
    plt, fig, axes = epoch_figure(3, 13)
    plot_keys(axes[0], history, ("train_loss", "valid_loss"))
    axes[0].set_title("loss (nats per token)")
    axes[0].legend(fontsize=7)
    plot_keys(axes[1], history, ("valid_perplexity",))
    axes[1].set_title("validation perplexity per token")
    plot_keys(axes[2], history, ("valid_bpc",))
    axes[2].set_title("validation bits per character")
    save_epoch_figure(plt, fig, axes, path)
