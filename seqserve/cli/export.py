"""`seqserve export RUN_DIR`: write a training run as a versioned artifact bundle."""

from __future__ import annotations

import argparse
from pathlib import Path

from seqserve.models.errors import UserError

NAME = "export"
HELP = "Export a finished training run as a versioned ONNX + TorchScript bundle."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", type=Path, metavar="RUN_DIR", help="finished training run")
    parser.add_argument("--repo", type=Path, default=Path("model_repository"),
                        help="model repository folder (default: model_repository)")
    parser.add_argument("--name", required=True, help="model name (folder under --repo)")
    parser.add_argument("--version", type=int, default=None,
                        help="version number (default: next free integer; never overwrites)")
    parser.add_argument("--formats", default="onnx,torchscript",
                        help="comma-separated: onnx, torchscript (default: both)")
    parser.add_argument("--opset", type=int, default=17, help="ONNX opset (default: 17)")
    parser.add_argument("--chat-template", default=None, metavar="FILE|TEMPLATE",
                        help="a language model's chat template (Jinja, as Hugging Face "
                        "tokenizer configs carry one): a file (a tokenizer_config.json: its "
                        "chat_template) or the template itself; /v1/chat/completions renders "
                        "conversations with it")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads while exporting (default: 1, fastest for the "
                        "many small parity runs)")


def run(args: argparse.Namespace) -> int:
    from seqserve.export.bundle import export_run

    if args.threads < 1:
        raise UserError(f"--threads {args.threads} must be >= 1")
    formats = tuple(f.strip() for f in str(args.formats).split(",") if f.strip())
    export_run(args.run_dir, args.repo, args.name, version=args.version, formats=formats,
               progress=True, opset=args.opset, threads=args.threads,
               chat_template=args.chat_template)
    return 0
