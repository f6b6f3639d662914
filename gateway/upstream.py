"""The gateway's HTTP/2 client side: connections to one upstream (an engine, or the local services).

An `UpstreamLink` owns the connections to one address and opens more when the peer's
SETTINGS_MAX_CONCURRENT_STREAMS is reached or a connection has been told GOAWAY. Connecting is
lazy: the first call after start or after a connection was lost waits for the TCP handshake;
a refused connection fails that call (the health watcher, not the data path, decides when an
engine is out of rotation).

A link that goes silent (a host cut off, a dead switch port: no RST, no FIN) would hold its calls
until the client's deadline, since the gateway sends nothing upstream while it waits. When the
watcher finds the engine unhealthy it calls `check_alive`: each connection gets one PING, and one
that is not answered within the probe timeout is dropped, which ends its calls as a lost
connection. A connection that answers (a draining engine finishing its calls) is kept.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Final, Protocol

from dpgate.engine_token import ENGINE_TOKEN_KEY
from gateway.grpc_wire import format_timeout
from gateway.http2.connection import Headers, Http2Connection, Stream
from gateway.http2.header_codec import encode_block, encode_field, encode_literal

_MAX_STREAM_ID: Final = 2**31 - 1
_LIVENESS_PING: Final = b"dpgalive"
logger = logging.getLogger("dpgate.gateway.engines")


class UpstreamListener(Protocol):
    """What an upstream stream reports to: the call relaying it."""

    def upstream_headers(self, headers: Headers, end_stream: bool) -> None: ...
    def upstream_data(self, data: bytes, end_stream: bool) -> None: ...
    def upstream_reset(self, error_code: int | None) -> None: ...


class UpstreamStream(Stream):
    """A stream the gateway opened upstream; its events go to the relaying call.

    Its receive window is returned by the relaying call (`release`) as the bytes reach the client.
    """

    auto_credit = False

    __slots__ = ("listener",)

    def __init__(self, connection: Http2Connection, listener: UpstreamListener) -> None:
        super().__init__(connection)
        self.listener = listener

    def on_headers(self, headers: Headers, end_stream: bool) -> None:
        self.listener.upstream_headers(headers, end_stream)

    def on_data(self, data: bytes, end_stream: bool) -> None:
        self.listener.upstream_data(data, end_stream)

    def on_reset(self, error_code: int | None) -> None:
        self.listener.upstream_reset(error_code)

    def release(self, num_bytes: int) -> None:
        if not self.connection.is_closed:
            self.connection.release(self, num_bytes)

    def cancel(self) -> None:
        """Tell the upstream the call is over (RST_STREAM CANCEL), unless it already ended."""
        if self.is_open:
            self.connection.reset_stream(self)


class UpstreamConnection(Http2Connection):
    is_client = True

    def __init__(self, link: UpstreamLink) -> None:
        super().__init__()
        self._link = link
        self._next_stream_id = 1
        self._liveness: asyncio.TimerHandle | None = None

    def connection_lost(self, exc: Exception | None) -> None:
        self._link.forget(self)
        if self._liveness is not None:
            self._liveness.cancel()
            self._liveness = None
        super().connection_lost(exc)

    def check_alive(self, timeout: float) -> None:
        """PING the engine; drop the connection unless the ack comes within `timeout` seconds."""
        if self.is_closed or self._liveness is not None:
            return
        self.send_ping(_LIVENESS_PING)
        self._liveness = self._loop.call_later(timeout, self._not_alive, timeout)

    def on_ping_ack(self, payload: bytes) -> None:
        if self._liveness is not None:
            self._liveness.cancel()
            self._liveness = None

    def _not_alive(self, timeout: float) -> None:
        self._liveness = None
        if self.is_closed or self.transport is None:
            return
        link = self._link
        logger.warning("engine %s:%s did not answer a PING within %s s: dropping its connection and %d calls",
                       link.host, link.port, timeout, len(self.streams))  # fmt: skip
        # abort, not close: a GOAWAY cannot leave over a silent link, and close would wait for it
        self.is_closed = True
        self.transport.abort()

    @property
    def can_open_stream(self) -> bool:
        return (
            not self.is_closed
            and not self.goaway_received
            and self._next_stream_id < _MAX_STREAM_ID
            and (self.peer_max_streams is None or len(self.streams) < self.peer_max_streams)
        )

    def open_stream(
        self, listener: UpstreamListener, header_block: bytes, body: bytes, end_stream: bool
    ) -> UpstreamStream:
        stream = UpstreamStream(self, listener)
        self.add_stream(stream, self._next_stream_id)
        self._next_stream_id += 2
        if body:
            self.send_headers(stream, header_block)
            self.send_data(stream, body, end_stream)
        else:
            self.send_headers(stream, header_block, end_stream)
        return stream


class UpstreamLink:
    """Connections to one upstream address, and the request headers calls to it carry."""

    def __init__(self, host: str, port: int, engine_token: str | None = None) -> None:
        self.host = host
        self.port = port
        authority = f"{host}:{port}".encode()
        fields = [(b":method", b"POST"), (b":scheme", b"http"), (b":authority", authority),
                  (b"content-type", b"application/grpc"), (b"te", b"trailers")]  # fmt: skip
        if engine_token is not None:  # dpgate/engine_token.py: engines serve only their gateway
            fields.append((ENGINE_TOKEN_KEY.encode(), engine_token.encode()))
        self._fixed_headers = encode_block(fields)
        self._connections: list[UpstreamConnection] = []
        self._connecting: asyncio.Future[UpstreamConnection] | None = None
        self._is_closed = False

    def request_headers(self, path: bytes, timeout: float | None, extra: bytes = b"") -> bytes:
        """The header block for a call to `path`; `extra` is already encoded (e.g. grpc-encoding)."""
        block = encode_field(b":path", path) + self._fixed_headers + extra
        if timeout is not None:
            block += encode_literal(b"grpc-timeout", format_timeout(timeout))
        return block

    def ready_connection(self) -> UpstreamConnection | None:
        """A connection that can take one more stream now, or None (then `connect`)."""
        for connection in self._connections:
            if connection.can_open_stream:
                return connection
        return None

    async def connect(self) -> UpstreamConnection:
        """A usable connection, opening one if needed; concurrent callers share one attempt."""
        connection = self.ready_connection()
        if connection is not None:
            return connection
        if self._is_closed:
            raise ConnectionError(f"link to {self.host}:{self.port} is closed")
        if self._connecting is None:
            self._connecting = asyncio.ensure_future(self._open())
        connecting = self._connecting
        try:
            return await asyncio.shield(connecting)
        finally:
            if self._connecting is connecting and connecting.done():
                self._connecting = None

    async def _open(self) -> UpstreamConnection:
        loop = asyncio.get_running_loop()
        host = self.host.strip("[]")
        _, connection = await loop.create_connection(lambda: UpstreamConnection(self), host, self.port)
        self._connections.append(connection)
        return connection

    def check_alive(self, timeout: float) -> None:
        """Ping every connection; each one silent for `timeout` seconds is dropped with its calls."""
        for connection in list(self._connections):
            connection.check_alive(timeout)

    def forget(self, connection: UpstreamConnection) -> None:
        if connection in self._connections:
            self._connections.remove(connection)

    def close(self) -> None:
        self._is_closed = True
        for connection in list(self._connections):
            connection.close()
