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
    parser.add_argument("--trusted-keys", type=Path, metavar="DIR",
                        help="also require an ed25519 signature by a key in DIR (*.pub), as "
                             "`serve --trusted-keys` does")


def run(args: argparse.Namespace) -> int:
    from seqserve.export.summary import format_parity
    from seqserve.export.verify import verify_bundle

    if args.trusted_keys is not None:
        from seqserve.export.signing import check_signed, load_trusted

        signer = check_signed(args.bundle_dir, load_trusted(args.trusted_keys))
        print(f"{args.bundle_dir}: signed by trusted key {signer}")
    report = verify_bundle(args.bundle_dir, parity=not args.no_parity, progress=True)
    print(f"{report['bundle']}: {report['task']} {report['name']} v{report['version']}, "
          f"{len(report['files'])} files, sha256 ok, signatures ok")
    if report["parity"] is not None:
        print("\n".join(format_parity(report["parity"])))
    print("OK")
    return 0
