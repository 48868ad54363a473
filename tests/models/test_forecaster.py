"""The CO2 forecaster: chunked equals whole (GRU and LSTM), padding invariance, the state
layout, the CO2 data (gaps, spans), and a tiny training run's files and metrics."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from seqserve.models.data.co2 import interpolate_gaps, load_co2, split_series
from seqserve.models.errors import DataError
from seqserve.models.nn.forecaster import Forecaster, ForecasterConfig
from seqserve.models.train.forecast import (
    ForecastResult,
    evaluate,
    load_forecast_run,
    train_forecaster,
)

CELLS = ["gru", "lstm"]


def _model(cell: str, layers: int = 2, features: int = 1, outputs: int = 1) -> Forecaster:
    torch.manual_seed(0)
    model = Forecaster(ForecasterConfig(cell=cell, hidden_size=8, num_layers=layers,
                                        features=features, outputs=outputs))
    torch.nn.init.normal_(model.head.weight)  # the head starts at zero: make it count
    torch.nn.init.normal_(model.head.bias)
    model.step_scale.fill_(0.5)
    return model.eval()


@pytest.mark.parametrize("cell", CELLS)
def test_chunked_equals_whole(cell: str) -> None:
    model = _model(cell)
    torch.manual_seed(1)
    x = torch.randn(3, 23, 1)
    lengths = torch.tensor([23, 17, 9])  # rows end inside different chunks
    with torch.no_grad():
        whole, state_whole = model(x, lengths, model.zero_state(3))
        state, pieces = model.zero_state(3), []
        for a, b in [(0, 5), (5, 6), (6, 13), (13, 23)]:
            n = (lengths - a).clamp(0, b - a)
            out, new = model(x[:, a:b], n, state)
            # a row whose series ended before this chunk keeps its state
            ended = n == 0
            assert torch.equal(new[ended], state[ended])
            pieces.append(out)
            state = new
    chunked = torch.cat(pieces, 1)
    for row, n in enumerate(lengths.tolist()):
        assert torch.allclose(chunked[row, :n], whole[row, :n], atol=1e-5)
    assert torch.allclose(state, state_whole, atol=1e-5)
    # the training path reads the same weights the same way
    full, full_state = model.teacher_forward(x[:1])
    assert torch.allclose(full, whole[:1], atol=1e-5)
    assert torch.allclose(full_state, state_whole[:1], atol=1e-5)


@pytest.mark.parametrize("cell", CELLS)
def test_padding_changes_neither_state_nor_valid_outputs(cell: str) -> None:
    model = _model(cell, features=3, outputs=2)
    torch.manual_seed(2)
    start = torch.randn(2, model.config.state_dim)
    x = torch.randn(2, 11, 3)
    lengths = torch.tensor([11, 6])
    padded = x.clone()
    padded[1, 6:] = 1e3  # junk where row 1 has ended
    with torch.no_grad():
        out, state = model(padded, lengths, start)
        alone, alone_state = model(x[1:, :6], lengths[1:], start[1:])
        longer, longer_state = model(torch.cat([padded, torch.zeros(2, 4, 3)], 1),
                                     lengths, start)
    assert out.shape == (2, 11, 2) and state.shape == (2, model.config.state_dim)
    assert torch.allclose(out[1, :6], alone[0], atol=1e-5)
    assert torch.allclose(state[1], alone_state[0], atol=1e-5)
    assert torch.all(out[1, 6:] == 0)
    assert torch.allclose(longer[:, :11], out, atol=1e-6)
    assert torch.allclose(longer_state, state, atol=1e-6)
    assert torch.isfinite(out).all()


def test_lstm_state_is_every_h_then_every_c() -> None:
    model = _model("lstm", layers=2)
    h, layers = model.config.hidden_size, model.config.num_layers
    assert model.config.state_dim == 2 * layers * h
    x = torch.randn(2, 7, 1)
    with torch.no_grad():
        _, flat = model(x, torch.tensor([7, 7]), model.zero_state(2))
        _, (hn, cn) = model.rnn(x)  # (L, B, H) each
    assert torch.allclose(flat[:, :h], hn[0], atol=1e-6)
    assert torch.allclose(flat[:, h : 2 * h], hn[1], atol=1e-6)
    assert torch.allclose(flat[:, 2 * h : 3 * h], cn[0], atol=1e-6)
    assert torch.allclose(flat[:, 3 * h :], cn[1], atol=1e-6)
    h2, c2 = model.split_state(flat)
    assert c2 is not None and torch.equal(model.join_state(h2, c2), flat)


def test_fresh_model_forecasts_persistence() -> None:
    model = Forecaster(ForecasterConfig()).eval()
    x = torch.randn(1, 5, 1)
    out, _ = model(x, torch.tensor([5]), model.zero_state(1))
    assert torch.equal(out, x)


def test_config_refuses_bad_values() -> None:
    with pytest.raises(ValueError, match="cell"):
        ForecasterConfig(cell="rnn")
    with pytest.raises(ValueError, match="outputs"):
        ForecasterConfig(features=1, outputs=2)


# -- data -----------------------------------------------------------------------------------

def test_interpolation_is_linear_between_observed_neighbours() -> None:
    raw = np.array([np.nan, 1.0, np.nan, np.nan, 4.0, 5.0, np.nan])
    assert np.allclose(interpolate_gaps(raw), [1, 1, 2, 3, 4, 5, 5])
    with pytest.raises(DataError):
        interpolate_gaps(np.full(3, np.nan))


def test_co2_series_has_no_gaps_and_disjoint_time_ordered_spans() -> None:
    data = load_co2()
    n = len(data.values)
    assert n == 2284 and np.isfinite(data.values).all()
    assert int((~data.observed).sum()) == 59  # the shipped series' missing weeks
    gaps = np.flatnonzero(~data.observed)
    for i in gaps:  # every filled week lies between the observed values around its gap
        lo = data.values[: i][data.observed[: i]][-1]
        hi = data.values[i:][data.observed[i:]][0]
        assert min(lo, hi) - 1e-9 <= data.values[i] <= max(lo, hi) + 1e-9
    spans = [data.spans[k] for k in ("train", "valid", "test")]
    assert spans[0][0] == 0 and spans[-1][1] == n
    for (_, stop), (start, _) in zip(spans, spans[1:], strict=False):
        assert stop == start  # contiguous, no overlap, in time order
    assert data.counts() == {"train": n - 208, "valid": 104, "test": 104}
    assert data.dates[data.spans["test"][0]] == "2000-01-08" and data.dates[-1] == "2001-12-29"
    assert data.observed[data.spans["valid"][0] :].all()  # the scored spans were all measured
    with pytest.raises(DataError):
        split_series("short", ["d"] * 200, np.ones(200))


# -- training -------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory: pytest.TempPathFactory) -> ForecastResult:
    out = tmp_path_factory.mktemp("forecast")
    return train_forecaster(out, budget_s=20, seed=0, model_overrides={"hidden_size": 8},
                            train_overrides={"max_epochs": 2, "steps_per_epoch": 5,
                                             "batch_size": 8, "window": 60},
                            progress=False)


def test_tiny_training_run_writes_metrics_and_pngs(tiny_run: ForecastResult) -> None:
    run = tiny_run.run_dir
    for name in ("config.json", "model.safetensors", "metrics.json", "metrics.csv",
                 "test_metrics.json", "DONE"):
        assert (run / name).is_file(), name
    for name in ("forecast.png", "curves.png"):
        assert (run / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name
    metrics = json.loads((run / "test_metrics.json").read_text())
    assert metrics == tiny_run.metrics
    assert metrics["steps"] == 104 and metrics["epochs_run"] == 2
    for kind in ("one_step", "multi_step"):
        for who in ("model", "seasonal_naive", "persistence"):
            for key in ("mae", "rmse"):
                value = metrics[kind][who][key]
                assert math.isfinite(value) and value > 0, (kind, who, key)
            assert metrics[kind][who]["rmse"] >= metrics[kind][who]["mae"]
    history = json.loads((run / "metrics.json").read_text())["epochs"]
    assert len(history) == 2 and all(math.isfinite(r["valid_mae"]) for r in history)


def test_normalization_is_the_training_span_and_the_run_reloads(tiny_run: ForecastResult
                                                                ) -> None:
    data = load_co2()
    train = data.span("train")
    assert tiny_run.normalization == {"mean": [pytest.approx(train.mean())],
                                      "std": [pytest.approx(train.std())]}
    assert tiny_run.output_scale == tiny_run.normalization
    config = json.loads((tiny_run.run_dir / "config.json").read_text())
    assert config["task"] == "forecast" and config["normalization"] == tiny_run.normalization
    model, loaded = load_forecast_run(tiny_run.run_dir)
    assert loaded["state_dim"] == model.config.state_dim == 8
    assert float(model.step_scale[0]) == pytest.approx(config["step_scale"])
    mean, std = tiny_run.normalization["mean"][0], tiny_run.normalization["std"][0]
    z = ((data.values - mean) / std).astype(np.float32)
    again = evaluate(model, data, z, mean, std)
    assert again["one_step"] == tiny_run.metrics["one_step"]  # the checkpoint is the model


def test_baselines_are_what_they_say() -> None:
    """Seasonal-naive and persistence figures recomputed by hand on the test span."""
    data = load_co2()
    a, b = data.spans["test"]
    y = data.values
    model = Forecaster(ForecasterConfig(hidden_size=4)).eval()  # persistence at init
    mean, std = float(data.span("train").mean()), float(data.span("train").std())
    z = ((y - mean) / std).astype(np.float32)
    metrics = evaluate(model, data, z, mean, std)
    assert metrics["one_step"]["seasonal_naive"]["mae"] == pytest.approx(
        np.abs(y[a:b] - y[a - 52 : b - 52]).mean(), abs=1e-4)
    assert metrics["one_step"]["persistence"]["mae"] == pytest.approx(
        np.abs(y[a:b] - y[a - 1 : b - 1]).mean(), abs=1e-4)
    # an untrained residual model is the persistence forecast
    assert metrics["one_step"]["model"]["mae"] == pytest.approx(
        metrics["one_step"]["persistence"]["mae"], abs=1e-3)


def test_cli_trains_a_forecaster(tmp_path: Path) -> None:
    from seqserve.cli import main

    out = tmp_path / "run"
    assert main(["train", "forecast", "--data", "co2", "--out", str(out), "--hidden", "4",
                 "--epochs", "1", "--max-minutes", "0.2", "--quiet"]) == 0
    assert (out / "DONE").is_file() and (out / "forecast.png").is_file()
    assert json.loads((out / "config.json").read_text())["model"]["hidden_size"] == 4
    assert main(["train", "forecast", "--data", "co2", "--out", str(out), "--cell",
                 "rnn"]) == 2
    assert main(["train", "forecast", "--data", "langid", "--out", str(out)]) == 2
    assert main(["train", "forecast", "--data", "co2", "--out", str(out), "--tbptt",
                 "8"]) == 2
