"""The fit loop every trainer runs: AdamW, warm-up + decay, clipping, validation, early
stopping, time budget, the best checkpoint and the metrics files (metrics.json, metrics.csv,
curves.png).

Task specifics come in through a `TaskSpec`: the epoch's batches (`plan`), one batch's loss
(`step`), the validation metrics and those that rank checkpoints, the curves plot.
`example_task` builds it for the tasks over encoded examples (classifier, tagger, translator:
shuffled length-bucketed batches); train/lm.py (truncated BPTT over contiguous streams) and
train/forecast.py (random windows of a series) build their own. Run-level settings come from
a `FitConfig` (models/config.py).
"""

from __future__ import annotations

import csv
import json
import math
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn
from tqdm import tqdm

from seqserve.models.checkpoint import CHECKPOINT, save_checkpoint
from seqserve.models.config import FitConfig, TrainConfig
from seqserve.models.train.batches import EncodedExample, bucketed_batches, collate
from seqserve.models.train.metrics import RunningMean, grad_norms
from seqserve.models.train.plots import plot_curves

History = list[dict[str, Any]]


@dataclass
class TaskSpec:
    """What the loop needs to know about a task."""

    name: str
    """classifier | tagger | translator | lm | forecast (progress bars and lines)."""
    plan: Callable[[int], Sequence[Any]]
    """1-based epoch -> its batches in training order (what `step` takes)."""
    step: Callable[[nn.Module, Any, float], tuple[Tensor, int]]
    """(model, batch, sampling_prob) -> (scalar training loss, the examples or targets it
    averages over: its weight in the epoch's train_loss)."""
    steps_per_epoch: int
    """Batches of a full epoch (the learning-rate schedule plans epoch_limit of them)."""
    evaluate: Callable[[nn.Module], dict[str, float]]
    """Validation metrics of the current model (sets eval mode)."""
    rank_keys: tuple[str, ...]
    """Validation metrics that rank checkpoints, most important first."""
    lower_is_better: bool = False
    """Rank by the smallest values (perplexity, error; no "perfect validation" stop), else by
    the largest (fractions: a perfect 1.0 on the first stops the run)."""
    sampling: Callable[[int], float] | None = None
    """Epoch -> scheduled-sampling probability, recorded as `sampling_prob` (None: 0, not
    recorded)."""
    monitor: Callable[[int], object] | None = None
    """Called with the optimizer step count after every step (gradient flow)."""
    plot: Callable[[History, Path], None] = plot_curves
    """The history rows -> curves.png."""
    report_epochs: bool = True
    """With progress on, print a line per epoch."""


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

    cfg: FitConfig
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


def seed_everything(cfg: FitConfig) -> None:
    """torch's intra-op threads and seed, python's seed (cfg.num_threads, cfg.seed)."""
    torch.set_num_threads(cfg.num_threads)
    torch.manual_seed(cfg.seed)
    random.seed(cfg.seed)


def sampling_prob(cfg: TrainConfig, epoch: int) -> float:
    """Scheduled-sampling probability for a 1-based epoch: linear ramp from 0 to the maximum."""
    if cfg.epochs == 1:
        return cfg.scheduled_sampling
    return cfg.scheduled_sampling * (epoch - 1) / (cfg.epochs - 1)


def example_task(name: str, loss: Callable[[nn.Module, dict[str, Tensor], float], Tensor],
                 evaluate: Callable[[nn.Module], dict[str, float]], rank_keys: tuple[str, ...],
                 train: Sequence[EncodedExample], cfg: TrainConfig,
                 collate_ids: tuple[int, int, int] = (2, 3, 0),
                 collate_fn: Callable[..., dict[str, Tensor]] = collate,
                 monitor: Callable[[int], object] | None = None) -> TaskSpec:
    """The spec of a task over encoded examples: each epoch shuffles length-bucketed batches
    of `cfg.batch_size` (seeded by cfg.seed and the epoch), `collate_fn(examples, bos, eos,
    pad)` makes their tensors and `loss(model, batch, sampling_prob)` their training loss."""
    lengths = [len(e.source) + len(e.target) for e in train]

    def plan(epoch: int) -> list[list[int]]:
        generator = torch.Generator().manual_seed(cfg.seed * 1000 + epoch)
        return bucketed_batches(lengths, cfg.batch_size, cfg.bucket_chunk, generator)

    def step(model: nn.Module, index: list[int], prob: float) -> tuple[Tensor, int]:
        return loss(model, collate_fn([train[i] for i in index], *collate_ids), prob), len(index)

    return TaskSpec(name, plan, step, math.ceil(len(train) / cfg.batch_size), evaluate,
                    rank_keys, sampling=lambda epoch: sampling_prob(cfg, epoch),
                    monitor=monitor)


def fit(model: nn.Module, spec: TaskSpec, cfg: FitConfig, out_dir: Path,
        progress: bool = True) -> FitResult:
    """Train with early stopping; the best epoch's weights are in out_dir/model.safetensors."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    result, start, stale = FitResult(), time.monotonic(), 0
    budget = cfg.time_budget_s if cfg.time_budget_s > 0 else math.inf
    scheduler = LRSchedule(cfg, spec.steps_per_epoch * cfg.epoch_limit, start, budget)
    sign = -1.0 if spec.lower_is_better else 1.0
    for epoch in range(1, cfg.epoch_limit + 1):
        prob = spec.sampling(epoch) if spec.sampling is not None else 0.0
        row, out_of_time = _train_epoch(model, spec, spec.plan(epoch), optimizer, scheduler,
                                        cfg, prob, start + budget, f"{spec.name} epoch {epoch}",
                                        progress)
        if spec.sampling is None:
            del row["sampling_prob"]
        row = {"epoch": epoch, **row, **{f"valid_{k}": v for k, v in spec.evaluate(model).items()}}
        row["seconds"] = round(time.monotonic() - start, 2)
        result.history.append(row)
        rank = tuple(sign * row[f"valid_{k}"] for k in spec.rank_keys)
        if not result.best_rank or rank > result.best_rank:
            result.best_rank, result.best_epoch, stale = rank, epoch, 0
            save_checkpoint(model, out_dir / CHECKPOINT)
        else:
            stale += 1
        result.seconds = time.monotonic() - start
        write_history(result, out_dir, plot=None)
        if progress and spec.report_epochs:
            shown = ", ".join(f"{k}={row[f'valid_{k}']:.4f}" for k in spec.rank_keys)
            tqdm.write(f"{spec.name} epoch {epoch}: train_loss={row['train_loss']:.4f} "
                       f"valid_loss={row['valid_loss']:.4f} {shown} ({row['seconds']:.0f}s)")
        if out_of_time:
            result.stop_reason = f"time budget of {cfg.budget_text}"
            break
        if cfg.patience and stale >= cfg.patience:
            result.stop_reason = f"early stopping: no improvement for {stale} epochs"
            break
        if not spec.lower_is_better and rank and rank[0] >= 1.0:
            result.stop_reason = f"perfect validation {spec.rank_keys[0]}"
            break
    result.seconds = time.monotonic() - start
    write_history(result, out_dir, spec.plot)
    return result


def _train_epoch(model: nn.Module, spec: TaskSpec, batches: Sequence[Any],
                 optimizer: torch.optim.Optimizer, scheduler: LRSchedule, cfg: FitConfig,
                 prob: float, deadline: float, desc: str,
                 progress: bool) -> tuple[dict[str, Any], bool]:
    """One pass over the batches; returns the epoch row and whether the time ran out."""
    model.train()
    losses, norms = RunningMean(), RunningMean()
    out_of_time, lr, step = False, cfg.lr, -1
    bar = tqdm(batches, desc=desc, disable=not progress, leave=False, dynamic_ncols=True)
    for step, batch in enumerate(bar):
        loss, weight = spec.step(model, batch, prob)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if step % 10 == 0:
            norms.add(grad_norms(model))
        if cfg.clip_norm > 0:
            total = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.clip_norm)
            norms.add({"total": float(total)})
        lr = scheduler.apply(optimizer)
        optimizer.step()
        if spec.monitor is not None:
            spec.monitor(scheduler.step)
        losses.add({"loss": float(loss.detach())}, weight)
        if step % 20 == 0:
            bar.set_postfix(loss=f"{losses.means()['loss']:.4f}")
        if time.monotonic() > deadline:
            out_of_time = True
            break
    means = norms.means()
    total_norm = means.pop("total", float("nan"))
    row = {"train_loss": losses.means().get("loss", float("nan")),
           "lr": lr, "sampling_prob": prob, "batches": step + 1,
           "grad_norm_total": total_norm, "grad_norm": means}
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


def write_history(result: FitResult, out_dir: Path,
                  plot: Callable[[History, Path], None] | None = plot_curves) -> None:
    """metrics.json (rows + summary), metrics.csv (flat rows) and (with `plot`) curves.png."""
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
    if plot is not None and result.history:
        plot(result.history, out_dir / "curves.png")
