"""Fuzz requests no gRPC library sends, over raw HTTP/2 (dpgate/e2e/h2_wire.py's client): request
bodies whose gRPC framing lies, and connections cut off in the middle of a frame.

Blocking sockets, one connection per `RawConnection`; the fuzz workload runs each in a thread.
"""

from __future__ import annotations

import socket
import time

import grpc

from dpgate.e2e.h2_wire import H2Client, data, headers, request_fields, settings, window_update
from gateway.http2 import frames as f

ERROR_NAMES = {
    getattr(f, name): name
    for name in ("NO_ERROR", "PROTOCOL_ERROR", "INTERNAL_ERROR", "FLOW_CONTROL_ERROR", "SETTINGS_TIMEOUT",
                 "STREAM_CLOSED", "FRAME_SIZE_ERROR", "REFUSED_STREAM", "CANCEL", "COMPRESSION_ERROR",
                 "ENHANCE_YOUR_CALM")
}  # fmt: skip
GRPC_CODE_NAMES = {code.value[0]: code.name for code in grpc.StatusCode}
MAX_FRAME = f.DEFAULT_MAX_FRAME
MAX_BODY = 60_000  # within the stream window the gateway opens at once, so no WINDOW_UPDATE need be read


def error_name(code: int) -> str:
    return ERROR_NAMES.get(code, f"0x{code:x}")


def grpc_code_name(value: bytes) -> str:
    name = GRPC_CODE_NAMES.get(int(value)) if value.isdigit() else None
    return name or f"grpc-status {value!r}"


def open_client(host: str, port: int, timeout: float) -> H2Client:
    """A connected client whose windows never hold the gateway's responses back."""
    client = H2Client(port, timeout=timeout, host=host)
    client.handshake((f.SETTINGS_INITIAL_WINDOW_SIZE, f.MAX_WINDOW))
    client.send(window_update(0, f.MAX_WINDOW - f.DEFAULT_WINDOW))
    return client


def request_bytes(stream_id: int, path: str, body: bytes) -> bytes:
    """HEADERS then `body` as DATA frames of at most MAX_FRAME bytes, the last one ending the stream."""
    chunks = [body[offset : offset + MAX_FRAME] for offset in range(0, len(body), MAX_FRAME)] or [b""]
    frames = [headers(stream_id, request_fields(path.encode()))]
    frames += [data(stream_id, chunk, end_stream=index == len(chunks) - 1) for index, chunk in enumerate(chunks)]
    return b"".join(frames)


class RawConnection:
    """Sends raw calls one after another on one connection, opening a new one when the gateway ends it."""

    def __init__(self, host: str, port: int, timeout: float = 30.0) -> None:
        self.host, self.port, self.timeout = host, port, timeout
        self.client: H2Client | None = None
        self.stream_id = -1

    def call(self, path: str, body: bytes) -> str:
        """The outcome label (see fuzz_verdict) of one call whose DATA payload is `body`, gRPC framing and all."""
        if self.client is None or self.client.is_closed or self.stream_id > (1 << 30):
            self.close()
            self.client, self.stream_id = open_client(self.host, self.port, self.timeout), -1
        self.stream_id += 2
        stream_id, client = self.stream_id, self.client
        client.send(request_bytes(stream_id, path, body[:MAX_BODY]))
        seen = client.read_until(
            lambda frame: (
                frame.type == f.GOAWAY
                or (frame.stream_id == stream_id and frame.type == f.RST_STREAM)
                or (frame.stream_id == stream_id and frame.type == f.HEADERS and bool(frame.flags & f.END_STREAM))
            ),
            timeout=self.timeout,
        )
        return outcome_of(seen.frames[-1] if seen.frames else None, closed=seen.closed)

    def close(self) -> None:
        if self.client is not None:
            self.client.close()
            self.client = None


def outcome_of(last, closed: bool) -> str:
    """The label of the frame that ended a call (None and closed: the connection just ended)."""
    if last is None or (closed and last.type not in (f.GOAWAY, f.RST_STREAM, f.HEADERS)):
        return "closed"
    if last.type == f.GOAWAY:
        return f"goaway:{error_name(f.unpack_goaway(last.payload)[1])}"
    if last.type == f.RST_STREAM:
        return f"reset:{error_name(f.unpack_error_code(last.payload))}"
    status = dict(last.headers or []).get(b"grpc-status")
    return grpc_code_name(status) if status is not None else "no grpc-status"


def cut_call(host: str, port: int, path: str, body: bytes, keep_permille: int, timeout: float = 10.0) -> str:
    """Send a call's frames cut after `keep_permille`/1000 of their bytes, stop sending, and report how
    the gateway ended it (a whole request still gets its answer; a cut one only the connection's end)."""
    wire = request_bytes(1, path, body[:MAX_BODY])
    client = H2Client(port, timeout=timeout, host=host)
    try:
        client.send(f.PREFACE + settings() + wire[: len(wire) * keep_permille // 1000])
        client.sock.shutdown(socket.SHUT_WR)
        deadline = time.monotonic() + timeout
        goaway = None
        while True:
            try:
                frame = client.read_frame(deadline)
            except TimeoutError:
                return "no answer in time"
            if frame is None:
                return goaway or "closed"
            if frame.type == f.GOAWAY:
                goaway = outcome_of(frame, closed=False)
            elif frame.stream_id == 1 and (
                frame.type == f.RST_STREAM or (frame.type == f.HEADERS and frame.flags & f.END_STREAM)
            ):
                return outcome_of(frame, closed=False)
    finally:
        client.close()
