"""`seqserve demo`: the built-in end-to-end job behind `make run`.

Generates the built-in data, trains the language-ID classifier, the en->fr translator, the
number tagger, the `text-lm` language model (CPython's pydoc topics) and the `co2-forecast`
GRU forecaster (the weekly Mauna Loa CO2 series that statsmodels ships; 30 s, less when the
others leave less of the demo's 5 minutes: `forecast_budget`) unless finished runs exist,
reports their test metrics (the forecaster's one-step MAE/RMSE against the seasonal-naive and
persistence baselines; its forecast-vs-actual plot stays in the run directory), exports and
verifies them into the model repository (unless a verified bundle of the same run exists; the
forecaster as a stateful sequence-tagger with its test metrics in the manifest's
`source_run`), and serves them.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

NAME = "demo"
HELP = "Run the built-in demo: data, training, export and serving."

CLASSIFIER = ("langid", "langid")  # (dataset, model name)
TRANSLATOR = ("numbers-en-fr", "numbers-en-fr")
TAGGER = ("numbers-tags", "numbers-tags")
LM = ("pydoc-topics", "text-lm")
FORECASTER = ("co2", "co2-forecast")
DEMO_TOTAL_S = 300.0
"""The demo's target: data, training and export of every model within 5 minutes on 2 cores."""
EXPORT_RESERVE_S = 45.0
"""Time kept for the five exports (24 s measured on a loaded 2-core box) when the forecaster's
budget is taken from what is left of `DEMO_TOTAL_S`."""
FORECAST_MIN_S = 15.0
"""The forecaster's least training budget (its learning rate decays by the budget; in a 30 s
demo run here the validation MAE was 0.383 ppm at 15 s, the best 0.373)."""
FORECAST_EXAMPLE = {"series": [[[368.8], [369.7], [370.3], [370.3], [370.8], [371.2], [371.3],
                                [371.5]]]}
"""The demo's predict example: the last 8 weeks of the series (2001-11-10 .. 2001-12-29, ppm);
each step's output is the forecast of the week after it."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--workdir", type=Path, default=Path("."), help="where data/, runs/ go")
    parser.add_argument("--repo", type=Path, default=None, help="model repository folder")
    parser.add_argument("--retrain", action="store_true", help="train even if runs exist")
    parser.add_argument("--no-serve", action="store_true", help="stop after export")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)


def run(args: argparse.Namespace) -> int:
    work: Path = args.workdir
    repo: Path = args.repo or work / "model_repository"
    started = time.perf_counter()
    runs = {}
    for task, (dataset, model) in (("classifier", CLASSIFIER), ("translator", TRANSLATOR),
                                   ("tagger", TAGGER)):
        runs[model] = _train(task, dataset, work, retrain=args.retrain)
    runs[LM[1]] = _train_lm(work, retrain=args.retrain)
    budget = forecast_budget(time.perf_counter() - started)
    runs[FORECASTER[1]] = _train_forecast(work, retrain=args.retrain,
                                          train_overrides={"budget_s": budget})
    train_s = time.perf_counter() - started
    print(f"\n== test-split metrics (this command's data + training time {train_s / 60:.1f} min;"
          " reused runs count 0) ==")
    for model, run_dir in runs.items():
        print(f"{model:>16}: {_format_metrics(_read_json(run_dir / 'test_metrics.json'))}")
    for model, run_dir in runs.items():
        _print_forms(model, _read_json(run_dir / "test_metrics.json"))
    plot = runs[FORECASTER[1]] / "forecast.png"
    print(f"\n== {FORECASTER[1]}: forecast vs actual over the test span: {plot}")
    for model, run_dir in runs.items():
        _export(run_dir, repo, model)
    print(f"\n== demo total {(time.perf_counter() - started) / 60:.1f} min")
    if args.no_serve:
        return 0
    return _serve(repo, args.host, args.port)


def _train(task: str, dataset: str, work: Path, retrain: bool) -> Path:
    from seqserve.models.data.registry import write_dataset
    from seqserve.models.train import DEMO_CLASSIFIER, DEMO_TAGGER, DEMO_TRANSLATOR, run_training

    data_dir = work / "data" / dataset
    if not (data_dir / "meta.json").exists():
        print(f"== generating dataset {dataset} -> {data_dir}")
        write_dataset(dataset, data_dir)
    run_dir = work / "runs" / dataset
    if (run_dir / "DONE").exists() and not retrain:
        print(f"== {task} run {run_dir} is finished; reusing it (--retrain to train again)")
        return run_dir
    print(f"== training {task} on {dataset} -> {run_dir}")
    overrides = {"classifier": DEMO_CLASSIFIER, "translator": DEMO_TRANSLATOR,
                 "tagger": DEMO_TAGGER}[task]
    run_training(
        task,
        str(data_dir),
        run_dir,
        model_overrides=dict(overrides.get("model", {})),
        train_overrides=dict(overrides.get("train", {})),
        progress=True,
    )
    return run_dir


def _train_lm(work: Path, retrain: bool) -> Path:
    """The demo language model on CPython's own Language Reference text (no download)."""
    from seqserve.models.train_lm import DEMO_LM, run_lm_training

    run_dir = work / "runs" / LM[1]
    if (run_dir / "DONE").exists() and not retrain:
        print(f"== lm run {run_dir} is finished; reusing it (--retrain to train again)")
        return run_dir
    print(f"== training lm on {LM[0]} -> {run_dir}")
    run_lm_training(LM[0], run_dir, dict(DEMO_LM["model"]), dict(DEMO_LM["train"]),
                    progress=True)
    return run_dir


def forecast_budget(elapsed_s: float) -> float:
    """The forecaster's training seconds: its demo budget (`DEMO_FORECAST`, 30 s) or what is
    left of `DEMO_TOTAL_S` after `elapsed_s` and the exports' reserve, whichever is less, but
    at least `FORECAST_MIN_S` (trained last, it takes the slack the other models leave)."""
    from seqserve.models.train_forecast import DEMO_FORECAST

    left = DEMO_TOTAL_S - elapsed_s - EXPORT_RESERVE_S
    return round(max(FORECAST_MIN_S, min(float(DEMO_FORECAST["train"]["budget_s"]), left)), 1)


def _train_forecast(work: Path, retrain: bool, model_overrides: dict[str, Any] | None = None,
                    train_overrides: dict[str, Any] | None = None, progress: bool = True
                    ) -> Path:
    """The demo forecaster on the weekly CO2 series (statsmodels ships it; no download);
    overrides go over `DEMO_FORECAST` (tests train a tiny one)."""
    from seqserve.models.train_forecast import DEMO_FORECAST, train_forecaster

    run_dir = work / "runs" / FORECASTER[1]
    if (run_dir / "DONE").exists() and not retrain:
        print(f"== forecast run {run_dir} is finished; reusing it (--retrain to train again)")
        return run_dir
    train = {**DEMO_FORECAST["train"], **(train_overrides or {})}
    print(f"== training forecaster on {FORECASTER[0]} -> {run_dir} ({train['budget_s']:g} s)")
    train_forecaster(run_dir, budget_s=float(train.pop("budget_s")),
                     model_overrides={**DEMO_FORECAST["model"], **(model_overrides or {})},
                     train_overrides=train, series=FORECASTER[0], progress=progress)
    return run_dir


def _export(run_dir: Path, repo: Path, name: str) -> Path:
    from seqserve.export.bundle import export_run
    from seqserve.export.manifest import list_bundles, load_bundle
    from seqserve.models.errors import BundleError

    run_path = str(run_dir.resolve())
    for bundle_name, _version, path in list_bundles(repo):
        if bundle_name != name:
            continue
        try:
            manifest = load_bundle(path, verify=True)
        except BundleError as exc:  # a broken bundle is reported, not reused
            print(f"== ignoring {path}: {exc}")
            continue
        if manifest.source_run.get("path") == run_path:
            print(f"== {name}: verified bundle {path} already holds run {run_dir}")
            return Path(path)
    print(f"== exporting {run_dir} -> {repo}/{name}")
    return Path(export_run(run_dir, repo, name, progress=True))


def _serve(repo: Path, host: str, port: int) -> int:
    from seqserve.service.cli.serve import serve
    from seqserve.service.web.settings import Settings

    settings = Settings(repo=repo, host=host, port=port)
    base = f"http://{host}:{port}"
    print(
        "\n== serving; try:\n"
        f"curl -s {base}/v1/models\n"
        f"curl -s -X POST {base}/v1/models/{CLASSIFIER[1]}/classify "
        "-H 'content-type: application/json' "
        "-d '{\"texts\": [\"vingt et un mars deux mille cinq\", \"dvacet jedna\"], "
        "\"top_k\": 3}'\n"
        f"curl -s -X POST {base}/v1/models/{TRANSLATOR[1]}/translate "
        "-H 'content-type: application/json' "
        "-d '{\"texts\": [\"Two hundred and forty-one.\", \"thirteen\"], \"beam_size\": 5}'\n"
        f"curl -s -X POST {base}/v1/models/{TAGGER[1]}/tag "
        "-H 'content-type: application/json' "
        "-d '{\"texts\": [\"the first of may two thousand and five\"]}'\n"
        f"curl -N -X POST {base}/v1/models/{LM[1]}/generate "
        "-H 'content-type: application/json' "
        "-d '{\"prompt\": \"The assert statement\", \"max_new_tokens\": 60, "
        "\"temperature\": 0.8, \"stream\": true}'\n"
        f"curl -s -X POST {base}/v1/models/{FORECASTER[1]}/predict "
        "-H 'content-type: application/json' "
        f"-d '{json.dumps(FORECAST_EXAMPLE)}'\n"
        f"curl -s {base}/metrics | grep seqserve_requests_total\n",
        flush=True,
    )
    return serve(settings)


def _read_json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text()) if path.exists() else {}


def _print_forms(model: str, metrics: dict[str, Any]) -> None:
    """The per-surface-form table of a run whose test rows name their form."""
    from seqserve.models.forms_eval import format_table

    if metrics.get("forms"):
        search = f"; translations: {metrics['search']}" if "search" in metrics else ""
        print(f"\n== {model}: test split per surface form (docs/data.md){search} ==")
        print("\n".join(format_table(metrics["forms"])))


def _format_metrics(metrics: dict[str, Any]) -> str:
    if isinstance(metrics.get("one_step"), dict):
        return _format_forecast(metrics)
    shown = []
    for key, value in metrics.items():
        if key == "forms" or key.startswith("f1/"):
            continue
        shown.append(f"{key}={value:.4f}" if isinstance(value, float) else f"{key}={value}")
    return ", ".join(shown) or "(no metrics)"


def _format_forecast(metrics: dict[str, Any]) -> str:
    """A forecaster's test metrics: one-step and iterated MAE / RMSE against its baselines."""
    parts = []
    for kind, title in (("one_step", "one-step"), ("multi_step", "iterated")):
        scores = metrics.get(kind) or {}
        shown = [f"{who.replace('_', '-')} {s['mae']:.3f} / {s['rmse']:.3f}"
                 for who, s in scores.items()]
        parts.append(f"{title} MAE / RMSE ({metrics.get('unit', '')}): {', '.join(shown)}")
    span = f"test {metrics.get('start')} .. {metrics.get('end')} ({metrics.get('steps')} steps)"
    return "; ".join([span, *parts])
