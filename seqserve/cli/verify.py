"""`seqserve verify BUNDLE_DIR`: re-check a bundle's hashes, signatures and parity."""

from __future__ import annotations

import argparse
from pathlib import Path

NAME = "verify"
HELP = "Verify an exported bundle: sha256 of every file, graph signatures, ONNX vs TorchScript."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("bundle_dir", type=Path, metavar="BUNDLE_DIR",
                        help="a bundle folder: model_repository/NAME/VERSION")
    parser.add_argument("--no-parity", action="store_true",
                        help="check hashes and signatures only (no graph runs)")


def run(args: argparse.Namespace) -> int:
    from seqserve.export.summary import format_parity
    from seqserve.export.verify import verify_bundle

    report = verify_bundle(args.bundle_dir, parity=not args.no_parity, progress=True)
    print(f"{report['bundle']}: {report['task']} {report['name']} v{report['version']}, "
          f"{len(report['files'])} files, sha256 ok, signatures ok")
    if report["parity"] is not None:
        print("\n".join(format_parity(report["parity"])))
    print("OK")
    return 0
