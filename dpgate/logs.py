"""Logging set-up shared by the gateway, the engine and `dpgate serve`: `--log-format plain|json`.

It lives in `dpgate` because the gateway and the engine both use it and neither may import the
other. A JSON line is one object with `time` (UTC, ISO 8601, milliseconds), `level`, `logger`,
`message`, and `request_id` when the line belongs to a call, plus the call fields below when the
record carries them. The request id comes from the record (`extra={"request_id": ...}`, what the
callback-driven gateway passes) or else from `request_id_var`, which the engine's per-call tasks
set, so every line a handler logs carries its call's id without passing it down.
"""

from __future__ import annotations

import datetime
import json
import logging
import sys
from contextvars import ContextVar

LOG_FORMATS = ("plain", "json")
request_id_var: ContextVar[str | None] = ContextVar("dpgate_request_id", default=None)
# Per-call fields a record may carry (as `extra`); JSON lines give each its own key.
CALL_FIELDS = ("rpc", "code", "data_parallel_rank", "duration_ms", "num_prompt_tokens", "num_generated_tokens")


def record_request_id(record: logging.LogRecord) -> str | None:
    return getattr(record, "request_id", None) or request_id_var.get()


class JsonFormatter(logging.Formatter):
    """One JSON object a line (see the module docstring for its keys)."""

    def format(self, record: logging.LogRecord) -> str:
        moment = datetime.datetime.fromtimestamp(record.created, datetime.UTC)
        entry: dict[str, object] = {
            "time": moment.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        request_id = record_request_id(record)
        if request_id is not None:
            entry["request_id"] = request_id
        for name in CALL_FIELDS:
            value = getattr(record, name, None)
            if value is not None:
                entry[name] = value
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry)


class PlainFormatter(logging.Formatter):
    """`time level logger: message`, with ` request_id=ID` appended when the line belongs to a call."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        request_id = record_request_id(record)
        if request_id is None:
            return line
        head, newline, rest = line.partition("\n")  # keep the id on the message's line, not a traceback's
        return f"{head} request_id={request_id}{newline}{rest}"


def configure_logging(log_format: str, level: int = logging.INFO) -> None:
    """Send every logger's records (the root's handler) to stderr in `log_format` (one of LOG_FORMATS)."""
    if log_format not in LOG_FORMATS:
        raise ValueError(f"log format {log_format!r} is not one of {LOG_FORMATS}")
    handler = logging.StreamHandler(sys.stderr)
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
