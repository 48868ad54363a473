"""The epoch loop: AdamW, warm-up + decay, clipping, validation, early stopping, time budget.

Task specifics come in through a small `TaskSpec` (how to compute a batch's loss, how to
evaluate, which metrics rank checkpoints), so one loop trains both model families.
"""

from __future__ import annotations

import csv
import json
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn
from tqdm import tqdm

from seqserve.models.checkpoint import CHECKPOINT, save_checkpoint
from seqserve.models.config import TrainConfig
from seqserve.models.train.batches import EncodedExample, bucketed_batches, collate
from seqserve.models.train.metrics import RunningMean, grad_norms
from seqserve.models.train.plots import plot_curves


@dataclass
class TaskSpec:
    """What the loop needs to know about a task."""

    name: str
    """classifier | translator."""
    loss: Callable[[nn.Module, dict[str, Tensor], float], Tensor]
    """(model, batch, sampling_prob) -> scalar training loss."""
    evaluate: Callable[[nn.Module], dict[str, float]]
    """Validation metrics of the current model (sets eval mode)."""
    rank_keys: tuple[str, ...]
    """Validation metrics that rank checkpoints, most important first (higher is better)."""
    collate_ids: tuple[int, int, int] = (2, 3, 0)
    """bos, eos, pad ids for `collate`."""
    collate_fn: Callable[..., dict[str, Tensor]] = collate
    """(examples, bos, eos, pad) -> batch tensors (the tagger has its own)."""


@dataclass
class FitResult:
    """What the loop produced: per-epoch rows, best epoch, why it stopped."""

    history: list[dict[str, Any]] = field(default_factory=list)
    best_epoch: int = 0
    best_rank: tuple[float, ...] = ()
    stop_reason: str = "max epochs"
    seconds: float = 0.0


@dataclass
class LRSchedule:
    """Linear warm-up, then constant or linear decay to 10% of the peak.

    "linear" decays by the fraction of planned steps done (reproducible). "budget" decays by
    the larger of that and the elapsed fraction of the time budget, so a run cut short by its
    budget still ends at a low rate (but then depends on the machine's speed).
    """

    cfg: TrainConfig
    total_steps: int
    start: float
    budget_s: float
    step: int = 0

    def factor(self) -> float:
        cfg = self.cfg
        if cfg.warmup_steps and self.step < cfg.warmup_steps:
            return (self.step + 1) / cfg.warmup_steps
        if cfg.lr_schedule == "constant":
            return 1.0
        progress = (self.step - cfg.warmup_steps) / max(1, self.total_steps - cfg.warmup_steps)
        if cfg.lr_schedule == "budget" and self.budget_s < math.inf:
            progress = max(progress, (time.monotonic() - self.start) / self.budget_s)
        return max(0.1, 1.0 - 0.9 * min(1.0, progress))

    def apply(self, optimizer: torch.optim.Optimizer) -> float:
        """Set the learning rate for the next step and advance; returns the rate set."""
        lr = self.cfg.lr * self.factor()
        for group in optimizer.param_groups:
            group["lr"] = lr
        self.step += 1
        return lr


def sampling_prob(cfg: TrainConfig, epoch: int) -> float:
    """Scheduled-sampling probability for a 1-based epoch: linear ramp from 0 to the maximum."""
    if cfg.epochs == 1:
        return cfg.scheduled_sampling
    return cfg.scheduled_sampling * (epoch - 1) / (cfg.epochs - 1)


def fit(model: nn.Module, spec: TaskSpec, train: Sequence[EncodedExample], cfg: TrainConfig,
        out_dir: Path, progress: bool = True) -> FitResult:
    """Train with early stopping; the best epoch's weights are in out_dir/model.safetensors."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    steps_per_epoch = math.ceil(len(train) / cfg.batch_size)
    lengths = [len(e.source) + len(e.target) for e in train]
    result, start, stale = FitResult(), time.monotonic(), 0
    budget = cfg.max_minutes * 60 if cfg.max_minutes > 0 else math.inf
    deadline = start + budget
    scheduler = LRSchedule(cfg, steps_per_epoch * cfg.epochs, start, budget)
    monitor = gradient_monitor(model, cfg, out_dir, progress)
    for epoch in range(1, cfg.epochs + 1):
        generator = torch.Generator().manual_seed(cfg.seed * 1000 + epoch)
        batches = bucketed_batches(lengths, cfg.batch_size, cfg.bucket_chunk, generator)
        prob = sampling_prob(cfg, epoch)
        row, out_of_time = _train_epoch(model, spec, train, batches, optimizer, scheduler, cfg,
                                        prob, deadline, f"{spec.name} epoch {epoch}", progress,
                                        monitor)
        row = {"epoch": epoch, **row, **{f"valid_{k}": v for k, v in spec.evaluate(model).items()}}
        row["seconds"] = round(time.monotonic() - start, 2)
        result.history.append(row)
        rank = tuple(row[f"valid_{k}"] for k in spec.rank_keys)
        if not result.best_rank or rank > result.best_rank:
            result.best_rank, result.best_epoch, stale = rank, epoch, 0
            save_checkpoint(model, out_dir / CHECKPOINT)
        else:
            stale += 1
        write_history(result, out_dir, plot=False)
        if progress:
            shown = ", ".join(f"{k}={row[f'valid_{k}']:.4f}" for k in spec.rank_keys)
            tqdm.write(f"{spec.name} epoch {epoch}: train_loss={row['train_loss']:.4f} "
                       f"valid_loss={row['valid_loss']:.4f} {shown} ({row['seconds']:.0f}s)")
        if out_of_time:
            result.stop_reason = f"time budget of {cfg.max_minutes} min"
            break
        if cfg.patience and stale >= cfg.patience:
            result.stop_reason = f"early stopping: no improvement for {stale} epochs"
            break
        if rank and rank[0] >= 1.0:
            result.stop_reason = f"perfect validation {spec.rank_keys[0]}"
            break
    result.seconds = time.monotonic() - start
    write_history(result, out_dir)
    return result


def _train_epoch(model: nn.Module, spec: TaskSpec, train: Sequence[EncodedExample],
                 batches: list[list[int]], optimizer: torch.optim.Optimizer,
                 scheduler: LRSchedule, cfg: TrainConfig, prob: float,
                 deadline: float, desc: str, progress: bool,
                 monitor: Callable[[int], object] | None = None) -> tuple[dict[str, Any], bool]:
    """One pass over the batches; returns the epoch row and whether the time ran out."""
    model.train()
    losses, norms = RunningMean(), RunningMean()
    out_of_time, lr = False, cfg.lr
    bar = tqdm(batches, desc=desc, disable=not progress, leave=False, dynamic_ncols=True)
    for step, index in enumerate(bar):
        batch = spec.collate_fn([train[i] for i in index], *spec.collate_ids)
        loss = spec.loss(model, batch, prob)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if step % 10 == 0:
            norms.add(grad_norms(model))
        if cfg.clip_norm > 0:
            total = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.clip_norm)
            norms.add({"total": float(total)})
        lr = scheduler.apply(optimizer)
        optimizer.step()
        if monitor is not None:
            monitor(scheduler.step)
        losses.add({"loss": float(loss.detach())}, len(index))
        if step % 20 == 0:
            bar.set_postfix(loss=f"{losses.means()['loss']:.4f}")
        if time.monotonic() > deadline:
            out_of_time = True
            break
    means = norms.means()
    total_norm = means.pop("total", float("nan"))
    row = {"train_loss": losses.means().get("loss", float("nan")),
           "lr": lr, "sampling_prob": prob,
           "batches": step + 1 if batches else 0, "grad_norm_total": total_norm,
           "grad_norm": means}
    return row, out_of_time


def gradient_monitor(model: nn.Module, cfg: TrainConfig, out_dir: Path,
                     progress: bool) -> Callable[[int], object] | None:
    """With cfg.gradient_flow_every = N > 0: a `step -> None` hook measuring the gradient flow
    (models/diagnostics/gradient_flow.py) of the first forward RNN layer every N optimizer steps
    into out_dir/gradient_flow.jsonl. None when off, or (with a note) for an LSTM variant layer,
    which the measurement's cell view cannot unroll."""
    if cfg.gradient_flow_every <= 0:
        return None
    from seqserve.models.diagnostics.gradient_flow import gradient_flow_callback

    rnn = getattr(model, "rnn", None) or getattr(model, "encoder", None)
    layer = rnn.forward_layers[0] if rnn is not None else None
    if not isinstance(layer, nn.RNNBase):
        if progress:
            tqdm.write("gradient flow: only native RNN/LSTM/GRU layers are measured; skipped")
        return None
    path = out_dir / "gradient_flow.jsonl"
    path.unlink(missing_ok=True)
    hook = gradient_flow_callback(cfg.gradient_flow_every, out_path=path, batch_size=16)

    def measure(step: int) -> None:
        record = hook(step, layer)
        if record is not None and progress:
            tqdm.write(f"gradient flow at step {step}: decay factor per step "
                       f"{record['decay_factor_per_step']:.4f}")

    return measure


def write_history(result: FitResult, out_dir: Path, plot: bool = True) -> None:
    """metrics.json (rows + summary), metrics.csv (flat rows) and (if plot) curves.png."""
    summary = {"best_epoch": result.best_epoch, "stop_reason": result.stop_reason,
               "train_seconds": round(result.seconds, 2), "epochs": result.history}
    (out_dir / "metrics.json").write_text(json.dumps(summary, indent=2) + "\n")
    flat = [{**{k: v for k, v in row.items() if k != "grad_norm"},
             **{f"grad_norm/{k}": v for k, v in row.get("grad_norm", {}).items()}}
            for row in result.history]
    columns = list(dict.fromkeys(k for row in flat for k in row))
    with (out_dir / "metrics.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns)
        writer.writeheader()
        writer.writerows(flat)
    if plot and result.history:
        plot_curves(result.history, out_dir / "curves.png")
