"""dpgate/logs.py: the JSON and plain line formats, the request id from the record or the context."""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import io
import json
import logging
import re
import sys

import pytest

from dpgate.logs import (
    BatchedStreamHandler,
    JsonFormatter,
    PlainFormatter,
    configure_logging,
    lone_batched_handler,
    request_id_var,
)


def record(message: str = "hello %s", *args, **extra) -> logging.LogRecord:
    made = logging.LogRecord("dpgate.test", logging.WARNING, __file__, 1, message, args or ("world",), None)
    made.__dict__.update(extra)
    return made


def test_a_json_line_has_the_keys_and_the_call_fields():
    line = json.loads(JsonFormatter().format(record(request_id="r-1", rpc="Generate", code="OK", duration_ms=1.5)))
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", line.pop("time"))
    assert line == {
        "level": "warning",
        "logger": "dpgate.test",
        "message": "hello world",
        "request_id": "r-1",
        "rpc": "Generate",
        "code": "OK",
        "duration_ms": 1.5,
    }


def test_the_request_id_comes_from_the_context_when_the_record_has_none():
    assert "request_id" not in json.loads(JsonFormatter().format(record()))
    token = request_id_var.set("from-context")
    try:
        assert json.loads(JsonFormatter().format(record()))["request_id"] == "from-context"
        assert json.loads(JsonFormatter().format(record(request_id="own")))["request_id"] == "own"
    finally:
        request_id_var.reset(token)


def test_an_exception_stays_inside_its_one_json_line():
    try:
        raise ValueError("boom")
    except ValueError:
        made = record(exc_info=sys.exc_info())
    text = JsonFormatter().format(made)
    assert "\n" not in text and "ValueError: boom" in json.loads(text)["exception"]


def test_a_plain_line_names_the_request_id_on_the_message_line():
    try:
        raise ValueError("boom")
    except ValueError:
        made = record(request_id="r-2", exc_info=sys.exc_info())
    first, *rest = PlainFormatter().format(made).splitlines()
    assert first.endswith("WARNING dpgate.test: hello world request_id=r-2")
    assert rest[0].startswith("Traceback") and "r-2" not in "".join(rest)


def test_configure_logging_sets_the_root_handler_and_refuses_unknown_formats():
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    try:
        configure_logging("json")
        assert [type(h.formatter) for h in root.handlers] == [JsonFormatter]
        with pytest.raises(ValueError, match="log format 'xml' is not one of"):
            configure_logging("xml")
    finally:
        root.handlers[:], level = saved
        root.setLevel(level)
        logging.captureWarnings(False)


def test_the_cached_second_gives_the_same_time_text_as_logging_itself():
    for created in (1_700_000_000.0, 1_700_000_000.999, 1_700_000_001.5, 1_700_000_000.25):
        made = record()
        made.created, made.msecs = created, int((created - int(created)) * 1000)
        expected = logging.Formatter().formatTime(made)
        assert PlainFormatter().formatTime(made) == expected
        assert PlainFormatter().format(made).startswith(expected + " WARNING dpgate.test: hello world")
        moment = datetime.datetime.fromtimestamp(created, datetime.UTC).isoformat(timespec="milliseconds")
        assert json.loads(JsonFormatter().format(made))["time"] == moment.replace("+00:00", "Z")


def test_batched_lines_on_a_loop_leave_in_one_write_at_the_end_of_the_iteration_in_order():
    class Stream(io.StringIO):
        def __init__(self) -> None:
            super().__init__()
            self.writes: list[str] = []

        def write(self, text: str) -> int:
            self.writes.append(text)
            return super().write(text)

    stream = Stream()
    handler = BatchedStreamHandler(stream)
    handler.setFormatter(logging.Formatter("%(message)s"))

    async def log_on_the_loop() -> None:
        for n in range(3):
            handler.handle(record("line %s", n))
        assert stream.writes == []  # nothing yet: the lines wait for the end of the iteration
        await asyncio.sleep(0)
        assert stream.writes == ["line 0\nline 1\nline 2\n"]
        handler.handle(record("line %s", 3))
        handler.flush()  # what logging.shutdown does at exit: nothing waits after it
        assert stream.writes[-1] == "line 3\n"

    asyncio.run(log_on_the_loop())
    handler.handle(record("off the loop %s", 4))  # no loop on this thread: written at once
    assert stream.getvalue() == "line 0\nline 1\nline 2\nline 3\noff the loop 4\n"

    def log_and_stop() -> None:
        handler.handle(record("last on the loop %s", 5))
        loop.stop()  # the loop ends with this iteration: the flush it scheduled never runs

    loop = asyncio.new_event_loop()
    loop.call_soon(log_and_stop)
    loop.run_forever()
    loop.close()
    assert stream.getvalue().endswith("off the loop 4\n")
    handler.handle(record("after the loop %s", 6))  # still written at once, the waiting line first
    assert stream.getvalue().endswith("off the loop 4\nlast on the loop 5\nafter the loop 6\n")

    async def log_on_a_new_loop() -> None:
        handler.handle(record("stranded on %s", "a stopped loop"))
        loop.stop()  # its flush never runs: the next loop on this thread must schedule its own

    loop = asyncio.new_event_loop()
    loop.run_until_complete(log_on_a_new_loop())
    loop.close()

    async def log_on_the_next_loop() -> None:
        handler.handle(record("on the next %s", "loop"))
        await asyncio.sleep(0)
        assert stream.getvalue().endswith("stranded on a stopped loop\non the next loop\n")

    asyncio.run(log_on_the_next_loop())


@pytest.mark.parametrize("formatter_type", [PlainFormatter, JsonFormatter])
@pytest.mark.parametrize("fields", [
    {"request_id": "r-9", "rpc": "Generate", "code": "OK", "duration_ms": 1.234, "data_parallel_rank": 1},
    {"rpc": "GenerateStream", "code": "UNAVAILABLE", "duration_ms": 0.5},
    {},
])  # fmt: skip
@pytest.mark.parametrize("context_id", [None, "from-context"])
def test_a_line_formatted_from_its_parts_is_the_records_line(formatter_type, fields, context_id):
    token = request_id_var.set(context_id)
    try:
        for created in (1_700_000_000.0, 1_700_000_000.999, 1_700_000_001.5, 1_700_000_000.25):
            made = logging.LogRecord("dpgate.gateway.access", logging.INFO, "f", 1, "%s in %.1f ms", ("x", 2.25), None)
            made.__dict__.update(fields)
            made.created, made.msecs = created, int((created - int(created)) * 1000)
            formatter = formatter_type()
            parts = formatter.format_line(created, "INFO", "dpgate.gateway.access", "x in 2.2 ms", fields)
            assert parts == formatter.format(made)
    finally:
        request_id_var.reset(token)


@contextlib.contextmanager
def only_a_batched_handler():
    """The root's handlers as configure_logging(batch_writes=True) leaves them, restored after. (Inside
    the test: pytest adds its capture handlers to the root around each test's call.)"""
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    handler = BatchedStreamHandler(io.StringIO())
    handler.setFormatter(PlainFormatter())
    root.handlers[:] = [handler]
    root.setLevel(logging.INFO)
    try:
        yield handler
    finally:
        root.handlers[:], level = saved
        root.setLevel(level)


def test_the_lone_batched_handler_is_found_only_where_a_record_would_reach_it_alone():
    with only_a_batched_handler() as lone_handler:
        check_where_the_lone_handler_is_found(lone_handler)


def check_where_the_lone_handler_is_found(lone_handler: BatchedStreamHandler) -> None:
    logger = logging.getLogger("dpgate.test.lone")
    assert lone_batched_handler(logger, logging.INFO) is lone_handler
    assert lone_batched_handler(logger, logging.DEBUG) is None  # the record is off

    second = logging.StreamHandler(io.StringIO())
    logger.addHandler(second)  # what a test's capture handler does
    assert lone_batched_handler(logger, logging.INFO) is None
    logger.removeHandler(second)

    class DropAll(logging.Filter):
        def filter(self, record: logging.LogRecord) -> bool:
            return False

    for filtered in (logger, logging.getLogger("dpgate.test"), lone_handler):
        dropping = DropAll()
        filtered.addFilter(dropping)
        assert lone_batched_handler(logger, logging.INFO) is None
        filtered.removeFilter(dropping)

    lone_handler.setLevel(logging.WARNING)
    assert lone_batched_handler(logger, logging.INFO) is None
    lone_handler.setLevel(logging.NOTSET)

    errors_only = logging.StreamHandler(io.StringIO())
    errors_only.setLevel(logging.ERROR)  # a handler logging skips for an INFO record
    logger.addHandler(errors_only)
    assert lone_batched_handler(logger, logging.INFO) is lone_handler
    assert lone_batched_handler(logger, logging.ERROR) is None
    logger.removeHandler(errors_only)

    lone_handler.setFormatter(logging.Formatter("%(message)s"))  # a format this module did not make
    assert lone_batched_handler(logger, logging.INFO) is None
    lone_handler.setFormatter(JsonFormatter())
    assert lone_batched_handler(logger, logging.INFO) is lone_handler

    logger.propagate = False  # the records stop at a logger without handlers: logging's last resort
    try:
        assert lone_batched_handler(logger, logging.INFO) is None
    finally:
        logger.propagate = True
    assert lone_batched_handler(logger, logging.INFO) is lone_handler


def test_a_line_emitted_from_its_parts_waits_for_the_iteration_like_a_records():
    lone_handler = BatchedStreamHandler(io.StringIO())
    lone_handler.setFormatter(PlainFormatter())

    async def log_both() -> None:
        lone_handler.emit_fields(1_700_000_000.5, "INFO", "dpgate.test", "from parts", {"request_id": "p-1"})
        lone_handler.handle(record("from a %s", "record"))
        assert lone_handler.stream.getvalue() == ""
        await asyncio.sleep(0)

    asyncio.run(log_both())
    first, second = lone_handler.stream.getvalue().splitlines()
    assert first.endswith(" INFO dpgate.test: from parts request_id=p-1")
    assert second.endswith(" WARNING dpgate.test: from a record")
