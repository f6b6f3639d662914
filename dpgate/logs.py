"""Logging set-up shared by the gateway, the engine and `dpgate serve`: `--log-format plain|json`.

It lives in `dpgate` because the gateway and the engine both use it and neither may import the
other. A JSON line is one object with `time` (UTC, ISO 8601, milliseconds), `level`, `logger`,
`message`, and `request_id` when the line belongs to a call, plus the call fields below when the
record carries them. The request id comes from the record (`extra={"request_id": ...}`, what the
callback-driven gateway passes) or else from `request_id_var`, which the engine's per-call tasks
set, so every line a handler logs carries its call's id without passing it down.

A server logging one line per call (the gateway's access log) can ask for `batch_writes`: lines
logged on an event loop's thread go out in one write at the end of the loop's iteration instead
of one write (and flush) each; a line from any other thread writes what is waiting at once, so
the order is kept. At 2,000 calls/s the per-line write was the gateway's most frequent system
call (issue 27). Both formatters keep the time's text for the current second, since formatting
the same second again is most of what a line's time costs.

A line that frequent can also skip the LogRecord: where a logger's records reach nothing but one
batched handler with one of these formatters (no filters on the way, what `configure_logging`
sets up), `lone_batched_handler` returns that handler, and `emit_fields` writes the
very text `format(record)` would, for a sixth of the CPU (making, routing and formatting a record
was 8% of the gateway's CPU per unary call). Anywhere else (a test's capture handler, a second
handler, a filter) the caller makes a record as usual.
"""

from __future__ import annotations

import asyncio
import datetime
import json
import logging
import sys
import threading
import time
from contextvars import ContextVar

LOG_FORMATS = ("plain", "json")
request_id_var: ContextVar[str | None] = ContextVar("dpgate_request_id", default=None)
# Per-call fields a record may carry (as `extra`); JSON lines give each its own key.
CALL_FIELDS = ("rpc", "code", "data_parallel_rank", "duration_ms", "num_prompt_tokens", "num_generated_tokens")


def record_request_id(record: logging.LogRecord) -> str | None:
    return getattr(record, "request_id", None) or request_id_var.get()


class JsonFormatter(logging.Formatter):
    """One JSON object a line (see the module docstring for its keys)."""

    def __init__(self) -> None:
        super().__init__()
        self._second = -1
        self._second_text = ""

    def _utc_time(self, created: float) -> str:
        """`2026-12-02T13:50:20.123Z`; the text up to the second is made once per second."""
        second = int(created)
        if second != self._second:
            moment = datetime.datetime.fromtimestamp(second, datetime.UTC)
            self._second, self._second_text = second, moment.strftime("%Y-%m-%dT%H:%M:%S")
        return f"{self._second_text}.{int((created - second) * 1000):03d}Z"

    def _entry(self, created: float, level_name: str, logger_name: str, message: str, request_id: str | None):
        entry: dict[str, object] = {
            "time": self._utc_time(created),
            "level": level_name.lower(),
            "logger": logger_name,
            "message": message,
        }
        if request_id is not None:
            entry["request_id"] = request_id
        return entry

    def format(self, record: logging.LogRecord) -> str:
        request_id = record_request_id(record)
        entry = self._entry(record.created, record.levelname, record.name, record.getMessage(), request_id)
        for name in CALL_FIELDS:
            value = getattr(record, name, None)
            if value is not None:
                entry[name] = value
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry)

    def format_line(
        self, created: float, level_name: str, logger_name: str, message: str, fields: dict[str, object]
    ) -> str:
        """What `format` makes of a record without an exception whose `extra` is `fields`."""
        request_id = fields.get("request_id")
        entry = self._entry(created, level_name, logger_name, message, request_id or request_id_var.get())
        for name in CALL_FIELDS:
            value = fields.get(name)
            if value is not None:
                entry[name] = value
        return json.dumps(entry)


class PlainFormatter(logging.Formatter):
    """`time level logger: message`, with ` request_id=ID` appended when the line belongs to a call."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")
        self._second = -1
        self._second_text = ""

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        """What logging.Formatter writes (`2026-12-02 13:50:20,123`, local time), the second's text made once."""
        if datefmt:
            return super().formatTime(record, datefmt)
        second = int(record.created)
        if second != self._second:
            self._second, self._second_text = second, time.strftime(self.default_time_format, self.converter(second))
        return self.default_msec_format % (self._second_text, record.msecs)

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        request_id = record_request_id(record)
        if request_id is None:
            return line
        head, newline, rest = line.partition("\n")  # keep the id on the message's line, not a traceback's
        return f"{head} request_id={request_id}{newline}{rest}"

    def format_line(
        self, created: float, level_name: str, logger_name: str, message: str, fields: dict[str, object]
    ) -> str:
        """What `format` makes of a record without an exception whose `extra` is `fields`."""
        second = int(created)
        if second != self._second:
            self._second, self._second_text = second, time.strftime(self.default_time_format, self.converter(second))
        moment = self.default_msec_format % (self._second_text, int((created - second) * 1000))
        request_id = fields.get("request_id") or request_id_var.get()
        if request_id is None:
            return f"{moment} {level_name} {logger_name}: {message}"
        return f"{moment} {level_name} {logger_name}: {message} request_id={request_id}"


class BatchedStreamHandler(logging.StreamHandler):
    """A StreamHandler whose lines logged on an event loop's thread leave in one write per loop
    iteration (see the module docstring). `flush` writes what waits; logging.shutdown calls it at
    exit, so a process that ends normally loses no line."""

    def __init__(self, stream=None) -> None:
        super().__init__(stream)
        self._waiting: list[str] = []
        self._flush_loop: asyncio.AbstractEventLoop | None = None  # where a flush waits to run
        self._loop_seen: asyncio.AbstractEventLoop | None = None  # the last loop a line came from,
        self._loop_thread = 0  # on this thread

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.emit_line(self.format(record))
        except RecursionError:
            raise
        except Exception:
            self.handleError(record)

    def emit_fields(
        self, created: float, level_name: str, logger_name: str, message: str, fields: dict[str, object]
    ) -> None:
        """Write the line `emit` would write for a record of these parts (its `extra`: `fields`),
        without the record; the formatter must be one of this module's (`lone_batched_handler`)."""
        formatter = self.formatter
        assert isinstance(formatter, (PlainFormatter, JsonFormatter))
        self.emit_line(formatter.format_line(created, level_name, logger_name, message, fields))

    def emit_line(self, line: str) -> None:
        """Write a formatted line (without its terminator) as `emit` writes a record's.

        The loop last seen is reused while it runs on this thread (one loop runs on a thread at a
        time): `asyncio.get_running_loop()` makes a `getpid` system call on Python 3.11, and was
        one per access line. (`with self.lock` is Handler.acquire and release without their two
        Python calls.)"""
        with self.lock:  # type: ignore[union-attr]  # (a StreamHandler always has its lock)
            self._waiting.append(line + self.terminator)
            loop = self._loop_seen
            if loop is None or self._loop_thread != threading.get_ident() or not loop.is_running():
                try:
                    loop = asyncio.get_running_loop()
                except RuntimeError:  # not on a loop's thread (or its loop has stopped): write now
                    self._write_waiting()
                    return
                self._loop_seen, self._loop_thread = loop, threading.get_ident()
            if loop is not self._flush_loop:  # none is scheduled, or on a loop that stopped before it ran
                self._flush_loop = loop
                loop.call_soon(self._flush_from_loop, loop)

    def _flush_from_loop(self, loop: asyncio.AbstractEventLoop) -> None:
        with self.lock:  # type: ignore[union-attr]
            if self._flush_loop is loop:
                self._flush_loop = None
            self._write_waiting()

    def flush(self) -> None:
        self.acquire()
        try:
            self._write_waiting()
        finally:
            self.release()

    def _write_waiting(self) -> None:
        """Write the waiting lines and flush the stream (the caller holds the lock)."""
        waiting, self._waiting = self._waiting, []
        if waiting:
            self.stream.write("".join(waiting))
        if self.stream and hasattr(self.stream, "flush"):
            self.stream.flush()


def lone_batched_handler(logger: logging.Logger, level: int) -> BatchedStreamHandler | None:
    """The handler a `level` record of `logger` would reach alone, where that is a BatchedStreamHandler
    formatting with one of this module's formatters and nothing filters the record on its way; else
    None (the record is off, or goes anywhere else too). See the module docstring."""
    if not logger.isEnabledFor(level):
        return None
    found: BatchedStreamHandler | None = None
    current: logging.Logger | None = logger
    while current is not None:
        if current.filters:
            return None
        for handler in current.handlers:
            if level < handler.level:
                continue  # (logging skips it too: an error-only handler sees no access line)
            if found is not None or type(handler) is not BatchedStreamHandler:
                return None
            found = handler
        current = current.parent if current.propagate else None
    if found is None or found.filters:
        return None
    if type(found.formatter) not in (PlainFormatter, JsonFormatter):
        return None
    return found


def configure_logging(log_format: str, level: int = logging.INFO, batch_writes: bool = False) -> None:
    """Send every logger's records (the root's handler) to stderr in `log_format` (one of LOG_FORMATS);
    `batch_writes`: one write per event-loop iteration (BatchedStreamHandler), for a server's hot path."""
    if log_format not in LOG_FORMATS:
        raise ValueError(f"log format {log_format!r} is not one of {LOG_FORMATS}")
    handler = BatchedStreamHandler(sys.stderr) if batch_writes else logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if log_format == "json" else PlainFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    logging.captureWarnings(True)  # Python warnings become records too: every line keeps the format


def add_log_format_argument(parser, default: str = "plain", deprecated_json_flag: bool = False) -> None:
    """`--log-format plain|json` (and, where it existed, `--log-json`, its deprecated spelling)."""
    parser.add_argument(
        "--log-format", choices=LOG_FORMATS, default=default, help="log lines as plain text or one JSON object a line"
    )
    if deprecated_json_flag:
        import argparse

        parser.add_argument("--log-json", dest="log_format", action="store_const", const="json", help=argparse.SUPPRESS)
