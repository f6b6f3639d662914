"""One HTTP/2 stream's transport state (RFC 9113 section 5.1); owners subclass it for the events."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import ClassVar, Final, Protocol

from mypy_extensions import mypyc_attr

from gateway.http2 import frames as f

Headers = list[tuple[bytes, bytes]]

LOCAL_STREAM_WINDOW: Final = 1 << 22  # the receive window the gateway opens on every stream (4 MiB)


class StreamConnection(Protocol):
    """The connection a stream lives on, as its owner uses it (connection.py's `Http2Connection` is
    the one implementation): a protocol, so this module does not import the connection that
    imports it."""

    peer_initial_window: int  # the send window a new stream starts with (the peer's SETTINGS)
    is_client: ClassVar[bool]
    is_closed: bool
    last_read_at: float  # time.perf_counter() when the connection's latest bytes arrived
    streams: dict[int, Stream]  # the open streams by id

    def send_headers(self, stream: Stream, block: bytes, end_stream: bool = False) -> None: ...

    def send_data(self, stream: Stream, data: bytes, end_stream: bool = False) -> None: ...

    def reset_stream(self, stream: Stream, error_code: int = f.CANCEL) -> None: ...

    def after_read(self, callback: Callable[[], None]) -> None: ...

    def release(self, stream: Stream, num_bytes: int) -> None: ...


# Owners subclass it in Python too (the tests' streams) when this module runs compiled (gateway/compiled.py).
@mypyc_attr(allow_interpreted_subclasses=True)
class Stream:
    """One stream; the connection calls `on_headers`, `on_data` and `on_reset` as frames arrive.

    States map to two flags: open (neither), half-closed (one), closed (both; the connection has
    forgotten the stream). `on_reset(None)` means the connection was lost; an int is the code of
    the RST_STREAM that ended the stream: the peer's, or the one this side sent because the
    peer broke the protocol on it (REFUSED_STREAM for a stream a GOAWAY said the peer never
    processed). `recv_window` is what the peer may still send on it; `content_length` is what
    the message's content-length still expects (None without one).
    """

    # Per-class settings are ClassVars: a compiled Stream reads a Python subclass's through its class.
    auto_credit: ClassVar[bool] = True  # return flow-control credit on receipt; False: the owner calls `release`
    # `on_sent` comes once at least this many bytes left since the last one: a relaying owner that
    # returns credit in steps sets its step here, so a relayed message costs no call of its own.
    sent_step: ClassVar[int] = 1

    __slots__ = (
        "_recv_unacked",
        "connection",
        "content_length",
        "credit_on_receipt",
        "credit_step",
        "is_headers_received",
        "is_local_closed",
        "is_remote_closed",
        "opened_at",
        "pending",
        "recv_window",
        "send_window",
        "stream_id",
        "unsent",
    )  # fmt: skip

    def __init__(self, connection: StreamConnection) -> None:
        self.connection = connection
        self.stream_id = 0
        self.send_window = connection.peer_initial_window
        self.recv_window = LOCAL_STREAM_WINDOW
        self.pending: deque[tuple[int, bytes, bool]] | None = None
        self.is_local_closed = False
        self.is_remote_closed = False
        # A server's streams exist once their request headers arrived; a client's wait for the response's.
        self.is_headers_received = not connection.is_client
        self.content_length: int | None = None
        self.opened_at = 0.0  # loop time the peer opened it (server role; the rapid-reset guard)
        self._recv_unacked = 0
        self.unsent = 0  # DATA bytes handed to the connection since `on_sent` last reported
        # The class's settings, read once here: the connection reads them for every DATA frame,
        # and a ClassVar is looked up by name on each read, compiled or not.
        self.credit_on_receipt = self.auto_credit
        self.credit_step = self.sent_step

    @property
    def is_open(self) -> bool:
        return not (self.is_local_closed and self.is_remote_closed)

    def on_headers(self, headers: Headers, end_stream: bool) -> None:
        raise NotImplementedError

    def on_data(self, data: bytes, end_stream: bool) -> None:
        raise NotImplementedError

    def on_reset(self, error_code: int | None) -> None:
        raise NotImplementedError

    def on_sent(self, num_bytes: int) -> None:
        """`num_bytes` of this stream's DATA left for the peer (they may have waited for window):
        reported once at least `sent_step` bytes are unreported (a last remainder below it never is)."""
