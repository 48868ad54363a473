"""`seqserve serve`: serve a model repository over HTTP (never imports torch on ONNX)."""

from __future__ import annotations

import argparse
import typing

NAME = "serve"
HELP = "Serve a model repository over HTTP (classify, translate, KServe v2, /metrics)."

# flag -> (type, help); every flag is also the SEQSERVE_<FLAG> environment variable.
OPTIONS: dict[str, tuple[typing.Any, str]] = {
    "repo": (str, "model repository folder (NAME/VERSION/ bundles)"),
    "host": (str, "address to bind"),
    "port": (int, "port to bind"),
    "runtime": (["onnx", "torchscript"], "graph runtime"),
    "device": (["cpu", "cuda"], "device (picks the default ONNX provider list)"),
    "providers": (str, "comma-separated ONNX Runtime providers in order"),
    "intra_op_threads": (int, "threads inside one operator (0 = default)"),
    "inter_op_threads": (int, "threads across operators (0 = default)"),
    "max_batch_size": (int, "most rows per batch"),
    "max_batch_tokens": (int, "padded-token budget per batch (rows x longest row)"),
    "max_wait_ms": (float, "longest a batch waits to fill"),
    "batch_overhead_tokens": (float, "batch start cost in padded tokens (length grouping)"),
    "queue_size": (int, "most texts waiting per model (beyond: 429)"),
    "request_timeout_s": (float, "per-request deadline (beyond: 504)"),
    "drain_timeout_s": (float, "on SIGTERM, time allowed for admitted work"),
    "shutdown_delay_s": (float, "on SIGTERM, time answering 503 before closing the listener"),
    "retry_after_s": (int, "Retry-After seconds on 429/503"),
    "max_texts": (int, "most texts per request"),
    "max_chars": (int, "most characters per text"),
    "max_tokens": (int, "most tokens per text"),
    "max_body_bytes": (int, "largest request body"),
    "max_live_hypotheses": (int, "translators: most live beam hypotheses per step"),
    "decode_groups": (int, "translators: decoder-step groups that take turns (1 = one)"),
    "log_level": (str, "log level"),
    "switch_interval_ms": (float, "GIL switch interval of the server process"),
}
FLAGS_BOOL = {
    "truncate": "truncate texts over max_tokens instead of rejecting them",
    "warmup": "warm each model up over its length buckets before ready",
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    for name, (kind, text) in OPTIONS.items():
        flag = "--" + name.replace("_", "-")
        env = f"SEQSERVE_{name.upper()}"
        if isinstance(kind, list):
            parser.add_argument(flag, choices=kind, default=None, help=f"{text} [{env}]")
        else:
            parser.add_argument(flag, type=kind, default=None, help=f"{text} [{env}]")
    for name, text in FLAGS_BOOL.items():
        parser.add_argument(
            "--" + name, action=argparse.BooleanOptionalAction, default=None,
            help=f"{text} [SEQSERVE_{name.upper()}]",
        )


def settings_from_args(args: argparse.Namespace) -> typing.Any:
    """Settings from the environment with the given flags on top."""
    from pydantic import ValidationError

    from models.errors import UserError
    from service.settings import Settings

    given = {k: getattr(args, k) for k in [*OPTIONS, *FLAGS_BOOL] if getattr(args, k, None)
             is not None}
    try:
        return Settings(**given)
    except ValidationError as exc:
        raise UserError(f"invalid serve settings: {exc}") from exc


def run(args: argparse.Namespace) -> int:
    return serve(settings_from_args(args))


def serve(settings: typing.Any) -> int:
    """Serve until SIGTERM/SIGINT, then drain admitted work (also used by `seqserve demo`)."""
    import logging
    import sys

    from models.errors import UserError
    from service.app import create_app
    from service.shutdown import build_server

    if not settings.repo.is_dir():
        raise UserError(f"{settings.repo}: model repository folder does not exist")
    logging.basicConfig(
        level=settings.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    sys.setswitchinterval(settings.switch_interval_ms / 1000.0)  # process-wide: set here only
    app = create_app(settings)
    server = build_server(app, app.state.seqserve)
    server.run()
    return 0
