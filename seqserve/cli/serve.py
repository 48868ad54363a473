"""`seqserve serve`: serve a model repository over HTTP (never imports torch on ONNX).

The flags are generated from the `Settings` fields: one `--flag` per field (its name with
dashes), its description as help, its default shown, and its `SEQSERVE_<FIELD>` variable
named. Only flags given on the command line override the environment.
"""

from __future__ import annotations

import argparse
import typing

NAME = "serve"
HELP = "Serve a model repository over HTTP (classify, translate, tag, KServe v2, /metrics)."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from seqserve.service.web.settings import Settings

    for name, field in Settings.model_fields.items():
        flag = "--" + name.replace("_", "-")
        shown = field.default if field.default_factory is None else "[]"
        help_text = (f"{(field.description or '').strip()} "
                     f"[default: {shown}; env SEQSERVE_{name.upper()}]")
        help_text = help_text.replace("%", "%%")
        kind, choices = _flag_type(field.annotation)
        extra = field.json_schema_extra
        if isinstance(extra, dict) and extra.get("repeatable"):
            parser.add_argument(flag, action="append", default=None, help=help_text,
                                metavar=name.upper())
        elif kind is bool:
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=None,
                                help=help_text)
        else:
            parser.add_argument(flag, type=kind, choices=choices, default=None, help=help_text,
                                metavar=None if choices else name.upper())


def _flag_type(annotation: typing.Any) -> tuple[typing.Any, list[str] | None]:
    """argparse type and choices of a Settings field (lists come as comma-separated text)."""
    if typing.get_origin(annotation) is typing.Annotated:
        annotation = typing.get_args(annotation)[0]
    if typing.get_origin(annotation) is typing.Literal:
        return str, [str(a) for a in typing.get_args(annotation)]
    if annotation in (bool, int, float):
        return annotation, None
    return str, None


def settings_from_args(args: argparse.Namespace) -> typing.Any:
    """Settings from the environment with the given flags on top."""
    from pydantic import ValidationError

    from seqserve.models.errors import UserError
    from seqserve.service.web.settings import Settings

    given = {k: getattr(args, k) for k in Settings.model_fields
             if getattr(args, k, None) is not None}
    try:
        return Settings(**given)
    except ValidationError as exc:
        raise UserError(f"invalid serve settings: {exc}") from exc


def run(args: argparse.Namespace) -> int:
    return serve(settings_from_args(args),
                 cli={k for k in vars(args) if getattr(args, k, None) is not None})


def serve(settings: typing.Any, cli: typing.Iterable[str] = ()) -> int:
    """Serve until SIGTERM/SIGINT, then drain admitted work (also used by `seqserve demo`):
    a supervisor with API processes and an engine process, or one process (--api-workers 0).
    `cli`: the fields given as flags (the start-up block says where each setting came from)."""
    import json
    import logging

    from seqserve.models.errors import UserError
    from seqserve.service.server import layout

    if not settings.repo.is_dir():
        raise UserError(f"{settings.repo}: model repository folder does not exist")
    process = settings.process_settings()
    process.apply()  # every process of the server applies the same (the engine's: its options)
    origin = layout.sources(settings, cli)
    before, settings = settings, layout.resolve(settings)
    print_speed_settings(settings, layout.resolved_sources(before, settings, origin))
    log = logging.getLogger("seqserve")
    log.info("settings: %s", json.dumps(settings.effective(), sort_keys=True))
    from seqserve.service.web.auth import secret_warnings

    for warning in secret_warnings(settings):  # once, here: weak, never refused
        log.warning("%s", warning)
    if settings.api_workers:
        from seqserve.service.server.supervisor import Supervisor

        return Supervisor(settings).run()
    from seqserve.service.server.app import create_app
    from seqserve.service.server.shutdown import build_server

    app = create_app(settings, freeze=True)
    server = build_server(app, app.state.seqserve)
    process.apply()  # again: uvicorn's Config set up its own loggers
    server.run()
    return 0


def print_speed_settings(settings: typing.Any, origin: typing.Mapping[str, str]) -> None:
    """The start-up block on stderr whatever the log level (one JSON line with
    --log-format json): the speed settings in force and where each came from."""
    import logging
    import sys

    from seqserve.service.core.logs import JsonFormatter
    from seqserve.service.server import layout

    if settings.log_format == "json":
        record = logging.LogRecord("seqserve", logging.INFO, __file__, 0, "serving settings",
                                   None, None)
        record.fields = {"layout": layout.describe(settings),
                         "decoders": layout.decoders(settings),
                         "settings": {n: {"value": getattr(settings, n), "source": origin[n]}
                                      for n in layout.SPEED_SETTINGS}}
        print(JsonFormatter().format(record), file=sys.stderr, flush=True)
    else:
        print(layout.speed_block(settings, origin), file=sys.stderr, flush=True)
