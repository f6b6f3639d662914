"""The front door's limits, each through a real gateway and raw sockets (docs/gateway.md, "Limits").

Every test starts a gateway with the flag set low, shows the limit holding (the advertised
SETTINGS value, the refusal or the GOAWAY), and shows a well-behaved client still served.
"""

from __future__ import annotations

import time

import grpc

from dpgate.e2e.h2_wire import (
    GENERATE_STREAM,
    H2Client,
    call,
    data,
    endless_call,
    grpc_status,
    headers,
    request_fields,
    rst_stream,
)
from gateway.http2 import frames as f
from gateway.http2.header_codec import encode_block
from tests.support.gateway_processes import generate_request, inference_stub

BLOCK = encode_block(request_fields())


def served(gateway) -> bool:
    with grpc.insecure_channel(gateway.address) as channel:
        return inference_stub(channel).Generate(generate_request(2), timeout=10).text == "xx"


def connected(gateway, *settings: tuple[int, int]) -> H2Client:
    client = H2Client(gateway.port)
    client.handshake(*settings)
    client.read_until(lambda fr: fr.type == f.SETTINGS and not fr.flags & f.ACK)
    return client


def goaway(client: H2Client, timeout: float = 5.0) -> tuple[int, bytes]:
    seen = client.read_until(lambda fr: False, timeout=timeout)
    (frame,) = seen.of_type(f.GOAWAY)
    assert seen.closed
    return f.unpack_goaway(frame.payload)[1], frame.payload[8:]


def response_of(client: H2Client, stream_id: int):
    seen = client.read_until(lambda fr: fr.stream_id == stream_id and fr.type == f.HEADERS and fr.flags & f.END_STREAM)
    assert not seen.of_type(f.GOAWAY) and not seen.closed
    return seen.frames[-1]


def test_max_concurrent_streams_is_advertised_and_enforced(start_gateway):
    gateway = start_gateway("--max-concurrent-streams", "3")
    client = connected(gateway)
    try:
        assert client.server_settings[f.SETTINGS_MAX_CONCURRENT_STREAMS] == 3
        client.send(b"".join(headers(stream_id) for stream_id in (1, 3, 5, 7)))  # four open streams
        seen = client.read_until(lambda fr: fr.type == f.RST_STREAM)
        assert (seen.frames[-1].stream_id, f.unpack_error_code(seen.frames[-1].payload)) == (7, f.REFUSED_STREAM)
        client.send(data(1))  # the first three are served
        assert grpc_status(response_of(client, 1)) == b"0"
        client.send(call(9))  # one slot is free again
        assert grpc_status(response_of(client, 9)) == b"0"
    finally:
        client.close()


def test_max_header_list_size_is_advertised_and_too_large_requests_are_resource_exhausted(start_gateway):
    gateway = start_gateway("--max-header-list-size", "4096")
    with grpc.insecure_channel(gateway.address) as channel:  # just below the limit: served
        metadata = [("x-pad", "p" * 3500)]
        assert inference_stub(channel).Generate(generate_request(2), metadata=metadata, timeout=10).text == "xx"
    client = connected(gateway)
    try:
        assert client.server_settings[f.SETTINGS_MAX_HEADER_LIST_SIZE] == 4096
        big = encode_block([*request_fields(), (b"x-pad", b"p" * 5000)])
        client.send(headers(1, block=big) + data(1))
        trailers = response_of(client, 1)
        assert grpc_status(trailers) == b"8"  # RESOURCE_EXHAUSTED: the gRPC form of HTTP's 431
        assert b"larger than the gateway's limit of 4096 bytes" in dict(trailers.headers)[b"grpc-message"]
        client.send(call(3))  # the connection goes on
        assert grpc_status(response_of(client, 3)) == b"0"
        # Far past the limit (twice it, plus a frame): decoding would cost what the limit saves.
        huge = encode_block([*request_fields(), (b"x-pad", b"p" * 30_000)])
        client.send(headers(5, block=huge[:16_000], end_headers=False))
        client.send(f.pack_frame(f.CONTINUATION, f.END_HEADERS, 5, huge[16_000:]))
        assert goaway(client)[0] == f.ENHANCE_YOUR_CALM
    finally:
        client.close()
    assert served(gateway)


def test_connections_past_the_cap_are_turned_away(start_gateway):
    gateway = start_gateway("--max-connections", "3")
    time.sleep(0.2)  # the start-up check's own connection is gone by then
    clients = [connected(gateway) for _ in range(3)]
    try:
        extra = H2Client(gateway.port)
        extra.handshake()
        assert goaway(extra) == (f.ENHANCE_YOUR_CALM, b"too_many_connections")
        extra.close()
        for client in clients:  # those in are served
            client.send(call(1))
            assert grpc_status(response_of(client, 1)) == b"0"
        clients.pop().close()
        deadline = time.monotonic() + 5
        while True:  # the gateway notices the close, then has room for one more
            try:
                assert served(gateway)
                break
            except grpc.RpcError:
                assert time.monotonic() < deadline
                time.sleep(0.05)
    finally:
        for client in clients:
            client.close()


def test_a_connection_that_sends_no_request_in_time_is_closed(start_gateway):
    gateway = start_gateway("--header-timeout", "0.5")
    silent, preface_only = H2Client(gateway.port), connected(gateway)
    started = time.monotonic()
    try:
        assert goaway(silent)[0] == f.NO_ERROR  # not even the preface
        assert goaway(preface_only)[0] == f.NO_ERROR  # preface and SETTINGS, then nothing
        assert time.monotonic() - started < 3
    finally:
        silent.close()
        preface_only.close()
    prompt = connected(gateway)  # one that asks in time stays
    try:
        prompt.send(call(1))
        assert grpc_status(response_of(prompt, 1)) == b"0"
        time.sleep(1.0)
        prompt.send(call(3))
        assert grpc_status(response_of(prompt, 3)) == b"0"
    finally:
        prompt.close()


def test_a_header_block_that_never_ends_is_cut_off(start_gateway):
    gateway = start_gateway("--header-timeout", "0.5")
    client = connected(gateway)
    try:
        client.send(call(1))
        assert grpc_status(response_of(client, 1)) == b"0"
        started = time.monotonic()
        client.send(headers(3, block=BLOCK[:6], end_headers=False))  # slowloris: CONTINUATION never comes
        assert goaway(client) == (f.ENHANCE_YOUR_CALM, b"header block not finished in time")
        assert 0.4 < time.monotonic() - started < 3
    finally:
        client.close()
    assert served(gateway)


def test_idle_connections_are_closed_and_busy_ones_kept(start_gateway):
    gateway = start_gateway("--idle-timeout", "0.5", "--keepalive-time", "30")
    idle, busy = connected(gateway), connected(gateway, (f.SETTINGS_INITIAL_WINDOW_SIZE, 0))
    try:
        idle.send(call(1))  # a finished call, then quiet
        busy.send(endless_call(1))  # a call that goes on
        started = time.monotonic()
        assert goaway(idle) == (f.NO_ERROR, b"idle")
        assert time.monotonic() - started < 3
        time.sleep(0.5)
        busy.send(f.pack_frame(f.PING, 0, 0, b"still?.."))
        seen = busy.read_until(lambda fr: fr.type == f.PING and fr.payload == b"still?..")
        assert not seen.of_type(f.GOAWAY) and not seen.closed  # an open stream keeps it
    finally:
        idle.close()
        busy.close()


def test_hpack_table_size_is_advertised_and_the_client_held_to_it(start_gateway):
    gateway = start_gateway("--hpack-table-size", "64")
    client = connected(gateway)
    try:
        assert client.server_settings[f.SETTINGS_HEADER_TABLE_SIZE] == 64
        client.send(f.pack_frame(f.SETTINGS, f.ACK, 0))
        client.send(headers(1, block=b"\x3f\x21" + BLOCK) + data(1))  # shrinks its table to 64 first
        assert grpc_status(response_of(client, 1)) == b"0"
        client.send(headers(3, block=b"\x3f\xe1\x1f" + BLOCK) + data(3))  # back to 4096: over the cap
        assert goaway(client)[0] == f.COMPRESSION_ERROR
    finally:
        client.close()
    lazy = connected(gateway)
    try:  # an encoder that never says it shrank its table breaks RFC 7541 section 4.2
        lazy.send(f.pack_frame(f.SETTINGS, f.ACK, 0) + call(1))
        assert goaway(lazy)[0] == f.COMPRESSION_ERROR
    finally:
        lazy.close()
    assert served(gateway)


def test_continuation_frames_past_the_cap_end_the_connection(start_gateway):
    gateway = start_gateway("--max-continuation-frames", "2")

    def split(stream_id: int, parts: int) -> bytes:
        cut = [len(BLOCK) * i // parts for i in range(parts + 1)]
        out = headers(stream_id, block=BLOCK[: cut[1]], end_headers=False)
        for i in range(1, parts):
            flags = f.END_HEADERS if i == parts - 1 else 0
            out += f.pack_frame(f.CONTINUATION, flags, stream_id, BLOCK[cut[i] : cut[i + 1]])
        return out + data(stream_id)

    client = connected(gateway)
    try:
        client.send(split(1, 3))  # HEADERS + 2 CONTINUATION
        assert grpc_status(response_of(client, 1)) == b"0"
        client.send(split(3, 4))  # HEADERS + 3 CONTINUATION
        assert goaway(client)[0] == f.ENHANCE_YOUR_CALM
    finally:
        client.close()
    assert served(gateway)


def streams_seen(engine) -> float:
    return engine.requests_total().get("GenerateStream", 0.0)


def test_rapid_reset_ends_the_connection_and_the_engine_sees_no_more_than_the_limit(start_gateway, synthetic_engine):
    """CVE-2023-44487: streams opened and reset at once cost the server, not the client.

    Each stream is reset as soon as its first message arrives (so the engine really served it);
    the bucket holds `limit` resets and refills at `limit` a second, so a client resetting far
    faster than that is cut off after `limit` plus what refilled while it ran.
    """
    limit = 5
    gateway = start_gateway("--max-resets-per-second", str(limit))
    before = streams_seen(synthetic_engine)
    client = connected(gateway)
    num_reset = 0
    started = time.monotonic()
    try:
        for stream_id in range(1, 400, 2):
            client.send(endless_call(stream_id))
            seen = client.read_until(lambda fr, sid=stream_id: fr.type == f.DATA and fr.stream_id == sid)
            if seen.closed or seen.of_type(f.GOAWAY):
                break
            client.send(rst_stream(stream_id))
            num_reset += 1
        else:
            raise AssertionError("200 rapid resets and no GOAWAY")
        elapsed = time.monotonic() - started
        (frame,) = seen.of_type(f.GOAWAY)
        assert (f.unpack_goaway(frame.payload)[1], frame.payload[8:]) == (f.ENHANCE_YOUR_CALM, b"too_many_resets")
    finally:
        client.close()
    assert limit <= num_reset <= limit + limit * elapsed + 1
    wait_for_engine_count(synthetic_engine, before + num_reset)
    assert streams_seen(synthetic_engine) - before <= num_reset + 1  # the engine saw only what the bucket allowed
    assert served(gateway)


def wait_for_engine_count(engine, count: float) -> None:
    deadline = time.monotonic() + 5
    while streams_seen(engine) < count and time.monotonic() < deadline:
        time.sleep(0.05)  # the engine counts a call when its handler ends
    time.sleep(0.3)


def test_a_burst_of_opened_and_reset_streams_is_cut_off_at_the_limit(start_gateway):
    """The attack as published: HEADERS, DATA, RST_STREAM, again and again, in one write.

    The gateway forwards each call upstream before its reset is read, so what it admitted is
    what an engine would have seen: the calls it counts as cancelled.
    """
    limit = 20
    gateway = start_gateway("--max-resets-per-second", str(limit))
    client = connected(gateway)
    try:
        client.send(b"".join(endless_call(stream_id) + rst_stream(stream_id) for stream_id in range(1, 400, 2)))
        assert goaway(client) == (f.ENHANCE_YOUR_CALM, b"too_many_resets")
    finally:
        client.close()
    admitted = gateway.metrics().get('dpgate_gateway_requests_total{code="CANCELLED",rpc="GenerateStream"}', 0)
    assert limit <= admitted <= limit + 1
    assert served(gateway)


def test_a_client_cancelling_at_a_modest_rate_is_not_cut_off(start_gateway):
    gateway = start_gateway("--max-resets-per-second", "20")
    client = connected(gateway)
    try:
        for stream_id in range(1, 60, 2):  # 30 cancels at about 15 a second: under the refill rate
            client.send(headers(stream_id, request_fields(GENERATE_STREAM)) + rst_stream(stream_id))
            time.sleep(1 / 15)
        client.send(call(101))
        assert grpc_status(response_of(client, 101)) == b"0"
    finally:
        client.close()
