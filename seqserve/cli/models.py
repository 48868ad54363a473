"""`seqserve models list|load|unload --url URL`: the model control of a running server.

What `/v1/admin/models` answers (the same table as Triton's repository index): `list`
prints one line per model version (name, version, state, reason), tab-separated; `load NAME`
returns once every version the model's policy serves is ready in every process of the
server (or says why not); `unload NAME` once the model is out of every process (explicit
mode). The API key comes from `--api-key` or SEQSERVE_API_KEY.
"""

from __future__ import annotations

import argparse
import os
import sys

NAME = "models"
HELP = "List, load or unload the models of a running server (its model control)."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", choices=["list", "load", "unload"],
                        help="list every model version and its state; load or unload a model")
    parser.add_argument("model", nargs="?", metavar="NAME", help="the model (load, unload)")
    parser.add_argument("--url", default="http://127.0.0.1:8000",
                        help="the server's base URL [default: %(default)s]")
    parser.add_argument("--api-key", default=None,
                        help="the server's API key [default: env SEQSERVE_API_KEY]")
    parser.add_argument("--timeout", type=float, default=600.0,
                        help="seconds to wait for a load (warm-up included) [default: "
                             "%(default)s]")


def run(args: argparse.Namespace) -> int:
    import httpx

    from seqserve.models.errors import UserError

    if args.action != "list" and not args.model:
        raise UserError(f"models {args.action} needs the model's NAME")
    key = args.api_key or os.environ.get("SEQSERVE_API_KEY")
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    base = args.url.rstrip("/") + "/v1/admin/models"
    try:
        with httpx.Client(headers=headers, timeout=args.timeout) as client:
            if args.action == "list":
                r = client.get(base)
            else:
                r = client.post(f"{base}/{args.model}/{args.action}")
    except httpx.HTTPError as exc:
        raise UserError(f"{args.url}: {type(exc).__name__}: {exc}") from exc
    if r.status_code != 200:
        try:
            why = r.json().get("error", r.text)
        except ValueError:
            why = r.text
        print(f"error: {r.status_code}: {why}", file=sys.stderr)
        return 1
    if args.action == "list":
        for m in r.json()["models"]:
            print("\t".join([m["name"], m["version"] or "-", m["state"], m["reason"]]).rstrip())
    else:
        print(f"{args.model}: {args.action}ed")
    return 0
