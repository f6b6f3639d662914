"""The gateway's HTTP/2 server side: client connections, their calls, keepalive, and the listener.

Each client stream becomes a `ServerCall`; the `CallOpener` (the forwarder) decides what to do
with it and sets `call.handler`, which then receives the request's data and a cancellation
when the client resets the stream or disconnects.

Keepalive follows gRPC's server rules: the gateway pings a connection that has been quiet for
`keepalive_time_s` and closes it when no ack comes within `keepalive_timeout_s`. A client may
ping after anything the gateway sent it; pings with nothing sent in between must be
`min_client_ping_interval_s` apart, and the third that is not ends the connection with GOAWAY
ENHANCE_YOUR_CALM "too_many_pings", as gRPC's servers do.

The limits a public front door needs come from the flags (`front_door_limits`): streams per
connection and header list size (advertised in SETTINGS and enforced by the connection), HPACK
table size, CONTINUATION frames per field block and the rapid-reset guard (in the connection),
and here: the cap on open connections (one more gets GOAWAY ENHANCE_YOUR_CALM at once), the
header timeout (a new connection must deliver its preface and first request's headers within
it, and any field block its CONTINUATION frames: slowloris), and the idle timeout (GOAWAY
NO_ERROR to a connection that has had no open stream for that long).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import ssl
from collections.abc import Callable
from typing import Final, Protocol

import grpc

from gateway.config import GatewayConfig
from gateway.grpc_wire import RESPONSE_HEADERS, status_trailers
from gateway.http2 import frames as f
from gateway.http2.connection import Headers, Http2Connection, Stream
from gateway.http2.header_codec import encode_literal
from gateway.http2.limits import Http2Limits

logger = logging.getLogger("dpgate.gateway.front_door")
_MAX_PING_STRIKES: Final = 2
# Bytes relayed to the client are handed to the call's handler (which returns the engine's
# flow-control credit) in steps of at least this many. The gateway opens a 4 MiB window on each
# upstream stream and tells the engine of credit once 2 MiB are due, so a smaller step changes
# nothing the engine sees; without one, a stream of small token messages made three calls per
# message to add a number (issue 27). The connection counts the step (`Stream.sent_step`), so a
# relayed message makes no call for its credit at all.
CREDIT_STEP_BYTES: Final = 64 * 1024


class CallHandler(Protocol):
    """What serves one call once it is admitted."""

    def on_request_data(self, data: bytes, end_stream: bool) -> None: ...
    def on_response_sent(self, num_bytes: int) -> None: ...
    def on_cancelled(self) -> None: ...


class CallOpener(Protocol):
    def open_call(self, call: ServerCall, end_stream: bool) -> None: ...


class ServerCall(Stream):
    """One client call: its request headers in, the response out."""

    __slots__ = ("handler", "headers", "is_finished", "is_response_started", "loop", "peer")
    sent_step = CREDIT_STEP_BYTES

    def __init__(self, connection: ClientConnection, headers: Headers) -> None:
        super().__init__(connection)
        self.headers = headers
        self.peer = connection.peer  # the client's address (the per-peer limits count calls by it)
        self.loop = connection.loop  # the loop the call's connection runs on (its timers go there)
        self.handler: CallHandler | None = None
        self.is_response_started = False
        self.is_finished = False

    def after_read(self, callback: Callable[[], None]) -> None:
        """Run `callback` once the read that brought this call's latest frames is handled."""
        self.connection.after_read(callback)

    @property
    def received_at(self) -> float:
        """`time.perf_counter()` of the read that brought the request's latest bytes (the gateway's
        added latency counts from there)."""
        return self.connection.last_read_at

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


def front_door_limits(config: GatewayConfig) -> Http2Limits:
    """What every client connection allows its client (the limits enforced in gateway/http2/)."""
    return Http2Limits(
        max_concurrent_streams=config.max_concurrent_streams,
        max_header_list_size=config.max_header_list_size,
        header_table_size=config.hpack_table_size,
        max_continuation_frames=config.max_continuation_frames,
        max_resets_per_second=config.max_resets_per_second,
    )


class ClientConnection(Http2Connection):
    """One client's connection (server role)."""

    def __init__(
        self, opener: CallOpener, config: GatewayConfig, connections: set[ClientConnection], limits: Http2Limits
    ) -> None:
        super().__init__(limits)
        self._opener = opener
        self._config = config
        self._connections = connections
        self._last_ping_time = -1e9
        self._ping_strikes = 0
        self._keepalive: asyncio.TimerHandle | None = None
        self._ping_outstanding = False
        self._header_timer: asyncio.TimerHandle | None = None
        self._idle_timer: asyncio.TimerHandle | None = None
        self.peer = ""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        peer = transport.get_extra_info("peername")
        self.peer = str(peer[0]) if isinstance(peer, tuple) and peer else ""  # the client's address
        config = self._config
        if len(self._connections) >= config.max_connections:
            logger.debug("refusing a client connection: %d are open", len(self._connections))
            self.close(f.ENHANCE_YOUR_CALM, b"too_many_connections")
            return
        # One address may not take every connection (idle ones re-opened as the header timeout
        # closes them filled --max-connections and locked new clients out, issue 22).
        if sum(1 for other in self._connections if other.peer == self.peer) >= config.max_connections_per_peer:
            logger.debug("refusing a client connection: %s has %d open", self.peer, config.max_connections_per_peer)
            self.close(f.ENHANCE_YOUR_CALM, b"too_many_connections_from_peer")
            return
        self._connections.add(self)
        call_later = self._loop.call_later
        self._keepalive = call_later(config.keepalive_time_s, self._keepalive_tick)
        self._header_timer = call_later(config.header_timeout_s, self._header_deadline)
        self._idle_timer = call_later(config.idle_timeout_s, self._idle_tick)

    def connection_lost(self, exc: Exception | None) -> None:
        self._connections.discard(self)
        for timer in (self._keepalive, self._header_timer, self._idle_timer):
            if timer is not None:
                timer.cancel()
        super().connection_lost(exc)

    def on_new_stream(self, stream_id: int, headers: Headers, end_stream: bool) -> None:
        call = ServerCall(self, headers)
        self.add_stream(call, stream_id)
        if end_stream:
            call.is_remote_closed = True
        self._opener.open_call(call, end_stream)

    def on_oversized_request(self, stream_id: int, end_stream: bool, size: int) -> None:
        # The gRPC form of HTTP's 431: a status the client can read, not a bare reset.
        call = ServerCall(self, [])
        self.add_stream(call, stream_id)
        call.is_remote_closed = end_stream
        limit = self.limits.max_header_list_size
        call.refuse(
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            f"request headers of {size} bytes are larger than the gateway's limit of {limit} bytes",
        )

    # --- deadlines: first request, field blocks, idleness -------------------------------------

    def on_field_block_started(self) -> None:
        if self._header_timer is None:
            self._header_timer = self._loop.call_later(self._config.header_timeout_s, self._header_deadline)

    def _header_deadline(self) -> None:
        """Close a connection whose first request, or whose current field block, is overdue."""
        self._header_timer = None
        if self.is_closed:
            return
        timeout = self._config.header_timeout_s
        if self.last_peer_stream_id == 0:
            logger.debug("closing a client connection that sent no request within %.1f s", timeout)
            self.close(f.NO_ERROR, b"no request headers in time")
            return
        started_at = self.field_block_started_at
        if started_at is None:
            return
        late_by = self._loop.time() - started_at - timeout
        if late_by >= 0:
            logger.debug("closing a client connection whose header block took over %.1f s", timeout)
            self.close(f.ENHANCE_YOUR_CALM, b"header block not finished in time")
        else:
            self._header_timer = self._loop.call_later(-late_by, self._header_deadline)

    def _idle_tick(self) -> None:
        if self.is_closed:
            return
        timeout = self._config.idle_timeout_s
        idle_for = 0.0 if self.streams else self._loop.time() - self.idle_since
        if idle_for >= timeout:
            self.close(f.NO_ERROR, b"idle")
        else:
            self._idle_timer = self._loop.call_later(timeout - idle_for, self._idle_tick)

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
    context.load_cert_chain(config.tls_cert_file, config.tls_key_file, password=config.tls_key_password)
    context.set_alpn_protocols(["h2"])
    if config.tls_client_ca_file:
        context.load_verify_locations(config.tls_client_ca_file)
        context.verify_mode = ssl.CERT_REQUIRED
    return context


async def listen(opener: CallOpener, config: GatewayConfig, connections: set[ClientConnection]) -> asyncio.Server:
    """Bind the front door; `connections` is kept up to date with the open client connections."""
    loop = asyncio.get_running_loop()
    host = config.host.strip("[]")
    limits = front_door_limits(config)
    return await loop.create_server(
        lambda: ClientConnection(opener, config, connections, limits),
        host,
        config.port,
        ssl=tls_context(config),
        reuse_address=True,
        backlog=1024,
    )


@functools.lru_cache(maxsize=256)
def rank_trailer(rank: int) -> bytes:
    """The `x-data-parallel-rank` field a relayed call ends with (one per rank: encoded once)."""
    return encode_literal(b"x-data-parallel-rank", str(rank).encode())
