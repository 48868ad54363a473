"""Training the demo forecaster on the weekly Mauna Loa CO2 series (models/data/co2.py).

`train_forecaster(out_dir, budget_s=..., seed=...)` trains a `Forecaster` (models/nn/forecaster.py)
and returns a `ForecastResult`: the eval-mode module (best validation checkpoint), the
`normalization` and `output_scale` blocks a bundle manifest takes (the training span's mean
and std), and the test metrics. It writes the run directory: config.json (task "forecast"),
model.safetensors, metrics.json, metrics.csv, curves.png, test_metrics.json, forecast.png
and DONE last.

Training: values are normalised with the training span's mean/std. Each step draws
`batch_size` windows of `window + 1` weeks at random start weeks inside the training span
(the valid and test spans are never read) and trains with teacher forcing: the true value of
week t in, the forecast of week t+1 out; squared error in units of the typical weekly change
(`step_scale`), the first `burn_in` weeks of each window unscored (the state starts at zero
there). The fit loop of models/train/loop.py: AdamW, linear warm-up, then linear decay to 10%
by the larger of the steps done and the time budget used; gradients clipped. After every
`steps_per_epoch` steps the model forecasts the validation span one step ahead (state run
from the series start on true values); the best validation MAE is kept; training stops at
the time budget, `max_epochs` or `patience` epochs without improvement.

Test: the state runs from the series start on true values through the test span (the serving
path, `Forecaster.forward`), so every test forecast has seen the whole history, as a session
that streamed the series would. One-step-ahead MAE and RMSE in ppm over the measured test
weeks, against seasonal-naive (the value 52 weeks earlier) and persistence (the last value).
Then an iterated forecast of the whole test span from its start (the model's own forecasts
fed back), against seasonal-naive from before the span, for forecast.png.
"""

from __future__ import annotations

import json
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn
from tqdm import tqdm

from seqserve.models.checkpoint import CHECKPOINT, CONFIG, load_checkpoint
from seqserve.models.config import FitConfig
from seqserve.models.data.co2 import SEASON, SeriesSplit, load_co2
from seqserve.models.errors import UserError
from seqserve.models.nn.forecaster import Forecaster, ForecasterConfig
from seqserve.models.train.loop import TaskSpec, fit, seed_everything
from seqserve.models.train.plots import epoch_figure, plot_keys, save_epoch_figure

TASK = "forecast"
FORECAST_PNG = "forecast.png"
SERIES = {"co2": load_co2}
"""Built-in series by name."""


@dataclass(frozen=True)
class ForecastTrainConfig(FitConfig):
    """The forecaster's training loop (module doc): the fit loop's settings with the
    forecaster's defaults, windows, epochs of `steps_per_epoch` steps, a budget in seconds."""

    lr: float = 3e-3
    weight_decay: float = 0.0
    warmup_steps: int = 20
    lr_schedule: str = "budget"
    patience: int = 10
    num_threads: int = 1
    window: int = 104  # Weeks per training window (2 years).
    # First weeks of a window whose forecasts are not scored (the state starts at zero).
    burn_in: int = 13
    batch_size: int = 32  # Windows per step.
    steps_per_epoch: int = 40  # Steps between validations.
    max_epochs: int = 100  # Most validations (epochs) to run.
    budget_s: float = 30.0  # Training time budget in seconds (0 = none).

    def __post_init__(self) -> None:
        for name in ("window", "batch_size", "steps_per_epoch", "max_epochs"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)} must be >= 1")
        if not 0 <= self.burn_in < self.window:
            raise ValueError(f"burn_in={self.burn_in} must be in [0, window={self.window})")
        self._check_fit()
        if self.budget_s < 0:
            raise ValueError(f"budget_s={self.budget_s} must be >= 0")

    @property
    def epoch_limit(self) -> int:
        return self.max_epochs

    @property
    def time_budget_s(self) -> float:
        return self.budget_s

    @property
    def budget_text(self) -> str:
        return f"{self.budget_s:g} s"


DEMO_FORECAST: dict[str, Any] = {
    "model": {"cell": "gru", "hidden_size": 32, "num_layers": 1},
    "train": {"window": 104, "budget_s": 30.0},
}
"""The demo forecaster: one GRU layer of 32 on the CO2 level, 2-year windows, 30 s of training
(docs/data.md has the figures of the settings tried)."""


@dataclass
class ForecastResult:
    """What `train_forecaster` returns (module doc)."""

    module: Forecaster
    """Eval-mode model with the best validation weights."""
    normalization: dict[str, list[float]]
    """Per input feature {"mean": [...], "std": [...]}: the server applies (x - mean) / std."""
    output_scale: dict[str, list[float]]
    """Per output {"mean": [...], "std": [...]}: value = output * std + mean."""
    metrics: dict[str, Any]
    """The test metrics (test_metrics.json)."""
    run_dir: Path
    config: dict[str, Any]
    """The run's config.json."""


def train_forecaster(out_dir: str | Path, budget_s: float = 30.0, seed: int = 0,
                     model_overrides: dict[str, Any] | None = None,
                     train_overrides: dict[str, Any] | None = None, series: str = "co2",
                     # Train the forecaster on a built-in series into `out_dir` (module doc).
                     progress: bool = True) -> ForecastResult:
    cfg = ForecastTrainConfig.from_overrides({"budget_s": budget_s, "seed": seed,
                                              **(train_overrides or {})}, "forecaster")
    model_cfg = ForecasterConfig.from_overrides(model_overrides, "forecaster")
    if series not in SERIES:
        raise UserError(f"unknown series {series!r}: use one of {', '.join(SERIES)}")
    if model_cfg.features != 1 or model_cfg.outputs != 1:
        raise UserError("the built-in series has one feature: features=1, outputs=1")
    started = time.monotonic()
    seed_everything(cfg)
    data = SERIES[series]()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "DONE").unlink(missing_ok=True)

    train = data.span("train")
    mean, std = float(train.mean()), float(train.std())
    z = ((data.values - mean) / std).astype(np.float32)  # (N,)
    step_scale = float(np.diff(z[: data.spans["train"][1]]).std())
    model = Forecaster(model_cfg)
    model.step_scale.fill_(step_scale)
    normalization = {"mean": [mean], "std": [std]}
    output_scale = {"mean": [mean], "std": [std]}
    config: dict[str, Any] = {
        "task": TASK, "model": model_cfg.to_dict(), "train": cfg.to_dict(),
        "data": {"series": series, **data.summary()}, "normalization": normalization,
        "output_scale": output_scale, "step_scale": step_scale,
        "state_dim": model_cfg.state_dim,
        "parameters": sum(p.numel() for p in model.parameters())}
    (out / CONFIG).write_text(json.dumps(config, indent=2) + "\n")

    result = fit(model, _forecast_task(model, data, z, std, cfg), cfg, out, progress)
    best = result.best_epoch
    if progress:
        tqdm.write(f"forecast: {len(result.history)} epochs in {result.seconds:.0f}s "
                   f"({result.stop_reason}); best epoch {best}: valid MAE "
                   f"{result.history[best - 1]['valid_mae']:.3f} ppm")
    load_checkpoint(model, out / CHECKPOINT)
    model.eval()
    metrics = evaluate(model, data, z, mean, std)
    multi = metrics.pop("_multi_step_forecast")
    one = metrics.pop("_one_step_forecast")
    metrics.update({
        "best_epoch": best, "epochs_run": len(result.history), "stop_reason": result.stop_reason,
        "valid_mae": result.history[best - 1]["valid_mae"] if best else None,
        "train_seconds": round(result.seconds, 2),
        "total_seconds": round(time.monotonic() - started, 2)})
    (out / "test_metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")
    plot_forecast(data, one, multi, out / FORECAST_PNG)
    (out / "DONE").write_text(time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()) + "\n")
    if progress:
        m, s = metrics["one_step"]["model"], metrics["one_step"]["seasonal_naive"]
        p = metrics["one_step"]["persistence"]
        tqdm.write(f"forecast test (one step): MAE {m['mae']:.3f} ppm, RMSE {m['rmse']:.3f} "
                   f"(seasonal-naive {s['mae']:.3f} / {s['rmse']:.3f}, persistence "
                   f"{p['mae']:.3f} / {p['rmse']:.3f})")
    return ForecastResult(module=model, normalization=normalization, output_scale=output_scale,
                          metrics=metrics, run_dir=out, config=config)


def load_forecast_run(run_dir: str | Path) -> tuple[Forecaster, dict[str, Any]]:
    """A finished run's eval-mode forecaster and its config.json (normalization, output_scale
    and the test metrics' file sit beside it)."""
    run = Path(run_dir)
    path = run / CONFIG
    if not path.is_file():
        raise UserError(f"{path} not found: is {run_dir} a forecaster run directory?")
    config: dict[str, Any] = json.loads(path.read_text())
    if config.get("task") != TASK:
        raise UserError(f"{run_dir} is a {config.get('task')!r} run, not a forecaster")
    model = Forecaster(ForecasterConfig.from_dict(config["model"]))
    load_checkpoint(model, run / CHECKPOINT)
    return model.eval(), config


# -- training ---------------------------------------------------------------------------------

def _windows(z: np.ndarray, stop: int, cfg: ForecastTrainConfig, rng: random.Random) -> Tensor:
    """(B, window + 1, 1) windows drawn inside [0, stop)."""
    length = cfg.window + 1
    if stop < length:
        raise UserError(f"the training span ({stop} steps) is shorter than a window "
                        f"({length}): use a smaller window")
    starts = [rng.randrange(0, stop - length + 1) for _ in range(cfg.batch_size)]
    return torch.from_numpy(np.stack([z[s : s + length] for s in starts])).unsqueeze(-1)


def _forecast_task(model: Forecaster, data: SeriesSplit, z: np.ndarray, std: float,
                   cfg: ForecastTrainConfig) -> TaskSpec:
    """The fit loop's spec (module doc): each step a fresh draw of windows from the training
    span (one python Random seeded by cfg.seed for the whole run), squared error in weekly
    change units after the burn-in; validation MAE ranks (lower is better)."""
    rng = random.Random(cfg.seed)
    train_stop = data.spans["train"][1]

    def step(module: nn.Module, index: int, prob: float) -> tuple[Tensor, int]:
        w = _windows(z, train_stop, cfg, rng)  # (B, W + 1, 1)
        pred, _ = model.teacher_forward(w[:, :-1])
        err = (pred - w[:, 1:]) / model.step_scale  # (B, W, 1) in weekly-change units
        return err[:, cfg.burn_in :].pow(2).mean(), 1

    return TaskSpec("forecast", lambda epoch: range(cfg.steps_per_epoch), step,
                    cfg.steps_per_epoch, lambda _: _valid_scores(model, data, z, std),
                    ("mae",), lower_is_better=True, plot=plot_forecast_curves,
                    report_epochs=False)


@torch.no_grad()
def _valid_scores(model: Forecaster, data: SeriesSplit, z: np.ndarray, std: float
                  ) -> dict[str, float]:
    """One-step forecasts of the validation span, the state run from the series start."""
    model.eval()
    a, b = data.spans["valid"]
    x = torch.from_numpy(z[: b - 1]).view(1, -1, 1)
    pred, _ = model.teacher_forward(x)  # pred[t] forecasts z[t + 1]
    forecast = pred[0, a - 1 :, 0].numpy()  # weeks a .. b-1
    target = z[a:b]
    seen = data.observed[a:b]
    err = (forecast - target)[seen]
    scale = float(model.step_scale[0])
    return {"loss": float(np.mean((err / scale) ** 2)), "mae": float(np.abs(err).mean() * std),
            "rmse": float(np.sqrt(np.mean(err ** 2)) * std)}


# -- test ---------------------------------------------------------------------------------------

def _scores(forecast: np.ndarray, target: np.ndarray, seen: np.ndarray) -> dict[str, float]:
    err = (forecast - target)[seen]
    return {"mae": round(float(np.abs(err).mean()), 4),
            "rmse": round(float(np.sqrt(np.mean(err ** 2))), 4)}


@torch.no_grad()
def one_step_forecasts(model: Forecaster, z: np.ndarray, stop: int) -> np.ndarray:
    """Normalised one-step forecasts of weeks 1 .. stop-1 from true values (the serving path,
    state from the series start): result[t - 1] forecasts z[t]."""
    x = torch.from_numpy(z[: stop - 1]).view(1, -1, 1)
    pred, _ = model(x, torch.tensor([stop - 1]), model.zero_state(1))
    return pred[0, :, 0].numpy()


@torch.no_grad()
def iterated_forecast(model: Forecaster, z: np.ndarray, start: int, steps: int) -> np.ndarray:
    """Normalised forecasts of weeks start .. start+steps-1 from the history before `start`,
    each forecast fed back as the next input."""
    history = torch.from_numpy(z[: start - 1]).view(1, -1, 1)
    _, state = model(history, torch.tensor([start - 1]), model.zero_state(1))
    x = torch.tensor([[[float(z[start - 1])]]])
    one = torch.tensor([1])
    out: list[float] = []
    for _ in range(steps):
        pred, state = model(x, one, state)
        out.append(float(pred[0, 0, 0]))
        x = pred
    return np.asarray(out, dtype=np.float64)


def evaluate(model: Forecaster, data: SeriesSplit, z: np.ndarray, mean: float, std: float
             ) -> dict[str, Any]:
    """Test-span metrics (module doc); the forecasts in ppm under `_one_step_forecast` and
    `_multi_step_forecast`."""
    model.eval()
    a, b = data.spans["test"]
    y, seen = data.values, data.observed[a:b]
    target = y[a:b]
    one = one_step_forecasts(model, z, b)[a - 1 :] * std + mean  # weeks a .. b-1
    multi = iterated_forecast(model, z, a, b - a) * std + mean
    horizon = np.arange(b - a)
    lag = SEASON * (horizon // SEASON + 1)  # seasonal-naive from before the span only
    return {
        "split": "test", "series": data.name, "unit": data.unit,
        "start": data.dates[a], "end": data.dates[b - 1], "steps": b - a,
        "scored": int(seen.sum()),
        "one_step": {"model": _scores(one, target, seen),
                     "seasonal_naive": _scores(y[a - SEASON : b - SEASON], target, seen),
                     "persistence": _scores(y[a - 1 : b - 1], target, seen)},
        "multi_step": {"model": _scores(multi, target, seen),
                       "seasonal_naive": _scores(y[a + horizon - lag], target, seen),
                       "persistence": _scores(np.full(b - a, y[a - 1]), target, seen)},
        "_one_step_forecast": one, "_multi_step_forecast": multi,
    }


# -- files --------------------------------------------------------------------------------------

def plot_forecast_curves(history: list[dict[str, Any]], path: Path) -> None:
    """Training/validation loss and validation MAE/RMSE (ppm) per epoch."""
    plt, fig, axes = epoch_figure(2, 10)
    plot_keys(axes[0], history, ("train_loss", "valid_loss"), marker=".")
    axes[0].set_yscale("log")
    axes[0].set_title("loss (squared error / weekly change^2)")
    plot_keys(axes[1], history, ("valid_mae", "valid_rmse"), marker=".")
    axes[1].set_title("validation one-step error (ppm)")
    save_epoch_figure(plt, fig, axes, path, legend=True)


def plot_forecast(data: SeriesSplit, one: np.ndarray, multi: np.ndarray, path: Path) -> None:
    """Forecast vs actual over the test span: one step ahead, and iterated from its start."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.dates as mdates
    import matplotlib.pyplot as plt

    a, b = data.spans["test"]
    dates = np.array(data.dates, dtype="datetime64[D]")
    y = data.values
    context = a - SEASON
    fig, axes = plt.subplots(1, 2, figsize=(13, 4), sharey=True)
    horizon = np.arange(b - a)
    seasonal = {"one step ahead": y[a - SEASON : b - SEASON],
                "iterated from the span's start": y[a + horizon - SEASON * (horizon // SEASON
                                                                             + 1)]}
    for ax, (title, forecast) in zip(axes, (("one step ahead", one),
                                            ("iterated from the span's start", multi)),
                                     strict=True):
        ax.plot(dates[context:b], y[context:b], color="black", lw=1.2, label="actual")
        ax.plot(dates[a:b], forecast, color="tab:red", lw=1.2, label="forecaster")
        ax.plot(dates[a:b], seasonal[title], color="tab:blue", lw=0.8, ls="--",
                label="seasonal naive")
        ax.axvline(dates[a], color="grey", lw=0.6)
        ax.set_title(f"test span, {title}")
        ax.xaxis.set_major_formatter(mdates.DateFormatter("%Y-%m"))
        ax.legend(fontsize=7)
    axes[0].set_ylabel(f"CO2 ({data.unit})")
    fig.autofmt_xdate()
    fig.tight_layout()
    fig.savefig(str(path), dpi=80)
    plt.close(fig)
