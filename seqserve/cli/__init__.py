"""The `seqserve` command: the composition root.

Each subcommand is a module of this package exposing `NAME`, `HELP`, `add_arguments(parser)`
and `run(args) -> int`. Command modules import only argparse-level things at module scope;
heavy imports (torch, onnxruntime, fastapi) happen inside `run`, so `seqserve serve` never
imports torch.
"""

from __future__ import annotations

import argparse
import os
import sys

from seqserve.cli import (
    data,
    demo,
    diagnose,
    export,
    inspect_bundle,
    loadtest,
    models,
    pack,
    serve,
    sign,
    train,
    translate,
    verify,
)
from seqserve.models.errors import UserError

COMMANDS = (data, train, export, pack, verify, inspect_bundle, sign, demo, serve, models,
            translate, loadtest, diagnose)
EXIT_BROKEN_PIPE = 128 + 13
"""Exit status when stdout's reader went away (`seqserve translate --json | head`): what a
process killed by SIGPIPE reports, as `cat` or `seq` do in the same pipe."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="seqserve",
        description="Train, export and serve recurrent sequence models.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for module in COMMANDS:
        cmd = sub.add_parser(module.NAME, help=module.HELP, description=module.HELP)
        module.add_arguments(cmd)
        cmd.set_defaults(_run=module.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args._run(args) or 0)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        # The reader closed the pipe: stop quietly. stdout goes to /dev/null so that the
        # interpreter's flush at exit does not raise (and print) the same error again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return EXIT_BROKEN_PIPE


if __name__ == "__main__":
    sys.exit(main())
