"""The pure parts of the HTTP/2 layer: header rules, frame payload parsers, stream-id states, limits."""

from __future__ import annotations

import struct

import pytest

from gateway.http2 import frames as f
from gateway.http2.errors import HeadersTooLarge, MalformedHeaders, ProtocolViolation
from gateway.http2.header_rules import check_request, check_response, check_trailers
from gateway.http2.limits import Http2Limits, ResetBudget
from gateway.http2.stream_ids import StreamIds
from tests.support.memory_transport import MemoryTransport

REQUEST = [(b":method", b"POST"), (b":scheme", b"http"), (b":path", b"/svc/M"), (b":authority", b"gw"),
           (b"content-type", b"application/grpc"), (b"te", b"trailers")]  # fmt: skip
BIG = 1 << 20


def test_a_grpc_request_is_well_formed():
    assert check_request(REQUEST, BIG) is None
    assert check_request([*REQUEST, (b"content-length", b"12")], BIG) == 12
    assert check_request([*REQUEST, (b"host", b"gw"), (b"x-data-parallel-rank", b"  1 ")], BIG) is None
    assert check_request([(b":method", b"CONNECT"), (b":authority", b"gw:1")], BIG) is None
    assert check_request([(b":method", b"OPTIONS"), (b":scheme", b"http"), (b":path", b"*")], BIG) is None


@pytest.mark.parametrize(
    "fields",
    [
        [*REQUEST, (b"X-Upper", b"1")],
        [*REQUEST, (b"x bad", b"1")],
        [*REQUEST, (b"", b"1")],
        [*REQUEST, (b"x-colon:", b"1")],
        [*REQUEST, (b"x-nul", b"a\x00b")],
        [*REQUEST, (b"x-cr", b"a\rb")],
        [*REQUEST, (b"x-lf", b"a\nb")],
        [(b":foo", b"1"), *REQUEST],
        [(b":status", b"200"), *REQUEST],
        [*REQUEST, (b":path", b"/late")],
        [(b":path", b"/x"), *REQUEST],
        [(b":method", b"GET"), *REQUEST],
        [(b":scheme", b"https"), *REQUEST],
        REQUEST[1:],
        [field for field in REQUEST if field[0] != b":scheme"],
        [field for field in REQUEST if field[0] != b":path"],
        [(b":path", b"") if name == b":path" else (name, value) for name, value in REQUEST],
        [(b":path", b"svc") if name == b":path" else (name, value) for name, value in REQUEST],
        [*REQUEST, (b"connection", b"close")],
        [*REQUEST, (b"keep-alive", b"1")],
        [*REQUEST, (b"proxy-connection", b"1")],
        [*REQUEST, (b"transfer-encoding", b"chunked")],
        [*REQUEST, (b"upgrade", b"h2c")],
        [(b"te", b"gzip") if name == b"te" else (name, value) for name, value in REQUEST],
        [*REQUEST, (b"content-length", b"-1")],
        [*REQUEST, (b"content-length", b"1 ")],
        [*REQUEST, (b"content-length", b"1"), (b"content-length", b"2")],
        [*REQUEST, (b"host", b"elsewhere")],
        [(b":method", b"CONNECT"), (b":authority", b"gw:1"), (b":path", b"/")],
        [(b":method", b"CONNECT")],
    ],
)
def test_malformed_requests_are_refused(fields):
    with pytest.raises(MalformedHeaders):
        check_request(fields, BIG)


def test_the_header_list_size_counts_32_bytes_a_field():
    size = sum(len(name) + len(value) + 32 for name, value in REQUEST)
    assert check_request(REQUEST, size) is None
    with pytest.raises(HeadersTooLarge) as info:
        check_request(REQUEST, size - 1)
    assert info.value.size == size


def test_responses_and_trailers():
    assert check_response([(b":status", b"200"), (b"content-type", b"application/grpc")], BIG) == (200, None)
    assert check_response([(b":status", b"100")], BIG) == (100, None)
    for bad in ([], [(b":status", b"2000")], [(b":status", b"20x")], [(b":status", b"101")],
                [(b":status", b"200"), (b":status", b"200")], [(b"x", b"1"), (b":status", b"200")],
                [(b":status", b"200"), (b":path", b"/")], [(b":status", b"200"), (b"te", b"trailers")]):  # fmt: skip
        with pytest.raises(MalformedHeaders):
            check_response(bad, BIG)
    check_trailers([(b"grpc-status", b"0"), (b"grpc-message", b"")], BIG)
    for bad in ([(b":status", b"200")], [(b"Grpc-Status", b"0")], [(b"grpc-message", b"a\nb")]):
        with pytest.raises(MalformedHeaders):
            check_trailers(bad, BIG)


def test_padding_and_priority_fields():
    assert f.strip_padding(b"\x02abcXX") == b"abc"
    assert f.strip_padding(b"\x00") == b""
    with pytest.raises(ProtocolViolation) as info:
        f.strip_padding(b"")
    assert info.value.error_code == f.FRAME_SIZE_ERROR
    with pytest.raises(ProtocolViolation) as info:
        f.strip_padding(b"\x03ab")
    assert info.value.error_code == f.PROTOCOL_ERROR
    payload = b"\x01" + f.pack_priority(3, 7) + b"block" + b"\x00"
    assert f.split_headers_payload(f.PADDED | f.PRIORITY_FLAG, payload) == (b"block", 3)
    with pytest.raises(ProtocolViolation) as info:
        f.split_headers_payload(f.PRIORITY_FLAG, b"\x00\x00")
    assert info.value.error_code == f.FRAME_SIZE_ERROR
    with pytest.raises(ProtocolViolation) as info:  # padding eats into the priority fields
        f.split_headers_payload(f.PADDED | f.PRIORITY_FLAG, b"\x02" + f.pack_priority(3) + b"a")
    assert info.value.error_code == f.PROTOCOL_ERROR


@pytest.mark.parametrize(
    "key, value, is_client, code",
    [
        (f.SETTINGS_ENABLE_PUSH, 2, False, f.PROTOCOL_ERROR),
        (f.SETTINGS_ENABLE_PUSH, 1, True, f.PROTOCOL_ERROR),  # a server may not enable push
        (f.SETTINGS_INITIAL_WINDOW_SIZE, 2**31, False, f.FLOW_CONTROL_ERROR),
        (f.SETTINGS_MAX_FRAME_SIZE, 16_383, False, f.PROTOCOL_ERROR),
        (f.SETTINGS_MAX_FRAME_SIZE, 2**24, True, f.PROTOCOL_ERROR),
    ],
)
def test_settings_out_of_range(key, value, is_client, code):
    with pytest.raises(ProtocolViolation) as info:
        f.parse_settings(struct.pack(">HL", key, value), is_client)
    assert info.value.error_code == code


def test_settings_in_range_and_unknown_ones_pass():
    payload = b"".join(struct.pack(">HL", key, value) for key, value in
                       [(f.SETTINGS_ENABLE_PUSH, 1), (f.SETTINGS_MAX_FRAME_SIZE, 2**24 - 1), (0xFF, 7)])  # fmt: skip
    assert f.parse_settings(payload, is_client=False)[-1] == (0xFF, 7)
    with pytest.raises(ProtocolViolation) as info:
        f.parse_settings(b"\x00" * 7, is_client=False)
    assert info.value.error_code == f.FRAME_SIZE_ERROR


def test_stream_id_states():
    ids = StreamIds(is_client=False)
    assert ids.is_idle(1) and ids.is_idle(2)
    ids.opened_by_peer(1)
    ids.opened_by_peer(7)  # 3 and 5 were skipped: closed without ever opening
    assert not ids.is_idle(5) and ids.was_skipped(5) and ids.was_skipped(3) and not ids.was_skipped(1)
    assert ids.is_idle(9) and ids.is_idle(2)  # a server opens even ids; this one opened none
    ids.reset_by_us(7)
    assert ids.was_reset_by_us(7) and not ids.was_reset_by_us(1)
    for stream_id in range(9, 9 + 2 * 300, 2):  # memory is bounded: the oldest resets are forgotten
        ids.reset_by_us(stream_id)
    assert not ids.was_reset_by_us(7)
    client = StreamIds(is_client=True)
    client.opened_locally(1)
    client.opened_locally(3)
    assert not client.is_idle(3) and client.is_idle(5) and client.is_idle(2)


def test_the_reset_budget_allows_a_burst_then_the_rate():
    budget = ResetBudget(10, now=0.0)
    assert all(budget.spend(0.0) for _ in range(10))
    assert not budget.spend(0.0)
    assert budget.spend(0.11)  # one token back after a tenth of a second
    assert not budget.spend(0.11)
    assert all(budget.spend(t / 10) for t in range(20, 40))  # at the rate: never empty


def test_limits_advertise_what_they_enforce():
    limits = Http2Limits(max_concurrent_streams=8, max_header_list_size=4096, header_table_size=64)
    assert limits.settings() == {f.SETTINGS_MAX_HEADER_LIST_SIZE: 4096, f.SETTINGS_MAX_CONCURRENT_STREAMS: 8,
                                 f.SETTINGS_HEADER_TABLE_SIZE: 64}  # fmt: skip
    assert f.SETTINGS_HEADER_TABLE_SIZE not in Http2Limits().settings()  # 4096 is the default: not sent


def test_the_rapid_reset_guard_counts_streams_reset_young_only():
    """Three streams reset at once trip a bucket of two; three reset after a long life do not."""
    import asyncio

    from gateway.http2.connection import Http2Connection, Stream
    from gateway.http2.header_codec import encode_block
    from tests.gateway.http2.test_client_role import frames_of

    class Call(Stream):
        def on_headers(self, headers, end_stream): ...
        def on_data(self, data, end_stream): ...
        def on_reset(self, error_code): ...

    class Server(Http2Connection):
        def on_new_stream(self, stream_id, headers, end_stream):
            self.add_stream(Call(self), stream_id)

    block = encode_block(REQUEST)

    def goaways(age: float) -> list[bytes]:
        async def run():
            server = Server(Http2Limits(max_resets_per_second=2))
            transport = MemoryTransport()
            server.connection_made(transport)
            server.data_received(f.PREFACE + f.pack_settings({}))
            server.data_received(b"".join(f.pack_frame(f.HEADERS, f.END_HEADERS, sid, block) for sid in (1, 3, 5)))
            for stream in server.streams.values():
                stream.opened_at -= age
            server.data_received(b"".join(f.pack_rst_stream(sid, f.CANCEL) for sid in (1, 3, 5)))
            await asyncio.sleep(0)
            written = bytes(transport.written)
            return [payload for kind, _, _, payload in frames_of(f.PREFACE + written) if kind == f.GOAWAY]

        return asyncio.run(run())

    (payload,) = goaways(age=0.0)
    assert f.unpack_goaway(payload)[1] == f.ENHANCE_YOUR_CALM and payload[8:] == b"too_many_resets"
    assert goaways(age=2.0) == []
