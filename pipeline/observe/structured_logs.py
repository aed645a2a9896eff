"""Structured logs: one line per event, plain or JSON, with the request's ids on it.

Every record the server logs goes through one handler on the root logger
(``setup_logging``), formatted as

* ``plain`` (default): ``2026-11-23 10:00:00,123 INFO pipeline.requests.handler: message``
  followed by `` [connection_id=... correlation_id=...]`` when the line is
  about a connection or a request (ids the message already names are not
  repeated);
* ``json``: one JSON object per line, ``{"ts": "2026-11-23T10:00:00.123Z",
  "level": "INFO", "logger": "...", "message": "...", "connection_id": ...,
  "correlation_id": ..., ...}`` plus any ``extra=`` fields of the call (start-up
  stages add ``stage`` and ``seconds``); a traceback goes in ``exc``, so even
  an exception is one line.

Request-related lines get their ids without the logging call naming them:
``log_context`` (a contextvar) holds ``(connection id, correlation id)``; a
connection's task sets the connection id (``pipeline.network.processor``), a
RequestHandler sets both while it handles a request
(``pipeline.requests.handler``), and every line logged meanwhile, by any
module, carries them (trio copies contextvars into the tasks a task starts).
An explicit ``extra={"connection_id": ...}`` wins over the context.

Start-up is quiet by default: Python warnings go to this log, third-party ones
(pyspark's deprecations, pandas) at DEBUG, ours at WARNING; py4j's INFO
chatter is dropped unless the level is DEBUG; and the standard error of the
child processes started while Spark starts (Spark's JVM, the decode worker)
comes through ``children_stderr_to_log`` as records of logger ``spark.<class>``
(Spark's log4j lines, their level kept, a stack trace joined to its line) or
``stderr`` (anything else). The one line the JVM prints that nobody can act
on, ``WARNING: Using incubator modules: jdk.incubator.vector`` (Spark's
launcher always passes ``--add-modules=jdk.incubator.vector``; the JDK has no
option to silence that warning), is logged at DEBUG.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import logging
import os
import re
import select
import sys
import threading
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, TextIO

FORMATS = ("plain", "json")
"""Values of ``log.format`` / ``--log-format``."""


@dataclass(frozen=True, slots=True)
class LogConfig:
    """How the process logs (keys ``log.level`` and ``log.format``; defined here once).

    Attributes:
        level: a ``logging`` level name (DEBUG, INFO, WARNING, ERROR, CRITICAL).
        format: ``plain`` or ``json`` (see the module docstring).
    """

    level: str = "INFO"
    format: str = "plain"


log_context: contextvars.ContextVar[tuple[str | None, int | None]] = contextvars.ContextVar(
    "log_context", default=(None, None))
"""``(connection id, correlation id)`` of what the current task is doing; None where it does not apply."""

CONTEXT_FIELDS = ("connection_id", "correlation_id")

PLAIN_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
"""The plain line (``pipeline.bench.hostile_runner`` parses it for "closing connection" lines)."""

# LogRecord attributes of every record: what is not among them came from ``extra=``.
_STANDARD_ATTRS = frozenset(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {"message", "asctime"}


class ContextFilter(logging.Filter):
    """Puts ``connection_id`` and ``correlation_id`` from ``log_context`` on every record
    that does not carry them already (``extra=``)."""

    def filter(self, record: logging.LogRecord) -> bool:
        connection_id, correlation_id = log_context.get()
        if not hasattr(record, "connection_id"):
            record.connection_id = connection_id
        if not hasattr(record, "correlation_id"):
            record.correlation_id = correlation_id
        return True


class PlainFormatter(logging.Formatter):
    """``PLAIN_FORMAT`` plus `` [connection_id=... correlation_id=...]`` for request-related lines."""

    def __init__(self) -> None:
        super().__init__(PLAIN_FORMAT)

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        message = record.getMessage()
        ids = []
        connection_id = getattr(record, "connection_id", None)
        if connection_id is not None and connection_id not in message:
            ids.append(f"connection_id={connection_id}")
        correlation_id = getattr(record, "correlation_id", None)
        if correlation_id is not None:
            ids.append(f"correlation_id={correlation_id}")
        if not ids:
            return line
        first, newline, rest = line.partition("\n")  # a traceback stays below the line
        return f"{first} [{' '.join(ids)}]{newline}{rest}"


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line: ts (UTC, ISO 8601, ms), level, logger,
    message, the context ids when set, ``extra=`` fields, ``exc`` (a traceback) if any."""

    def format(self, record: logging.LogRecord) -> str:
        ts = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z"
        event: dict[str, Any] = {"ts": ts, "level": record.levelname, "logger": record.name,
                                 "message": record.getMessage()}
        for key, value in record.__dict__.items():
            if key not in _STANDARD_ATTRS and value is not None and not key.startswith("_"):
                event[key] = value
        if record.exc_info:
            event["exc"] = self.formatException(record.exc_info)
        elif record.exc_text:
            event["exc"] = record.exc_text
        if record.stack_info:
            event["stack"] = self.formatStack(record.stack_info)
        return json.dumps(event, default=str, ensure_ascii=False)


def level_number(name: str) -> int:
    """``"info"`` -> ``logging.INFO``.

    Raises:
        ValueError: not a ``logging`` level name.
    """
    levels = logging.getLevelNamesMapping()
    number = levels.get(str(name).upper())
    if number is None or number == logging.NOTSET:
        raise ValueError(f"expected one of DEBUG, INFO, WARNING, ERROR, CRITICAL, got {name!r}")
    return number


_PACKAGE_DIR = str(Path(__file__).resolve().parent) + os.sep


def _show_warning(message: Warning | str, category: type[Warning], filename: str, lineno: int,
                  file: TextIO | None = None, line: str | None = None) -> None:
    """``warnings.showwarning``: a warning is one log line of logger ``py.warnings``; at
    WARNING when raised from this package, at DEBUG when from a third-party one (a
    user can do nothing about pyspark's deprecation notices)."""
    ours = os.path.abspath(filename).startswith(_PACKAGE_DIR)
    logging.getLogger("py.warnings").log(logging.WARNING if ours else logging.DEBUG, "%s:%d: %s: %s",
                                         filename, lineno, category.__name__, message)


class Py4jRootFilter(logging.Filter):
    """Holds the lines py4j logs through the root logger to logger ``py4j``'s level.

    py4j 0.10.9 logs one line with ``logging.info`` instead of its own logger:
    ``GatewayConnection.send_command``'s "Exception while sending command.", with the stack trace of
    the gateway closing while Spark stops (``Py4JNetworkError: Answer from Java side is empty``).
    On a clean stop that is no news, and logger ``py4j`` is at WARNING unless the level is DEBUG
    (``setup_logging``); such a record, told apart by its source file under py4j's package, passes
    only at that level or above.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        if record.name == "root" and f"{os.sep}py4j{os.sep}" in record.pathname:
            return record.levelno >= logging.getLogger("py4j").getEffectiveLevel()
        return True


def setup_logging(config: LogConfig, stream: TextIO | None = None) -> logging.Handler:
    """Configure the root logger: one handler on ``stream`` (default ``sys.stderr``) with
    the chosen format, ``ContextFilter`` and ``Py4jRootFilter``; warnings into the log; py4j at
    WARNING unless the level is DEBUG. Replaces handlers set before. Returns the handler.

    Raises:
        ValueError: an unknown level or format.
    """
    level = level_number(config.level)
    if config.format not in FORMATS:
        raise ValueError(f"expected one of {', '.join(FORMATS)}, got {config.format!r}")
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    handler.setFormatter(JsonFormatter() if config.format == "json" else PlainFormatter())
    handler.addFilter(ContextFilter())
    handler.addFilter(Py4jRootFilter())
    logging.basicConfig(level=level, handlers=[handler], force=True)
    # py4j logs every gateway connection it opens and closes at INFO.
    logging.getLogger("py4j").setLevel(logging.DEBUG if level <= logging.DEBUG else logging.WARNING)
    warnings.showwarning = _show_warning
    return handler


# -- the standard error of child processes ------------------------------------------------

_LOG4J_LINE = re.compile(
    r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} (TRACE|DEBUG|INFO|WARN|ERROR|FATAL) spark (\S+): (.*)$")
"""A line of ``pipeline/persist/log4j2.properties``'s pattern: ``%d %p spark %c{1}: %m``."""
_LOG4J_LEVELS = {"TRACE": logging.DEBUG, "DEBUG": logging.DEBUG, "INFO": logging.INFO,
                 "WARN": logging.WARNING, "ERROR": logging.ERROR, "FATAL": logging.CRITICAL}
HARMLESS_JVM_LINES = ("WARNING: Using incubator modules: jdk.incubator.vector",)
"""Lines a JVM prints that say nothing actionable: logged at DEBUG."""
HARMLESS_JVM_PREFIXES = ("Picked up JAVA_TOOL_OPTIONS:", "NOTE: Picked up JDK_JAVA_OPTIONS:")
"""Beginnings of such lines: the JVM's notice of the options the environment gave it (``JAVA_TOOL_OPTIONS``,
``JDK_JAVA_OPTIONS``), which the user set and knows of."""
_CONTINUATION_WAIT_S = 0.2
"""How long a log4j line waits for more lines of its stack trace before it is logged (s)."""


class _StderrForwarder:
    """Turns lines read from a pipe into log records (see ``children_stderr_to_log``)."""

    def __init__(self, read_fd: int) -> None:
        self._fd = read_fd
        self._pending: tuple[int, str, list[str]] | None = None  # level, logger, lines

    def run(self) -> None:
        buffer = b""
        try:
            while True:
                ready, _, _ = select.select([self._fd], [], [], _CONTINUATION_WAIT_S if self._pending else None)
                if not ready:
                    self._flush()
                    continue
                chunk = os.read(self._fd, 65536)
                if not chunk:
                    break
                buffer += chunk
                *lines, buffer = buffer.split(b"\n")
                for line in lines:
                    self._line(line.decode(errors="replace").rstrip("\r"))
            if buffer:
                self._line(buffer.decode(errors="replace"))
            self._flush()
        finally:
            os.close(self._fd)

    def _line(self, text: str) -> None:
        m = _LOG4J_LINE.match(text)
        if m is not None:
            self._flush()
            self._pending = (_LOG4J_LEVELS[m.group(1)], f"spark.{m.group(2)}", [m.group(3)])
        elif self._pending is not None and text and (text[0].isspace() or text.startswith("Caused by")
                                                     or re.match(r"^[\w.$]+(Exception|Error)\b", text)):
            self._pending[2].append(text)  # the stack trace of the log4j line before it
        elif text.strip():
            self._flush()
            harmless = text.strip() in HARMLESS_JVM_LINES or text.startswith(HARMLESS_JVM_PREFIXES)
            level = logging.DEBUG if harmless else logging.WARNING
            logging.getLogger("stderr").log(level, "%s", text)

    def _flush(self) -> None:
        if self._pending is not None:
            level, name, lines = self._pending
            self._pending = None
            logging.getLogger(name).log(level, "%s", "\n".join(lines))


@contextlib.contextmanager
def children_stderr_to_log() -> Iterator[None]:
    """While the block runs, file descriptor 2 is a pipe read into this log, so child
    processes started in the block (Spark's JVM, the decode worker) write their
    standard error into the log, for as long as they live: log4j lines as records of
    ``spark.<class>`` at their level, other lines as records of ``stderr`` at WARNING
    (``HARMLESS_JVM_LINES`` at DEBUG). This process's own ``sys.stderr`` and log
    handlers are pointed at the real standard error meanwhile, and everything is
    restored when the block ends; the children keep the pipe.
    """
    sys.stderr.flush()
    saved_fd = os.dup(2)
    read_fd, write_fd = os.pipe()
    saved = open(saved_fd, "w", buffering=1, encoding=getattr(sys.stderr, "encoding", None) or "utf-8",
                 errors="backslashreplace", closefd=False)
    old_stderr = sys.stderr
    handlers = [h for h in logging.getLogger().handlers
                if isinstance(h, logging.StreamHandler) and h.stream is old_stderr]
    forwarder = threading.Thread(target=_StderrForwarder(read_fd).run, name="children-stderr", daemon=True)
    forwarder.start()
    # This process's own writers move to the saved descriptor before fd 2 becomes the pipe, and
    # back after it is restored: lines logged meanwhile by other threads (the event loop, while
    # Spark starts beside it) never go through the pipe.
    sys.stderr = saved
    for h in handlers:
        h.setStream(saved)
    os.dup2(write_fd, 2)
    os.close(write_fd)
    try:
        yield
    finally:
        saved.flush()
        os.dup2(saved_fd, 2)
        for h in handlers:
            h.setStream(old_stderr)
        sys.stderr = old_stderr
        saved.close()
        os.close(saved_fd)
