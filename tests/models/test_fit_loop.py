"""The one fit loop (models/train/loop.py) every trainer runs: ranking either way, early
stopping, the metrics files, and the configs it reads (FitConfig and its two extensions)."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import Tensor, nn

from seqserve.models.config import FitConfig, TrainConfig
from seqserve.models.errors import UserError
from seqserve.models.train.forecast import ForecastTrainConfig
from seqserve.models.train.loop import TaskSpec, fit


def _spec(scores: list[float], lower_is_better: bool, plots: list[int]) -> TaskSpec:
    """A linear regression whose validation `score` per epoch is scripted."""
    torch.manual_seed(0)
    x = torch.randn(32, 3)
    y = x @ torch.tensor([[1.0], [-2.0], [0.5]])
    seen: list[int] = []

    def step(model: nn.Module, index: int, prob: float) -> tuple[Tensor, int]:
        rows = slice(8 * index, 8 * index + 8)
        return nn.functional.mse_loss(model(x[rows]), y[rows]), 8

    def evaluate(model: nn.Module) -> dict[str, float]:
        seen.append(1)
        return {"loss": float(nn.functional.mse_loss(model(x), y)), "score": scores[len(seen) - 1]}

    def plot(history: list[dict[str, Any]], path: Path) -> None:
        plots.append(len(history))

    return TaskSpec("toy", lambda epoch: range(4), step, 4, evaluate, ("score",),
                    lower_is_better=lower_is_better, plot=plot)


@pytest.mark.parametrize(("scores", "lower", "best", "epochs"),
                         [([3.0, 1.0, 2.0, 5.0, 0.5], True, 2, 4),
                          ([0.2, 0.6, 0.5, 0.4, 0.9], False, 2, 4),
                          ([0.2, 1.0, 0.5, 0.4, 0.9], False, 2, 2)])
def test_fit_ranks_either_way_and_stops_early(tmp_path: Path, scores: list[float], lower: bool,
                                              best: int, epochs: int) -> None:
    plots: list[int] = []
    model = nn.Linear(3, 1)
    cfg = TrainConfig(epochs=5, patience=2, warmup_steps=0, lr=0.05)
    result = fit(model, _spec(scores, lower, plots), cfg, tmp_path, progress=False)
    assert result.best_epoch == best and len(result.history) == epochs
    assert result.stop_reason.startswith("perfect" if epochs == 2 else "early stopping")
    assert plots == [epochs]  # curves drawn once, at the end
    summary = json.loads((tmp_path / "metrics.json").read_text())
    assert summary["best_epoch"] == best and summary["epochs"] == result.history
    row = result.history[0]
    assert row["batches"] == 4 and "sampling_prob" not in row and row["valid_score"] == scores[0]
    assert {"embedding", "total"}.isdisjoint(row["grad_norm"]) and "grad_norm_total" in row
    with (tmp_path / "metrics.csv").open() as f:
        assert len(list(csv.DictReader(f))) == epochs
    assert (tmp_path / "model.safetensors").is_file()


def test_fit_configs_share_one_base() -> None:
    assert issubclass(TrainConfig, FitConfig) and issubclass(ForecastTrainConfig, FitConfig)
    train, forecast = TrainConfig(max_minutes=1.5), ForecastTrainConfig(budget_s=20)
    assert (train.epoch_limit, train.time_budget_s, train.budget_text) == (10, 90.0, "1.5 min")
    assert (forecast.epoch_limit, forecast.time_budget_s, forecast.budget_text) == (100, 20, "20 s")
    assert forecast.lr_schedule == "budget" and forecast.lr == 3e-3 and train.lr == 2e-3
    with pytest.raises(UserError, match="bad training option: .*lr"):
        TrainConfig.from_overrides({"lr": 0}, "training")
    with pytest.raises(UserError, match="unknown ForecastTrainConfig"):
        ForecastTrainConfig.from_overrides({"epochs": 3}, "forecaster")
