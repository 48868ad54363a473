"""Log output of `seqserve serve`: plain text or one JSON object per line, short tracebacks.

`configure_logging(level, fmt)` sends every logger, uvicorn's included, to one stderr handler;
uvicorn's access log is off (seqserve.access writes the one line per request). The handler
(`TurnHandler`) writes the lines of one event-loop turn with one write: a write per line
was 4.5-6% of an API process's CPU under load (py-spy, one access line per request).
A record may carry `extra={"fields": {...}}`: text lines append them as `key=value`, JSON lines
as keys of the object. A traceback keeps the innermost `TRACEBACK_FRAMES` frames of each
exception in the chain, so one failing request costs one short traceback, not kilobytes.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import sys
import time
import traceback
from typing import Any

TRACEBACK_FRAMES = 8
"""Innermost frames kept per exception of a logged traceback."""
UVICORN_LOGGERS = ("uvicorn", "uvicorn.error", "uvicorn.access")
UVICORN_ACCESS = "uvicorn.access"
"""Silenced: its line per request would repeat seqserve.access's (see configure_logging)."""


def short_traceback(exc_info: Any) -> str:
    """The traceback of `exc_info` with the innermost TRACEBACK_FRAMES frames of each
    exception in its chain."""
    _, exc, _ = exc_info
    lines = traceback.format_exception(exc, limit=-TRACEBACK_FRAMES)
    return "".join(lines).rstrip("\n")


def _fields(record: logging.LogRecord) -> dict[str, Any]:
    fields = getattr(record, "fields", None)
    return fields if isinstance(fields, dict) else {}


class TextFormatter(logging.Formatter):
    """`time level logger: message key=value ...` with short tracebacks."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")
        self._second: tuple[int, str] = (-1, "")
        """The last whole second formatted (`formatTime`) and its text."""

    def format(self, record: logging.LogRecord) -> str:
        if record.exc_info or record.stack_info:  # logging's own, with the short traceback
            cached, record.exc_text = record.exc_text, None  # another handler's long format
            try:
                line = super().format(record)
            finally:
                record.exc_text = cached
        else:  # the same line as logging's format, without its generic machinery (measured:
            # a third of an access-log line's cost)
            record.message = record.getMessage()
            record.asctime = self.formatTime(record)
            line = f"{record.asctime} {record.levelname} {record.name}: {record.message}"
        extra = " ".join(f"{k}={_text(v)}" for k, v in _fields(record).items())
        if not extra:
            return line
        head, sep, rest = line.partition("\n")  # a traceback goes after the fields
        return f"{head} {extra}{sep}{rest}"

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:  # noqa: N802
        """logging's default time text (local time, `,` and milliseconds), the seconds part
        computed once per second."""
        if datefmt is not None:
            return super().formatTime(record, datefmt)
        second = int(record.created)
        if self._second[0] != second:
            self._second = (second, time.strftime(self.default_time_format,
                                                  self.converter(record.created)))
        return f"{self._second[1]},{int(record.msecs):03d}"  # default_msec_format

    def formatException(self, ei: Any) -> str:  # noqa: N802 (logging's name)
        return short_traceback(ei)


QUOTED = re.compile(r'[\s"=]')
"""A field value with one of these characters (or an empty one) is written as a JSON string
(`\\s` is `str.isspace`'s set)."""


def _text(value: Any) -> str:
    text = value if type(value) is str else str(value)
    return json.dumps(text) if not text or QUOTED.search(text) else text


class JsonFormatter(logging.Formatter):
    """One JSON object per record: time, level, logger, message, the record's fields and, when
    an exception is attached, `traceback` (short)."""

    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {
            "time": _iso(record.created),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
            **_fields(record),
        }
        if record.exc_info:
            doc["traceback"] = short_traceback(record.exc_info)
        return json.dumps(doc, ensure_ascii=False, default=str)


def _iso(created: float) -> str:
    millis = int(created * 1000) % 1000
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(created)) + f".{millis:03d}Z"


class TurnHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """A stream handler that writes the records of one event-loop turn together: a record
    logged on a thread running an event loop waits for the end of the turn (`call_soon`),
    joined with the others of that turn into one write; a warning or worse, a record of a
    thread without a loop, and `flush()` (logging's at exit) write at once, after what
    waits, so the order of the lines is the order of the records. Lost on a SIGKILL: at
    most one turn's lines."""

    def __init__(self, stream: Any = None) -> None:
        super().__init__(stream)
        self._pending: list[str] = []
        self._scheduled = False

    def emit(self, record: logging.LogRecord) -> None:  # called under self.lock
        try:
            self._pending.append(self.format(record) + self.terminator)
        except Exception:
            self.handleError(record)
            return
        loop = asyncio._get_running_loop()
        if loop is None or record.levelno >= logging.WARNING:
            self._write()
        elif not self._scheduled:
            self._scheduled = True
            loop.call_soon(self._turn_ended)

    def _turn_ended(self) -> None:
        with self.lock:  # type: ignore[union-attr]
            self._scheduled = False
            self._write()

    def _write(self) -> None:
        if not self._pending:
            return
        text, self._pending = "".join(self._pending), []
        try:
            self.stream.write(text)
            self.stream.flush()
        except Exception:  # logging's rule: a broken stream never breaks the caller
            self.handleError(logging.makeLogRecord({"msg": text}))

    def flush(self) -> None:
        with self.lock:  # type: ignore[union-attr]
            self._write()
        super().flush()


def configure_logging(level: str, fmt: str) -> None:
    """Every logger to one stderr handler in `fmt` ("text" or "json"). Call it after uvicorn's
    Config exists: that configures uvicorn's own loggers, which this then redirects here."""
    handler = TurnHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    root.handlers = [handler]
    root.setLevel(level.upper())
    for name in UVICORN_LOGGERS:
        logger = logging.getLogger(name)
        logger.handlers = []
        logger.propagate = name != UVICORN_ACCESS
    # seqserve.access writes the one line per request; uvicorn's own access line would repeat
    # it. Without a handler on the way up, uvicorn does not even format its line
    # (its protocols check `access_logger.hasHandlers()` per connection).
