"""`seqserve train classifier|translator|tagger|lm|forecast --data SPEC --out RUN_DIR [options]`.

`lm` trains a language model (models/train/lm.py) on the built-in `pydoc-topics` corpus or on
text files (`--data a.txt b.txt`, or a folder of .txt files). `forecast` trains the GRU/LSTM
forecaster (models/train/forecast.py) on a built-in series (`--data co2`: weekly Mauna Loa
CO2); `--max-minutes` is its time budget (default 30 s)."""

from __future__ import annotations

import argparse
import json
import sys

NAME = "train"
HELP = ("Train a classifier, translator, tagger, language model or forecaster into a run "
        "directory.")

# argparse dest -> config field
_MODEL_FLAGS = {"cell": "cell", "hidden": "hidden_size", "embed": "embed_size",
                "layers": "num_layers", "attention": "attention", "dropout": "dropout",
                "vocab_size": "vocab_size", "max_length": "max_length",
                "bidirectional": "bidirectional", "proj_size": "proj_size",
                "peephole": "peephole", "cifg": "cifg", "decoder": "decoder",
                "input_feeding": "input_feeding", "forget_bias": "forget_bias",
                "tie_weights": "tie_weights"}
_TRAIN_FLAGS = {"epochs": "epochs", "batch_size": "batch_size", "lr": "lr", "seed": "seed",
                "max_minutes": "max_minutes", "patience": "patience",
                "scheduled_sampling": "scheduled_sampling", "clip_norm": "clip_norm",
                "weight_decay": "weight_decay", "label_smoothing": "label_smoothing",
                "tokenizer_type": "tokenizer_type", "threads": "num_threads",
                "tokenizer_normalization": "tokenizer_normalization",
                "max_train_examples": "max_train_examples",
                "max_eval_examples": "max_eval_examples", "tbptt": "tbptt",
                "gradient_flow_every": "gradient_flow_every"}


class _Unset:
    """`--forget-bias none`: JSON null in the config (PyTorch's default init)."""


FORGET_BIAS_DEFAULT_INIT = _Unset()


def _forget_bias(value: str) -> float | _Unset:
    if value.strip().lower() in ("none", "default"):
        return FORGET_BIAS_DEFAULT_INIT
    try:
        return float(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{value!r}: a number (e.g. 1) or 'none'") from exc


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("task", choices=["classifier", "translator", "tagger", "lm", "forecast"],
                        help="model family (lm: language model; forecast: series forecaster)")
    parser.add_argument("--data", required=True, nargs="+",
                        help="built-in dataset name, dataset folder, or CSV/TSV/JSONL data; "
                             "lm: pydoc-topics, or text files (one file: a document per line; "
                             "several files or a folder of .txt: a document per file); "
                             "forecast: co2")
    parser.add_argument("--out", required=True, help="run directory to write")
    parser.add_argument("--size", type=int, default=None,
                        help="train examples of a built-in dataset (default: its own)")
    parser.add_argument("--demo-defaults", action="store_true",
                        help="start from the demo run's settings (flags still override)")
    model = parser.add_argument_group("model")
    model.add_argument("--cell", choices=["rnn", "lstm", "gru"], help="forecast: gru or lstm")
    model.add_argument("--hidden", type=int, help="hidden size")
    model.add_argument("--embed", type=int, help="embedding size")
    model.add_argument("--layers", type=int, help="RNN layers")
    model.add_argument("--attention", choices=["additive", "dot", "general", "none"],
                       help="attention score (translator: bahdanau takes additive; luong "
                            "additive, dot or general; none takes none)")
    model.add_argument("--decoder", choices=["none", "bahdanau", "luong"],
                       help="translator decoder: none (fixed context), bahdanau, luong "
                            "(default luong; its default score is filled in)")
    model.add_argument("--input-feeding", action=argparse.BooleanOptionalAction, default=None,
                       help="translator, luong decoder: feed the previous attentional vector")
    model.add_argument("--forget-bias", type=_forget_bias, metavar="B",
                       help="LSTM forget-gate bias at init (default 1; 'none' = PyTorch's "
                            "uniform init)")
    model.add_argument("--dropout", type=float)
    model.add_argument("--vocab-size", type=int, help="target tokenizer vocabulary size")
    model.add_argument("--max-length", type=int, help="longest input in tokens")
    model.add_argument("--bidirectional", action=argparse.BooleanOptionalAction, default=None)
    model.add_argument("--proj-size", type=int, help="LSTM recurrent projection size (0 = none)")
    model.add_argument("--peephole", action=argparse.BooleanOptionalAction, default=None,
                       help="LSTM peephole connections")
    model.add_argument("--cifg", action=argparse.BooleanOptionalAction, default=None,
                       help="LSTM coupled input-forget gate")
    model.add_argument("--tie-weights", action=argparse.BooleanOptionalAction, default=None,
                       help="lm: share the embedding with the output projection")
    train = parser.add_argument_group("training")
    train.add_argument("--epochs", type=int)
    train.add_argument("--batch-size", type=int)
    train.add_argument("--lr", type=float)
    train.add_argument("--seed", type=int)
    train.add_argument("--max-minutes", type=float, help="training time budget (0 = none)")
    train.add_argument("--patience", type=int, help="early-stopping patience in epochs")
    train.add_argument("--scheduled-sampling", type=float,
                       help="final probability of feeding the model's own prediction")
    train.add_argument("--clip-norm", type=float)
    train.add_argument("--weight-decay", type=float)
    train.add_argument("--label-smoothing", type=float)
    train.add_argument("--tokenizer-type", choices=["unigram", "bpe", "word", "char"])
    train.add_argument("--tokenizer-normalization",
                       help="nmt_nfkc_cf | nmt_nfkc_cf_punct | nmt_nfkc | nfkc | nfkc_cf | "
                            "identity (default: the dataset's own, else nmt_nfkc_cf)")
    train.add_argument("--threads", type=int, help="torch threads")
    train.add_argument("--max-train-examples", type=int)
    train.add_argument("--max-eval-examples", type=int)
    train.add_argument("--tbptt", type=int, help="truncated BPTT chunk length (0 = full BPTT; "
                       "lm: tokens per chunk, state carried across chunks, default 64)")
    train.add_argument("--gradient-flow-every", type=int,
                       help="measure gradient flow every N steps (gradient_flow.jsonl)")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")


def _overrides(args: argparse.Namespace, flags: dict[str, str]) -> dict[str, object]:
    values = {field: getattr(args, flag) for flag, field in flags.items()
              if getattr(args, flag) is not None}
    return {k: None if v is FORGET_BIAS_DEFAULT_INIT else v for k, v in values.items()}


def run(args: argparse.Namespace) -> int:
    if args.task == "lm":
        return _run_lm(args)
    if args.task == "forecast":
        return _run_forecast(args)
    if len(args.data) != 1:
        print(f"seqserve train {args.task}: --data takes one dataset", file=sys.stderr)
        return 2
    args.data = args.data[0]
    from seqserve.models.train.run import (
        DEMO_CLASSIFIER,
        DEMO_TAGGER,
        DEMO_TRANSLATOR,
        run_training,
    )

    model_overrides: dict[str, object] = {}
    train_overrides: dict[str, object] = {}
    if args.demo_defaults:
        demo = {"classifier": DEMO_CLASSIFIER, "translator": DEMO_TRANSLATOR,
                "tagger": DEMO_TAGGER}[args.task]
        args.size = args.size or demo.get("data_size")
        model_overrides.update(demo["model"])
        train_overrides.update(demo["train"])
        if args.decoder is not None and args.attention is None:  # the decoder's own score
            model_overrides.pop("attention", None)
    model_overrides.update(_overrides(args, _MODEL_FLAGS))
    train_overrides.update(_overrides(args, _TRAIN_FLAGS))
    metrics = run_training(args.task, args.data, args.out, model_overrides, train_overrides,
                           progress=not args.quiet, data_size=args.size)
    print(json.dumps({"run_dir": args.out, "test": metrics}, indent=2))
    if metrics.get("forms"):
        from seqserve.models.diagnostics.forms import format_table

        search = f" (translations: {metrics['search']})" if "search" in metrics else ""
        print(f"test split per surface form{search}:", file=sys.stderr)
        print("\n".join(format_table(metrics["forms"])), file=sys.stderr)
    return 0


def _run_lm(args: argparse.Namespace) -> int:
    from seqserve.models.train.lm import DEMO_LM, run_lm_training

    model_overrides: dict[str, object] = {}
    train_overrides: dict[str, object] = {}
    if args.demo_defaults:
        model_overrides.update(DEMO_LM["model"])
        train_overrides.update(DEMO_LM["train"])
    model_overrides.update(_overrides(args, _MODEL_FLAGS))
    train_overrides.update(_overrides(args, _TRAIN_FLAGS))
    data = args.data[0] if len(args.data) == 1 else args.data
    metrics = run_lm_training(data, args.out, model_overrides, train_overrides,
                              progress=not args.quiet)
    print(json.dumps({"run_dir": args.out, "test": metrics}, indent=2))
    return 0


# forecast: argparse dest -> ForecasterConfig / ForecastTrainConfig field
_FORECAST_MODEL_FLAGS = {"cell": "cell", "hidden": "hidden_size", "layers": "num_layers",
                         "dropout": "dropout", "forget_bias": "forget_bias"}
_FORECAST_TRAIN_FLAGS = {"epochs": "max_epochs", "batch_size": "batch_size", "lr": "lr",
                         "patience": "patience", "clip_norm": "clip_norm",
                         "weight_decay": "weight_decay", "threads": "num_threads"}
_FORECAST_UNUSED = ("embed", "attention", "decoder", "input_feeding", "vocab_size",
                    "max_length", "bidirectional", "proj_size", "peephole", "cifg",
                    "tie_weights", "scheduled_sampling", "label_smoothing", "tokenizer_type",
                    "tokenizer_normalization", "max_train_examples", "max_eval_examples",
                    "tbptt", "gradient_flow_every", "size")


def _run_forecast(args: argparse.Namespace) -> int:
    from seqserve.models.train.forecast import DEMO_FORECAST, SERIES, train_forecaster

    if len(args.data) != 1 or args.data[0] not in SERIES:
        print(f"seqserve train forecast: --data takes one built-in series ({', '.join(SERIES)})",
              file=sys.stderr)
        return 2
    unused = [f"--{f.replace('_', '-')}" for f in _FORECAST_UNUSED
              if getattr(args, f, None) not in (None, False)]
    if unused:
        print(f"seqserve train forecast: {', '.join(unused)} do not apply to the forecaster",
              file=sys.stderr)
        return 2
    if args.cell == "rnn":
        print("seqserve train forecast: --cell takes gru or lstm", file=sys.stderr)
        return 2
    model_overrides: dict[str, object] = dict(DEMO_FORECAST["model"])
    train_overrides: dict[str, object] = dict(DEMO_FORECAST["train"])
    model_overrides.update(_overrides(args, _FORECAST_MODEL_FLAGS))
    train_overrides.update(_overrides(args, _FORECAST_TRAIN_FLAGS))
    if args.max_minutes is not None:
        train_overrides["budget_s"] = args.max_minutes * 60
    result = train_forecaster(args.out, seed=args.seed if args.seed is not None else 0,
                              model_overrides=model_overrides, train_overrides=train_overrides,
                              series=args.data[0], progress=not args.quiet)
    print(json.dumps({"run_dir": args.out, "test": result.metrics}, indent=2))
    return 0
