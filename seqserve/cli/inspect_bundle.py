"""`seqserve inspect BUNDLE`: what a bundle expects and returns (never imports torch)."""

from __future__ import annotations

import argparse
from pathlib import Path

NAME = "inspect"
HELP = ("Show what a bundle expects and returns: its graphs' tensors, tokenizer and special "
        "tokens, limits, labels, the request body to send and a ready curl command.")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("bundle", type=Path, metavar="BUNDLE",
                        help="a bundle: a version folder (model_repository/NAME/VERSION) or a "
                        "model folder (model_repository/NAME: its highest version)")
    parser.add_argument("--json", action="store_true",
                        help="print one JSON object (for programs) instead of text")
    parser.add_argument("--url", default="http://localhost:8000",
                        help="the server the curl command calls (default: "
                        "http://localhost:8000)")


def run(args: argparse.Namespace) -> int:
    import json

    from seqserve.export.inspection import format_inspection, inspect_bundle

    info = inspect_bundle(args.bundle, url=args.url)
    print(json.dumps(info, indent=2) if args.json else format_inspection(info))
    return 0
