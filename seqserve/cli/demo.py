"""`seqserve demo`: the built-in end-to-end job behind `make run`.

Generates the built-in data, trains the language-ID classifier, the en->fr translator, the
number tagger, the `text-lm` language model (CPython's pydoc topics) and the `co2-forecast`
GRU forecaster (the weekly Mauna Loa CO2 series that statsmodels ships) unless finished runs
exist, reports their test metrics (the forecaster's one-step MAE/RMSE against the
seasonal-naive and persistence baselines; its forecast-vs-actual plot stays in the run
directory), exports and verifies them into the model repository (unless a verified bundle of
the same run exists; the forecaster as a stateful sequence-tagger with its test metrics in the
manifest's `source_run`), and serves them.

One time budget: serving within `DEMO_TOTAL_S` (5 minutes on 2 cores). The five trainings run
`--jobs` at a time (default 2: one process per core, each on one torch thread; the biggest
first) and each gets a training budget from what is left when it starts (`job_deadline`,
`train_budget`): at most its own (the config's `max_minutes`, the forecaster's `budget_s`), at
least its floor, keeping the floors of the trainings not yet started and the exports' and
server start's reserves. The trainers stop earlier on their own: the classifier, translator
and tagger once their main validation metric is perfect, the LM by patience or epochs, the
forecaster by patience. The per-phase seconds are printed at the end, then "serving after X s".
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from dataclasses import dataclass
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
"""The demo's target: from the command's start to serving within 5 minutes on 2 cores."""
EXPORT_RESERVE_S = 30.0
"""Time kept for the five exports and their verification (11 s measured at load average 1.3
on the 2-core box, 30-35 s at 5-10)."""
SERVE_RESERVE_S = 15.0
"""Time kept for the server to load and warm the five bundles (`/v2/health/ready` answered
200 after 15 s at load average 7.6 on the 2-core box)."""


@dataclass(frozen=True)
class Job:
    """One demo training: its run's name, kind and budget rule (seconds)."""

    model: str
    kind: str
    """classifier | translator | tagger | lm | forecast."""
    dataset: str
    floor_s: float
    """Least training budget, however late it starts."""
    tail_s: float
    """Seconds it needs outside its training budget: tokenizer, encoding, the validation
    that ends the last epoch, test evaluation (the translator's beam search), plots (about
    twice a quiet 2-core machine's; at load average 5-8 they took 88, 35, 9, 23 and 10 s)."""


JOBS = (
    Job(TRANSLATOR[1], "translator", TRANSLATOR[0], floor_s=60.0, tail_s=40.0),
    Job(CLASSIFIER[1], "classifier", CLASSIFIER[0], floor_s=45.0, tail_s=25.0),
    Job(LM[1], "lm", LM[0], floor_s=20.0, tail_s=10.0),
    Job(TAGGER[1], "tagger", TAGGER[0], floor_s=10.0, tail_s=15.0),
    Job(FORECASTER[1], "forecast", FORECASTER[0], floor_s=15.0, tail_s=10.0),
)
"""The trainings in the order they start (the longest first, so the cheap ones fill the
other lane; the forecaster, whose training always runs to its budget or patience, last)."""
FORECAST_EXAMPLE = {"series": [[[368.8], [369.7], [370.3], [370.3], [370.8], [371.2], [371.3],
                                [371.5]]]}
"""The demo's predict example: the last 8 weeks of the series (2001-11-10 .. 2001-12-29, ppm);
each step's output is the forecast of the week after it."""


@dataclass
class JobResult:
    """What one training job did (seconds; `budget_s` None when the run was reused)."""

    model: str
    run_dir: Path
    data_s: float = 0.0
    train_s: float = 0.0
    budget_s: float | None = None
    stop_reason: str = ""
    cpu_s: float = 0.0
    """CPU seconds of the job's process (what it would take on an idle core)."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--workdir", type=Path, default=Path("."), help="where data/, runs/ go")
    parser.add_argument("--repo", type=Path, default=None, help="model repository folder")
    parser.add_argument("--retrain", action="store_true", help="train even if runs exist")
    parser.add_argument("--no-serve", action="store_true", help="stop after export")
    parser.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1),
                        help="trainings run at once, one process and torch thread each "
                             "(default: 2, or 1 on a 1-core machine)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)


def run(args: argparse.Namespace) -> int:
    from seqserve.models.errors import UserError

    if args.jobs < 1:
        raise UserError(f"--jobs {args.jobs}: use 1 or more")
    work: Path = args.workdir
    repo: Path = args.repo or work / "model_repository"
    started = time.time()
    train_deadline = started + DEMO_TOTAL_S - EXPORT_RESERVE_S - SERVE_RESERVE_S
    results = _run_jobs(JOBS, work, args.retrain, args.jobs, train_deadline)
    runs = {job.model: results[job.model].run_dir for job in JOBS}
    train_s = time.time() - started
    print(f"\n== test-split metrics (this command's data + training time {train_s:.0f} s,"
          f" {args.jobs} at a time; reused runs count 0) ==")
    for model, run_dir in runs.items():
        print(f"{model:>16}: {_format_metrics(_read_json(run_dir / 'test_metrics.json'))}")
    for model, run_dir in runs.items():
        _print_forms(model, _read_json(run_dir / "test_metrics.json"))
    plot = runs[FORECASTER[1]] / "forecast.png"
    print(f"\n== {FORECASTER[1]}: forecast vs actual over the test span: {plot}")
    exports: dict[str, float] = {}
    for model, run_dir in runs.items():
        at = time.time()
        _export(run_dir, repo, model)
        exports[model] = time.time() - at
    print(_phase_table([results[job.model] for job in JOBS], exports, train_s,
                       time.time() - started))
    if args.no_serve:
        print(f"\n== ready to serve after {time.time() - started:.0f} s "
              f"(the demo's budget to serving: {DEMO_TOTAL_S:.0f} s)", flush=True)
        return 0
    return _serve(repo, args.host, args.port, started)


def job_deadline(train_deadline: float, job: Job, queued: list[Job] | tuple[Job, ...],
                 lanes: int) -> float:
    """When `job`'s training must end (the clock of `train_deadline`): the trainings' deadline
    less the job's own tail and its share (1/lanes) of the floors and tails of the `queued`
    jobs that have not started yet."""
    later = sum(j.floor_s + j.tail_s for j in queued) / max(1, lanes)
    return train_deadline - job.tail_s - later


def train_budget(cap_s: float, floor_s: float, left_s: float) -> float:
    """A training's seconds: what is left until its deadline, at most its own budget `cap_s`,
    at least `floor_s` (rounded to 0.1 s)."""
    return round(max(floor_s, min(cap_s, left_s)), 1)


def _run_jobs(jobs: tuple[Job, ...], work: Path, retrain: bool, lanes: int,
              train_deadline: float) -> dict[str, JobResult]:
    """Every job, `lanes` at a time: in this process one after another (lanes 1), else in a
    pool of spawned processes (each starts the next job once one ends)."""
    results: dict[str, JobResult] = {}
    pending = list(jobs)
    if lanes == 1:
        while pending:
            job = pending.pop(0)
            results[job.model] = _run_job(job, work, retrain,
                                          job_deadline(train_deadline, job, pending, 1))
        return results
    import multiprocessing
    from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait

    print(f"== training {len(jobs)} models, {lanes} at a time (one process and torch thread "
          f"each; progress bars in {work / 'logs'})", flush=True)
    pool = ProcessPoolExecutor(max_workers=lanes,
                               mp_context=multiprocessing.get_context("spawn"),
                               initializer=_training_process_init)
    running: dict[Future[JobResult], Job] = {}
    try:
        while pending or running:
            while pending and len(running) < lanes:
                job = pending.pop(0)
                deadline = job_deadline(train_deadline, job, pending, lanes)
                running[pool.submit(_run_job, job, work, retrain, deadline, True)] = job
            done, _ = wait(running, return_when=FIRST_COMPLETED)
            for future in done:
                result = future.result()
                results[running.pop(future).model] = result
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
    return results


def _training_process_init() -> None:
    """A training process: its lines reach the terminal as they are written."""
    if hasattr(sys.stdout, "reconfigure"):
        sys.stdout.reconfigure(line_buffering=True)


def _run_job(job: Job, work: Path, retrain: bool, deadline: float,
             bars_to_log: bool = False) -> JobResult:
    """Data (if missing), then training (unless a finished run exists and not `retrain`)
    with the budget `train_budget` gives at its start; with `bars_to_log` its stderr (progress
    bars, warnings) goes to work/logs/<model>.log."""
    if not bars_to_log:
        return _run_job_here(job, work, retrain, deadline)
    logs = work / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    saved = sys.stderr
    with (logs / f"{job.model}.log").open("w") as log:
        sys.stderr = log
        try:
            return _run_job_here(job, work, retrain, deadline)
        finally:
            sys.stderr = saved


def _run_job_here(job: Job, work: Path, retrain: bool, deadline: float) -> JobResult:
    run_dir = work / "runs" / (job.dataset if job.kind in _DATASET_TASKS else job.model)
    if (run_dir / "DONE").exists() and not retrain:
        print(f"== {job.kind} run {run_dir} is finished; reusing it (--retrain to train again)",
              flush=True)
        return JobResult(job.model, run_dir)
    at, cpu = time.time(), time.process_time()
    if job.kind in _DATASET_TASKS:
        _write_data(job.dataset, work)
    data_s = time.time() - at
    budget = train_budget(_job_cap(job), job.floor_s, deadline - time.time())
    if job.kind in _DATASET_TASKS:
        _train(job.kind, job.dataset, work, retrain=True, budget_s=budget)
    elif job.kind == "lm":
        _train_lm(work, retrain=True, budget_s=budget)
    else:
        _train_forecast(work, retrain=True, train_overrides={"budget_s": budget})
    stop = str(_read_json(run_dir / "test_metrics.json").get("stop_reason", ""))
    if not stop:  # the forecaster keeps it in metrics.json
        stop = str(_read_json(run_dir / "metrics.json").get("stop_reason", ""))
    return JobResult(job.model, run_dir, data_s, time.time() - at - data_s, budget, stop,
                     time.process_time() - cpu)


_DATASET_TASKS = ("classifier", "translator", "tagger")


def _job_cap(job: Job) -> float:
    """A job's own training budget in seconds (its demo config's)."""
    if job.kind == "forecast":
        from seqserve.models.train.forecast import DEMO_FORECAST

        return float(DEMO_FORECAST["train"]["budget_s"])
    if job.kind == "lm":
        from seqserve.models.train.lm import DEMO_LM

        return float(DEMO_LM["train"]["max_minutes"]) * 60
    return float(_demo_config(job.kind)["train"]["max_minutes"]) * 60


def _demo_config(task: str) -> dict[str, Any]:
    from seqserve.models.train.run import DEMO_CLASSIFIER, DEMO_TAGGER, DEMO_TRANSLATOR

    return {"classifier": DEMO_CLASSIFIER, "translator": DEMO_TRANSLATOR,
            "tagger": DEMO_TAGGER}[task]


def _write_data(dataset: str, work: Path) -> Path:
    from seqserve.models.data.registry import write_dataset

    data_dir = work / "data" / dataset
    if not (data_dir / "meta.json").exists():
        print(f"== generating dataset {dataset} -> {data_dir}", flush=True)
        write_dataset(dataset, data_dir)
    return data_dir


def _train(task: str, dataset: str, work: Path, retrain: bool,
           budget_s: float | None = None) -> Path:
    """The demo run of `task` on `dataset` (its DEMO_* config; `budget_s` replaces its
    `max_minutes`)."""
    from seqserve.models.train.run import run_training

    data_dir = _write_data(dataset, work)
    run_dir = work / "runs" / dataset
    if (run_dir / "DONE").exists() and not retrain:
        print(f"== {task} run {run_dir} is finished; reusing it (--retrain to train again)")
        return run_dir
    overrides = _demo_config(task)
    train = dict(overrides.get("train", {}))
    if budget_s is not None:
        train["max_minutes"] = round(budget_s / 60, 3)
    print(f"== training {task} on {dataset} -> {run_dir} ({train['max_minutes'] * 60:.0f} s "
          "at most)", flush=True)
    run_training(
        task,
        str(data_dir),
        run_dir,
        model_overrides=dict(overrides.get("model", {})),
        train_overrides=train,
        progress=True,
    )
    return run_dir


def _train_lm(work: Path, retrain: bool, budget_s: float | None = None) -> Path:
    """The demo language model on CPython's own Language Reference text (no download)."""
    from seqserve.models.train.lm import DEMO_LM, run_lm_training

    run_dir = work / "runs" / LM[1]
    if (run_dir / "DONE").exists() and not retrain:
        print(f"== lm run {run_dir} is finished; reusing it (--retrain to train again)")
        return run_dir
    train = dict(DEMO_LM["train"])
    if budget_s is not None:
        train["max_minutes"] = round(budget_s / 60, 3)
    print(f"== training lm on {LM[0]} -> {run_dir} ({train['max_minutes'] * 60:.0f} s at most)",
          flush=True)
    run_lm_training(LM[0], run_dir, dict(DEMO_LM["model"]), train, progress=True)
    return run_dir


def _train_forecast(work: Path, retrain: bool, model_overrides: dict[str, Any] | None = None,
                    train_overrides: dict[str, Any] | None = None, progress: bool = True
                    ) -> Path:
    """The demo forecaster on the weekly CO2 series (statsmodels ships it; no download);
    overrides go over `DEMO_FORECAST` (tests train a tiny one)."""
    from seqserve.models.train.forecast import DEMO_FORECAST, train_forecaster

    run_dir = work / "runs" / FORECASTER[1]
    if (run_dir / "DONE").exists() and not retrain:
        print(f"== forecast run {run_dir} is finished; reusing it (--retrain to train again)")
        return run_dir
    train = {**DEMO_FORECAST["train"], **(train_overrides or {})}
    print(f"== training forecaster on {FORECASTER[0]} -> {run_dir} ({train['budget_s']:g} s)",
          flush=True)
    train_forecaster(run_dir, budget_s=float(train.pop("budget_s")),
                     model_overrides={**DEMO_FORECAST["model"], **(model_overrides or {})},
                     train_overrides=train, series=FORECASTER[0], progress=progress)
    return run_dir


def _export(run_dir: Path, repo: Path, name: str) -> Path:
    """The run's bundle: a verified one of the same run (and chat template) found in `repo`,
    else a new version; the language model with the default chat template, so the demo
    serves /v1/chat/completions."""
    from seqserve.export.bundle import export_run
    from seqserve.export.manifest import load_bundle
    from seqserve.export.versions import list_bundles
    from seqserve.models.errors import BundleError
    from seqserve.models.text.chat_template import DEFAULT_CHAT_TEMPLATE

    template = DEFAULT_CHAT_TEMPLATE if name == LM[1] else None

    run_path = str(run_dir.resolve())
    for bundle_name, _version, path in list_bundles(repo):
        if bundle_name != name:
            continue
        try:
            manifest = load_bundle(path, verify=True)
        except BundleError as exc:  # a broken bundle is reported, not reused
            print(f"== ignoring {path}: {exc}")
            continue
        if manifest.source_run.get("path") == run_path and \
                manifest.chat_template == template:
            print(f"== {name}: verified bundle {path} already holds run {run_dir}")
            return Path(path)
    print(f"== exporting {run_dir} -> {repo}/{name}")
    return Path(export_run(run_dir, repo, name, progress=True, chat_template=template))


def _serve(repo: Path, host: str, port: int, started: float | None = None) -> int:
    from seqserve.cli.serve import serve
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
    if started is not None:
        threading.Thread(target=_report_ready, args=(f"{base}/v2/health/ready", started),
                         name="demo-ready", daemon=True).start()
    return serve(settings)


def _report_ready(url: str, started: float, timeout_s: float = 600.0) -> None:
    """Print "serving after X s" once `url` (the readiness route) answers 200."""
    import urllib.error
    import urllib.request

    while time.time() - started < timeout_s:
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    print(f"\n== serving after {time.time() - started:.0f} s (the demo's "
                          f"budget: {DEMO_TOTAL_S:.0f} s)", flush=True)
                    return
        except (OSError, urllib.error.URLError):
            pass
        time.sleep(0.25)


def _phase_table(results: list[JobResult], exports: dict[str, float], train_s: float,
                 total_s: float) -> str:
    """Seconds per phase: each model's data, training (its budget, why it stopped; the CPU
    seconds of both), export; then the machine's load average."""
    lines = [f"\n== seconds per phase (data + training of all: {train_s:.0f} s; "
             f"until now: {total_s:.0f} s) ==",
             f"{'model':>16} {'data':>6} {'train':>6} {'budget':>6} {'cpu':>6} {'export':>6}"
             "  stopped"]
    for r in results:
        budget = f"{r.budget_s:6.0f}" if r.budget_s is not None else f"{'reused':>6}"
        lines.append(f"{r.model:>16} {r.data_s:6.1f} {r.train_s:6.1f} {budget} {r.cpu_s:6.1f} "
                     f"{exports.get(r.model, 0.0):6.1f}  {r.stop_reason}")
    if hasattr(os, "getloadavg"):
        lines.append("load average (1, 5, 15 min): "
                     + ", ".join(f"{x:.2f}" for x in os.getloadavg()))
    return "\n".join(lines)


def _read_json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text()) if path.exists() else {}


def _print_forms(model: str, metrics: dict[str, Any]) -> None:
    """The per-surface-form table of a run whose test rows name their form."""
    from seqserve.models.diagnostics.forms import format_table

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
