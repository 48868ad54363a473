"""`seqserve demo`'s forecaster path: a (tiny) CO2 forecaster trained by the demo's own step,
exported into the model repository as the stateful `co2-forecast` sequence-tagger with its
test metrics in the manifest, reused on a second run, served beside a text model, and the
predict example the demo prints answered with finite forecasts that equal the eager model's;
the one budget's rule (each training's deadline and budget) and a job run in a worker process.
The other demo models' paths are the training and export tests' (their demo budgets take
minutes)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import httpx
import numpy as np
import pytest
import torch

from seqserve.cli import demo
from seqserve.export.bundle import export_run
from seqserve.export.versions import list_bundles
from seqserve.models.errors import UserError

TINY = {"model": {"hidden_size": 8},
        "train": {"budget_s": 20.0, "max_epochs": 2, "steps_per_epoch": 5, "batch_size": 8,
                  "window": 60}}


@pytest.fixture(scope="module")
def demo_repo(tmp_path_factory: pytest.TempPathFactory, tiny_repo: Path) -> dict[str, Path]:
    """The demo's forecaster steps into a copy of the session's tiny text repository."""
    from service_fakes import copy_repo

    work = tmp_path_factory.mktemp("demo")
    repo = copy_repo(tiny_repo, work / "model_repository")
    run_dir = demo._train_forecast(work, retrain=False, model_overrides=TINY["model"],
                                   train_overrides=TINY["train"], progress=False)
    bundle = demo._export(run_dir, repo, demo.FORECASTER[1])
    return {"work": work, "repo": repo, "run": run_dir, "bundle": bundle}


def test_forecaster_bundle_holds_the_runs_test_metrics(demo_repo: dict[str, Path]) -> None:
    run, bundle = demo_repo["run"], demo_repo["bundle"]
    assert bundle == demo_repo["repo"] / "co2-forecast" / "1"
    assert (run / "forecast.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    m = json.loads((bundle / "manifest.json").read_text())
    config = json.loads((run / "config.json").read_text())
    assert m["task"] == "sequence-tagger" and m["features"] == 1 and m["outputs"] == 1
    assert m["state_dim"] == config["state_dim"] == 8
    assert m["normalization"] == config["normalization"]
    assert m["output_scale"] == config["output_scale"]
    assert m["parity"]["passed"] and m["limits"]["max_steps"] == 256
    source = m["source_run"]
    assert source["path"] == str(run.resolve()) and source["config"]["task"] == "forecast"
    metrics = json.loads((run / "test_metrics.json").read_text())
    assert source["test_metrics"] == metrics
    for who in ("model", "seasonal_naive", "persistence"):
        score = source["test_metrics"]["one_step"][who]
        assert math.isfinite(score["mae"]) and 0 < score["mae"] <= score["rmse"], who
    line = demo._format_metrics(metrics)
    assert "one-step MAE / RMSE (ppm): model" in line and "seasonal-naive" in line
    assert f"{metrics['one_step']['model']['mae']:.3f}" in line


def test_second_demo_run_reuses_the_run_and_the_verified_bundle(demo_repo: dict[str, Path],
                                                                capsys: pytest.CaptureFixture[str]
                                                                ) -> None:
    before = (demo_repo["run"] / "DONE").read_text()
    run_dir = demo._train_forecast(demo_repo["work"], retrain=False)
    assert run_dir == demo_repo["run"] and (run_dir / "DONE").read_text() == before
    assert demo._export(run_dir, demo_repo["repo"], "co2-forecast") == demo_repo["bundle"]
    assert "already holds run" in capsys.readouterr().out
    versions = [v for name, v, _ in list_bundles(demo_repo["repo"]) if name == "co2-forecast"]
    assert versions == [1]
    with pytest.raises(UserError, match="onnx"):  # the forecaster is served from its ONNX graph
        export_run(run_dir, demo_repo["repo"], "co2-forecast", formats=["torchscript"])


def test_served_beside_the_text_models_the_printed_example_forecasts(
        demo_repo: dict[str, Path]) -> None:
    from service_fakes import serve_in_thread, settings

    from seqserve.models.train.forecast import load_forecast_run
    from seqserve.service.server.app import create_app

    model, config = load_forecast_run(demo_repo["run"])
    with serve_in_thread(create_app(settings(demo_repo["repo"], max_wait_ms=5))) as url:
        listed = httpx.get(f"{url}/v1/models", timeout=30).json()
        names = {m["name"] for m in listed["models"]}
        assert {"co2-forecast", "tiny-mt"} <= names, names
        r = httpx.post(f"{url}/v1/models/co2-forecast/predict", json=demo.FORECAST_EXAMPLE,
                       timeout=30)
    assert r.status_code == 200, r.text
    result = r.json()["results"][0]
    series = np.asarray(demo.FORECAST_EXAMPLE["series"][0], dtype=np.float64)  # (T, 1)
    got = np.asarray(result["outputs"], dtype=np.float64)
    assert result["steps"] == len(series) and got.shape == series.shape
    assert np.isfinite(got).all()
    mean, std = config["normalization"]["mean"][0], config["normalization"]["std"][0]
    x = torch.from_numpy(((series - mean) / std).astype(np.float32))[None]
    with torch.no_grad():
        out, _ = model(x, torch.tensor([len(series)]), model.zero_state(1))
    want = out[0].double().numpy() * std + mean
    assert np.abs(got - want).max() <= 1e-4 * max(1.0, float(np.abs(want).max()))
    # a forecast of next week's CO2 from a week's level: within a few ppm of it
    assert np.abs(got - series).max() < 10.0


def test_each_training_gets_what_is_left_of_the_one_budget() -> None:
    jobs = demo.JOBS
    assert [j.model for j in jobs][-1] == demo.FORECASTER[1]  # the slack-taker starts last
    start = 1000.0
    end = start + demo.DEMO_TOTAL_S - demo.EXPORT_RESERVE_S - demo.SERVE_RESERVE_S
    first, rest = jobs[0], list(jobs[1:])
    later = sum(j.floor_s + j.tail_s for j in rest)
    assert demo.job_deadline(end, first, rest, 1) == end - first.tail_s - later
    assert demo.job_deadline(end, first, rest, 2) == end - first.tail_s - later / 2
    last = jobs[-1]
    assert demo.job_deadline(end, last, [], 2) == end - last.tail_s
    # at the start there is time for a job's own budget; late, it gets what is left; past
    # its deadline, its floor
    assert demo.train_budget(120.0, 60.0, demo.job_deadline(end, first, rest, 2) - start) == 120.0
    assert demo.train_budget(30.0, 15.0, 21.04) == 21.0
    assert demo.train_budget(30.0, 15.0, -50.0) == 15.0
    # the floors and tails of all five fit the budget's training time on 2 lanes
    assert sum(j.floor_s + j.tail_s for j in jobs) / 2 < end - start


def test_jobs_in_worker_processes_reuse_a_finished_run(demo_repo: dict[str, Path],
                                                       capfd: pytest.CaptureFixture[str]
                                                       ) -> None:
    job = demo.JOBS[-1]
    results = demo._run_jobs((job,), demo_repo["work"], retrain=False, lanes=2,
                             train_deadline=0.0)
    result = results[job.model]
    assert result.run_dir == demo_repo["run"] and result.budget_s is None
    assert "is finished; reusing it" in capfd.readouterr().out
    assert (demo_repo["work"] / "logs" / f"{job.model}.log").exists()
    table = demo._phase_table([result], {job.model: 1.25}, 2.0, 3.0)
    assert "reused" in table and "1.2" in table and job.model in table
