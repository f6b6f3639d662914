"""The gateway's HTTP/2 server side: client connections, their calls, keepalive, and the listener.

Each client stream becomes a `ServerCall`; the `CallOpener` (the forwarder) decides what to do
with it and sets `call.handler`, which then receives the request's data and a cancellation
when the client resets the stream or disconnects.

Keepalive follows gRPC's server rules: the gateway pings a connection that has been quiet for
`keepalive_time_s` and closes it when no ack comes within `keepalive_timeout_s`. A client may
ping after anything the gateway sent it; pings with nothing sent in between must be
`min_client_ping_interval_s` apart, and the third that is not ends the connection with GOAWAY
ENHANCE_YOUR_CALM "too_many_pings", as gRPC's servers do.
"""

from __future__ import annotations

import asyncio
import logging
import os
import ssl
from typing import Protocol

import grpc

from gateway.config import GatewayConfig
from gateway.grpc_wire import RESPONSE_HEADERS, status_trailers
from gateway.http2 import frames as f
from gateway.http2.connection import Headers, Http2Connection, Stream
from gateway.http2.header_codec import encode_literal

logger = logging.getLogger("dpgate.gateway.front_door")
_MAX_PING_STRIKES = 2


class CallHandler(Protocol):
    """What serves one call once it is admitted."""

    def on_request_data(self, data: bytes, end_stream: bool) -> None: ...
    def on_response_sent(self, num_bytes: int) -> None: ...
    def on_cancelled(self) -> None: ...


class CallOpener(Protocol):
    def open_call(self, call: ServerCall, end_stream: bool) -> None: ...


class ServerCall(Stream):
    """One client call: its request headers in, the response out."""

    __slots__ = ("handler", "headers", "is_finished", "is_response_started")

    def __init__(self, connection: ClientConnection, headers: Headers) -> None:
        super().__init__(connection)
        self.headers = headers
        self.handler: CallHandler | None = None
        self.is_response_started = False
        self.is_finished = False

    def on_headers(self, headers: Headers, end_stream: bool) -> None:
        # Request trailers: gRPC clients send none, but they would end the request.
        if end_stream and self.handler is not None:
            self.handler.on_request_data(b"", True)

    def on_data(self, data: bytes, end_stream: bool) -> None:
        if self.handler is not None:
            self.handler.on_request_data(data, end_stream)

    def on_reset(self, error_code: int | None) -> None:
        if not self.is_finished:
            self.is_finished = True
            if self.handler is not None:
                self.handler.on_cancelled()

    def on_sent(self, num_bytes: int) -> None:
        if self.handler is not None:
            self.handler.on_response_sent(num_bytes)

    def start_response(self, extra: bytes = b"") -> None:
        if not self.is_response_started:
            self.is_response_started = True
            self.connection.send_headers(self, RESPONSE_HEADERS + extra)

    def send(self, data: bytes) -> None:
        """Relay response bytes (whole or partial length-prefixed messages)."""
        if not self.is_response_started:
            self.start_response()
        self.connection.send_data(self, data)

    def finish(self, trailers: bytes) -> None:
        """End the call with a status block from `grpc_wire.status_trailers`."""
        if self.is_finished:
            return
        self.is_finished = True
        connection = self.connection
        block = trailers if self.is_response_started else RESPONSE_HEADERS + trailers
        connection.send_headers(self, block, end_stream=True)
        if not self.is_remote_closed and not self.pending and self.stream_id in connection.streams:
            # The client is still sending; gRPC servers end such a stream with RST_STREAM NO_ERROR.
            connection.reset_stream(self, f.NO_ERROR)

    def refuse(self, code: grpc.StatusCode, message: str) -> None:
        """End a call that never started with a trailers-only response."""
        self.finish(status_trailers(code, message))


class ClientConnection(Http2Connection):
    """One client's connection (server role)."""

    def __init__(self, opener: CallOpener, config: GatewayConfig, connections: set[ClientConnection]) -> None:
        super().__init__()
        self._opener = opener
        self._config = config
        self._connections = connections
        self._last_ping_time = -1e9
        self._ping_strikes = 0
        self._keepalive: asyncio.TimerHandle | None = None
        self._ping_outstanding = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self._connections.add(self)
        self._keepalive = self._loop.call_later(self._config.keepalive_time_s, self._keepalive_tick)

    def connection_lost(self, exc: Exception | None) -> None:
        self._connections.discard(self)
        if self._keepalive is not None:
            self._keepalive.cancel()
        super().connection_lost(exc)

    def on_new_stream(self, stream_id: int, headers: Headers, end_stream: bool) -> None:
        call = ServerCall(self, headers)
        self.add_stream(call, stream_id)
        if end_stream:
            call.is_remote_closed = True
        self._opener.open_call(call, end_stream)

    # --- keepalive ----------------------------------------------------------------------------

    def on_ping(self) -> None:
        # gRPC's rule: a ping that follows HEADERS or DATA the server sent is never abuse (clients
        # ping after reading a response to probe bandwidth); only pings with nothing sent in
        # between must be `min_client_ping_interval_s` apart.
        now = self._loop.time()
        if self.has_sent_data:
            self.has_sent_data = False
            self._ping_strikes = 0
            self._last_ping_time = -1e9
        if now - self._last_ping_time < self._config.min_client_ping_interval_s:
            self._ping_strikes += 1
            if self._ping_strikes > _MAX_PING_STRIKES:
                logger.warning("closing a client connection that pings too often: too_many_pings")
                self.close(f.ENHANCE_YOUR_CALM, b"too_many_pings")
        self._last_ping_time = now

    def on_ping_ack(self, payload: bytes) -> None:
        self._ping_outstanding = False

    def _keepalive_tick(self) -> None:
        if self.is_closed:
            return
        config = self._config
        if self._ping_outstanding:
            self.close(f.NO_ERROR, b"keepalive ping not acknowledged")
            return
        quiet_for = self._loop.time() - self.last_frame_time
        if quiet_for >= config.keepalive_time_s:
            self._ping_outstanding = True
            self.send_ping(os.urandom(8))
            self._keepalive = self._loop.call_later(config.keepalive_timeout_s, self._keepalive_tick)
        else:
            self._keepalive = self._loop.call_later(config.keepalive_time_s - quiet_for, self._keepalive_tick)


def tls_context(config: GatewayConfig) -> ssl.SSLContext | None:
    """TLS toward clients (ALPN h2, as gRPC requires); mutual TLS when a client CA is given."""
    if config.tls_cert_file is None or config.tls_key_file is None:
        return None
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(config.tls_cert_file, config.tls_key_file)
    context.set_alpn_protocols(["h2"])
    if config.tls_client_ca_file:
        context.load_verify_locations(config.tls_client_ca_file)
        context.verify_mode = ssl.CERT_REQUIRED
    return context


async def listen(opener: CallOpener, config: GatewayConfig, connections: set[ClientConnection]) -> asyncio.Server:
    """Bind the front door; `connections` is kept up to date with the open client connections."""
    loop = asyncio.get_running_loop()
    host = config.host.strip("[]")
    return await loop.create_server(
        lambda: ClientConnection(opener, config, connections),
        host,
        config.port,
        ssl=tls_context(config),
        reuse_address=True,
        backlog=1024,
    )


def rank_trailer(rank: int) -> bytes:
    return encode_literal(b"x-data-parallel-rank", str(rank).encode())
