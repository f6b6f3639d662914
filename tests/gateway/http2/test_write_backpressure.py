"""The transport's backpressure reaches the engine (issue 22, item 9): a stream's sent bytes count
(its `on_sent`, which returns the engine's flow-control credit) only once they left through a
transport that is not paused. Before, credit went back when the bytes were queued, so a client
that never read made the gateway buffer 455 MB for 96 s while the engine kept sending."""

from __future__ import annotations

import asyncio

import pytest

from gateway.http2 import frames as f
from gateway.http2.stream import Stream
from tests.gateway.http2.test_units import Recorder, request_block, settle, wired


class CountingStream(Recorder):
    def __init__(self, connection) -> None:
        super().__init__(connection)
        self.sent = 0

    def on_sent(self, num_bytes: int) -> None:
        self.sent += num_bytes


def open_stream(client, stream_type: type[CountingStream]) -> CountingStream:
    """A request stream of `stream_type` opened on `client` (its headers sent)."""
    stream = stream_type(client)
    client.add_stream(stream, 1)
    client.send_headers(stream, request_block(b"/x"))
    return stream


class SteppedStream(CountingStream):
    """A relaying owner's stream: it hears of its sent bytes in steps (as a client's call does)."""

    sent_step = 100

    def __init__(self, connection) -> None:
        super().__init__(connection)
        self.reports: list[int] = []

    def on_sent(self, num_bytes: int) -> None:
        super().on_sent(num_bytes)
        self.reports.append(num_bytes)


def test_sent_bytes_count_only_while_the_transport_takes_them():
    async def run() -> None:
        client, server = await wired()
        server.write(f.pack_settings({f.SETTINGS_INITIAL_WINDOW_SIZE: 1 << 20}))
        server.write(f.pack_window_update(0, 1 << 20))
        await settle()
        stream = open_stream(client, CountingStream)
        client.pause_writing()  # the socket's buffer is over its high-water mark
        client.send_data(stream, b"d" * 1000)
        await settle()
        assert stream.sent == 0, "credit returned while the transport was paused"
        client.resume_writing()
        await settle()
        assert stream.sent == 1000
        client.send_data(stream, b"e" * 10)
        await settle()
        assert stream.sent == 1010

    asyncio.run(run())


@pytest.mark.parametrize("stream_type", [CountingStream, SteppedStream])
def test_streams_reset_while_paused_do_not_hear_of_bytes_later(stream_type: type[CountingStream]):
    async def run() -> None:
        client, _server = await wired()
        stream = open_stream(client, stream_type)
        client.pause_writing()
        client.send_data(stream, b"d" * 300)  # past either stream's step: the stream waits for credit
        client.reset_stream(stream)
        client.resume_writing()
        await settle()
        assert isinstance(stream, Stream) and stream.sent == 0

    asyncio.run(run())


def test_a_stepped_stream_hears_once_a_step_of_its_bytes_left():
    async def run() -> None:
        client, _server = await wired()
        stream = open_stream(client, SteppedStream)
        client.send_data(stream, b"a" * 60)
        await settle()
        assert stream.reports == [], "heard of fewer bytes than its step"
        client.send_data(stream, b"b" * 30)
        client.send_data(stream, b"c" * 30)  # crosses the step
        client.send_data(stream, b"d" * 5)  # queued in the same write: it left with the rest
        await settle()
        assert stream.reports == [125]
        client.pause_writing()
        client.send_data(stream, b"e" * 150)
        await settle()
        assert stream.reports == [125], "credit returned while the transport was paused"
        client.resume_writing()
        assert stream.reports == [125, 150]
        client.send_data(stream, b"f" * 99)
        await settle()
        assert stream.sent == 275, "a remainder below the step is not reported"

    asyncio.run(run())
