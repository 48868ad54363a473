"""`seqserve sign`: sign a bundle's manifest with an ed25519 key, or make a key pair."""

from __future__ import annotations

import argparse
from pathlib import Path

NAME = "sign"
HELP = ("Sign a bundle (an ed25519 signature over its manifest.json, which hashes every file) "
        "or make a key pair; `serve --trusted-keys DIR` serves only signed bundles.")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("bundle_dir", type=Path, nargs="*", metavar="BUNDLE_DIR",
                        help="bundle folders to sign: model_repository/NAME/VERSION")
    parser.add_argument("--key", type=Path, help="the private key (PEM) that signs")
    parser.add_argument("--new-key", type=Path, metavar="DIR",
                        help="write a new key pair into DIR (NAME.key, mode 0600; NAME.pub: "
                             "put the .pub files in the server's --trusted-keys folder)")
    parser.add_argument("--name", default="seqserve", help="the new key pair's file name")


def run(args: argparse.Namespace) -> int:
    from seqserve.export.signing import new_key, sign_bundle
    from seqserve.models.errors import UserError

    if args.new_key is not None:
        private, public = new_key(args.new_key, args.name)
        print(f"private key {private} (keep it secret), public key {public}")
    if args.bundle_dir and args.key is None:
        raise UserError("give --key PRIVATE_KEY.pem to sign with")
    if not args.bundle_dir and args.new_key is None:
        raise UserError("give bundle folders and --key, or --new-key DIR")
    for bundle in args.bundle_dir:
        print(f"signed {bundle}: {sign_bundle(bundle, args.key)}")
    return 0
