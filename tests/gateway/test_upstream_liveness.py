"""A silent engine connection is dropped by `check_alive`; one that answers PING is kept.

Real sockets on 127.0.0.1: the peer is a bare asyncio protocol that either never writes (a host
whose link went dead after the connection was made) or sends SETTINGS and acks every PING.
"""

from __future__ import annotations

import asyncio

from gateway.http2 import frames as f
from gateway.upstream import UpstreamLink


class SilentPeer(asyncio.Protocol):
    def data_received(self, data: bytes) -> None:
        pass  # reads everything, answers nothing


class PingingPeer(asyncio.Protocol):
    """Sends its SETTINGS, then acks each PING; ignores every other frame."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        self.buffer = b""
        transport.write(f.pack_settings({}))  # type: ignore[attr-defined]

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        if self.buffer.startswith(f.PREFACE):
            self.buffer = self.buffer[len(f.PREFACE) :]
        while len(self.buffer) >= f.FRAME_HEADER_SIZE:
            high, low, frame_type, flags, _ = f.FRAME_HEADER.unpack_from(self.buffer)
            end = f.FRAME_HEADER_SIZE + ((high << 8) | low)
            if len(self.buffer) < end:
                return
            payload, self.buffer = self.buffer[f.FRAME_HEADER_SIZE : end], self.buffer[end:]
            if frame_type == f.PING and not flags & f.ACK:
                self.transport.write(f.pack_frame(f.PING, f.ACK, 0, payload))  # type: ignore[attr-defined]


class Listener:
    def __init__(self) -> None:
        self.resets: list[int | None] = []

    def upstream_headers(self, headers, end_stream) -> None:
        pass

    def upstream_data(self, data, end_stream) -> None:
        pass

    def upstream_reset(self, error_code) -> None:
        self.resets.append(error_code)


async def _open_call(peer: type[asyncio.Protocol]) -> tuple[UpstreamLink, Listener, asyncio.Server]:
    server = await asyncio.get_running_loop().create_server(peer, "127.0.0.1", 0)
    link = UpstreamLink("127.0.0.1", server.sockets[0].getsockname()[1])
    connection = await link.connect()
    listener = Listener()
    connection.open_stream(
        listener, link.request_headers(b"/dpgate.v1.InferenceService/GenerateStream", None), b"", True
    )
    await asyncio.sleep(0.05)
    return link, listener, server


async def _silent_connection_is_dropped() -> None:
    link, listener, server = await _open_call(SilentPeer)
    link.check_alive(0.2)
    await asyncio.sleep(0.1)
    assert listener.resets == [] and link.ready_connection() is not None  # not before the timeout
    await asyncio.sleep(0.3)
    assert listener.resets == [None]  # as a lost connection: the call ends UNAVAILABLE or INTERNAL
    assert link.ready_connection() is None  # the next call opens a fresh connection
    link.close()
    server.close()


async def _answering_connection_is_kept() -> None:
    link, listener, server = await _open_call(PingingPeer)
    link.check_alive(0.2)
    await asyncio.sleep(0.4)
    assert listener.resets == []
    assert link.ready_connection() is not None
    link.check_alive(0.2)  # a second check pings again and is answered again
    await asyncio.sleep(0.3)
    assert listener.resets == []
    link.close()
    server.close()


def test_a_connection_that_does_not_answer_ping_is_dropped_with_its_calls() -> None:
    asyncio.run(_silent_connection_is_dropped())


def test_a_connection_that_answers_ping_keeps_its_calls() -> None:
    asyncio.run(_answering_connection_is_kept())
