"""`seqserve loadtest`: open- or closed-loop load against a running server, with a report.

Open loop (`--rate`) sends Poisson arrivals and measures latency from each request's scheduled
send time, so a slow server cannot hide its queue (no coordinated omission). Closed loop
(`--concurrency`) keeps C requests in flight and honours Retry-After. `--sweep START:STOP:STEP`
raises the rate step by step and, with `--slo-p99`, reports the highest rate within the SLO.
Open-loop runs say "saturated at R req/s" only when a step saturated the server (refusals,
errors or drops past `--max-error-rate`, or ok answers slower than the arrivals), else the
highest rate reached without saturating. Plots: latency over time (every run); latency and
throughput against rate only for two or more rates (a single rate would be one dot).
`--report-md OUT --from results.json...` turns result files into markdown tables.
`--task generate` loads a language model's /generate (prompts from the pydoc-topics corpus by
default) and reports generated tokens/s; with `--stream` it reads the server-sent events and
reports time to first token and inter-token latency percentiles, with their plot.

Exit status: 0, or 1 when `--slo-p99` was given and no step met it.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path
from typing import Any

from seqserve.loadtest.config import LoadConfig
from seqserve.models.errors import UserError

NAME = "loadtest"
HELP = "Load-test a running server (open/closed loop, sweeps) and write a report."

_CONFIG_FLAGS: tuple[tuple[str, str, type, str | None], ...] = (
    ("--duration", "duration_s", float, "seconds per run/step"),
    ("--requests", "requests", int, "requests per run/step (with --duration: whichever comes "
     "first)"),
    ("--beam-size", "beam_size", int, "translate: beam size"),
    ("--max-new-tokens", "max_new_tokens", int, "generate: max_new_tokens per request"),
    ("--temperature", "temperature", float, "generate: sampling temperature (0 = greedy)"),
    ("--texts-per-request", "texts_per_request", int, "texts (predict: series) per request"),
    ("--features", "features", int, "predict: values per step (the model's features)"),
    ("--series-steps", "series_steps", int, "predict: steps of each random series"),
    ("--max-in-flight", "max_in_flight", int,
     "open loop: outstanding requests before arrivals are dropped"),
    ("--timeout", "timeout_s", float, "per-request timeout, s"),
    ("--seed", "seed", int, None),
)
"""The flags that set a LoadConfig field of the same default: (flag, field, type, help)."""

DEFAULT_DATASETS = {"classify": "langid", "translate": "numbers-en-fr",
                    "generate": "pydoc-topics"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("url", nargs="?", help="server base URL, e.g. http://127.0.0.1:8000")
    parser.add_argument("--model", help="model name on the server")
    parser.add_argument("--task", choices=["classify", "translate", "generate", "predict"],
                        default="classify")
    load = parser.add_mutually_exclusive_group()
    load.add_argument("--rate", type=float, help="open loop: Poisson arrivals, requests/s")
    load.add_argument("--concurrency", type=int, help="closed loop: clients in flight")
    load.add_argument("--sweep", help="open-loop sweep START:STOP:STEP in requests/s")
    for flag, name, kind, text in _CONFIG_FLAGS:
        parser.add_argument(flag, dest=name, type=kind, default=getattr(LoadConfig, name),
                            help=text)
    src = parser.add_mutually_exclusive_group()
    src.add_argument("--texts", type=Path, help="texts: one per line, or JSONL text/source")
    src.add_argument(
        "--dataset", help=f"built-in dataset name (default by task: {DEFAULT_DATASETS})"
    )
    parser.add_argument("--split", default="test", help="dataset split (default test)")
    parser.add_argument("--slo-p99", type=float, help="p99 latency SLO in milliseconds")
    parser.add_argument("--max-error-rate", type=float, default=0.01,
                        help="fraction of errors+drops a step may have and still pass the SLO")
    parser.add_argument("--stream", action="store_true",
                        help="generate: stream (SSE) and time every token (TTFT, inter-token)")
    parser.add_argument("--prompt-chars", type=int, default=64,
                        help="generate with a built-in corpus: prompt length cap, characters")
    parser.add_argument("--session-chunks", type=int, metavar="K",
                        help="predict, closed loop: each client streams its series in K "
                        "chunks through a session")
    parser.add_argument(
        "--http-client", choices=["raw", "httpx"], default="raw",
        help="raw: lean asyncio HTTP/1.1 client (default); httpx: slower, for comparison",
    )  # fmt: skip
    parser.add_argument(
        "--out",
        type=Path,
        default=Path("loadtest-results"),
        help="folder for results.json, results.csv and plots",
    )
    parser.add_argument("--label", help="name of this run in reports")
    parser.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    parser.add_argument("--quiet", action="store_true", help="no per-second progress lines")
    parser.add_argument(
        "--report-md",
        type=Path,
        metavar="OUT",
        help="write markdown tables from --from result files ('-': stdout)",
    )
    parser.add_argument(
        "--from",
        dest="from_results",
        nargs="+",
        type=Path,
        metavar="JSON",
        help="results.json files (or their folders) for --report-md",
    )


def run(args: argparse.Namespace) -> int:
    if args.report_md is not None:
        return _report_md(args.report_md, args.from_results or [])
    cfg = _config(args)
    if cfg.task == "predict":  # random series: no texts are drawn (the sampler stays unused)
        texts = [""]
        what = (f"random series of {cfg.series_steps} steps x {cfg.features}"
                + (f" in {cfg.session_chunks} session chunks" if cfg.session_chunks else ""))
    else:
        texts = _texts(args)
        what = f"{len(texts)} distinct texts"
    print(f"loadtest {cfg.endpoint}: {cfg.mode} loop, {what}", flush=True)
    progress = None if args.quiet else _progress
    if args.sweep:
        return _run_sweep(args, cfg, texts, progress)
    return _run_single(args, cfg, texts, progress)


def _progress(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _config(args: argparse.Namespace) -> Any:
    from seqserve.loadtest.schedule import parse_sweep

    if not args.url or not args.model:
        raise UserError("give the server URL and --model (or --report-md with --from)")
    rate = args.rate
    if args.sweep:
        try:
            rate = parse_sweep(args.sweep)[0]
        except ValueError as exc:
            raise UserError(str(exc)) from exc
    if rate is None and args.concurrency is None:
        raise UserError("give --rate R (open loop), --concurrency C (closed loop) or --sweep")
    return LoadConfig(url=args.url, model=args.model, task=args.task, rate=rate,
                      concurrency=args.concurrency, http_client=args.http_client,
                      stream=args.stream, session_chunks=args.session_chunks,
                      **{name: getattr(args, name) for _, name, _, _ in _CONFIG_FLAGS})


def _texts(args: argparse.Namespace) -> list[str]:
    from seqserve.loadtest.texts import load_corpus_prompts, load_dataset_texts, load_text_file
    from seqserve.models.data.pydoc_corpus import BUILTIN_CORPORA

    if args.texts is not None:
        return load_text_file(args.texts)
    name = args.dataset or DEFAULT_DATASETS[args.task]
    if name in BUILTIN_CORPORA:
        if args.prompt_chars < 1:
            raise UserError(f"--prompt-chars must be >= 1, got {args.prompt_chars}")
        return load_corpus_prompts(name, args.split, args.prompt_chars)
    return load_dataset_texts(name, args.split)


def _run_single(args: argparse.Namespace, cfg: Any, texts: list[str], progress: Any) -> int:
    from seqserve.loadtest.report import write_results
    from seqserve.loadtest.runner import run_load
    from seqserve.loadtest.stats import meets_slo, saturation_verdict
    from seqserve.loadtest.tables import summary_text
    from seqserve.loadtest.texts import TextSampler

    result = run_load(cfg, TextSampler(texts, cfg.seed), progress)
    passed = None
    if args.slo_p99 is not None:
        passed = [meets_slo(result.summary, args.slo_p99, args.max_error_rate)]
    print(summary_text(result.summary))
    paths = write_results(
        args.out,
        [result],
        plots=not args.no_plots,
        slo_p99_ms=args.slo_p99,
        best_rate=cfg.rate if passed and passed[0] else None,
        passed=passed,
        max_error_rate=args.max_error_rate,
        command=_command_line(args),
        label=args.label,
    )
    _print_verdict(args.slo_p99, passed)
    _print_saturation(saturation_verdict([result.summary], args.max_error_rate))
    print("wrote " + ", ".join(str(p) for p in paths.values()))
    return 1 if passed is not None and not any(passed) else 0


def _run_sweep(args: argparse.Namespace, cfg: Any, texts: list[str], progress: Any) -> int:
    from seqserve.loadtest.report import write_results
    from seqserve.loadtest.schedule import parse_sweep
    from seqserve.loadtest.sweep import run_sweep
    from seqserve.loadtest.tables import steps_text

    sweep = run_sweep(
        cfg,
        parse_sweep(args.sweep),
        texts=texts,
        slo_p99_ms=args.slo_p99,
        max_error_rate=args.max_error_rate,
        progress=progress,
    )
    print(steps_text([s.summary for s in sweep.steps]))
    paths = write_results(
        args.out,
        sweep.steps,
        plots=not args.no_plots,
        slo_p99_ms=args.slo_p99,
        best_rate=sweep.best_rate,
        passed=sweep.passed if args.slo_p99 is not None else None,
        max_error_rate=args.max_error_rate,
        command=_command_line(args),
        label=args.label,
    )
    _print_saturation(sweep.saturation)
    if args.slo_p99 is not None:
        best = "none" if sweep.best_rate is None else f"{sweep.best_rate:g} req/s"
        print(f"highest rate with p99 <= {args.slo_p99:g} ms: {best}")
    print("wrote " + ", ".join(str(p) for p in paths.values()))
    return 1 if args.slo_p99 is not None and sweep.best_rate is None else 0


def _print_verdict(slo: float | None, passed: list[bool] | None) -> None:
    if slo is not None and passed is not None:
        print(f"SLO p99 <= {slo:g} ms: {'met' if passed[0] else 'NOT met'}")


def _print_saturation(verdict: dict[str, Any] | None) -> None:
    """`stats.saturation_verdict` in words (open loop only)."""
    from seqserve.loadtest.tables import saturation_text

    text = saturation_text(verdict)
    if text is not None:
        print(text)


def _command_line(args: argparse.Namespace) -> str:
    """A command that reproduces this run (canonical flags, defaults included)."""
    parts = ["seqserve", "loadtest", args.url, "--model", args.model, "--task", args.task]
    for flag, value in (
        ("--rate", args.rate),
        ("--concurrency", args.concurrency),
        ("--sweep", args.sweep),
        ("--duration", args.duration_s),
        ("--requests", args.requests),
        ("--texts", args.texts),
        ("--dataset", args.dataset),
        ("--slo-p99", args.slo_p99),
        ("--seed", args.seed),
    ):
        if value is not None:
            parts += [flag, str(value)]
    if args.task == "translate":
        parts += ["--beam-size", str(args.beam_size)]
    if args.task == "predict":
        parts += ["--features", str(args.features), "--series-steps", str(args.series_steps)]
        if args.session_chunks is not None:
            parts += ["--session-chunks", str(args.session_chunks)]
    if args.task == "generate":
        parts += ["--max-new-tokens", str(args.max_new_tokens),
                  "--temperature", f"{args.temperature:g}"]
        if args.stream:
            parts.append("--stream")
    if args.http_client != "raw":
        parts += ["--http-client", args.http_client]
    if args.texts_per_request != 1:
        parts += ["--texts-per-request", str(args.texts_per_request)]
    if args.label:
        parts += ["--label", args.label]
    return shlex.join(parts)


def _report_md(out: Path, sources: list[Path]) -> int:
    import json

    from seqserve.loadtest.tables import results_markdown

    if not sources:
        raise UserError("--report-md needs result files: --from DIR/results.json ...")
    payloads = []
    for src in sources:
        path = src / "results.json" if src.is_dir() else src
        try:
            payloads.append(json.loads(path.read_text(encoding="utf-8")))
        except (OSError, json.JSONDecodeError) as exc:
            raise UserError(f"cannot read results file {path}: {exc}") from exc
    text = results_markdown(payloads)
    if str(out) == "-":
        sys.stdout.write(text)
    else:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text, encoding="utf-8")
        print(f"wrote {out}")
    return 0
