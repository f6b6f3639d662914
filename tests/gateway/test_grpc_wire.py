"""gRPC-on-HTTP/2 helpers the relay uses: reading an engine's trailers, what metadata it relays,
request inflation with its bounds, and spotting the first token in compressed streams."""

from __future__ import annotations

import gzip
import random
import struct
import zlib

import grpc
import pytest

from gateway.grpc_wire import MessageScanner, Refusal, ResponseStatus, inflate, read_request, relayed_metadata
from gateway.http2.header_codec import encode_literal

DELTA_TAG = 0x12


def framed(payload: bytes, flag: int = 0) -> bytes:
    return struct.pack(">BL", flag, len(payload)) + payload


def test_trailers_are_read_with_details_and_custom_metadata():
    headers = [
        (b"grpc-status", b"9"),
        (b"grpc-message", b"the%20engine%20says%20no"),
        (b"grpc-status-details-bin", b"CAkSBHRleHQ"),
        (b"x-engine-note", b"kept"),
        (b"x-engine-trace-bin", b"AAEC"),
    ]
    status = ResponseStatus.read(headers)
    assert status.code is grpc.StatusCode.FAILED_PRECONDITION and status.message == "the engine says no"
    assert status.details_field == encode_literal(b"grpc-status-details-bin", b"CAkSBHRleHQ")
    assert status.metadata == encode_literal(b"x-engine-note", b"kept") + encode_literal(b"x-engine-trace-bin", b"AAEC")


@pytest.mark.parametrize(
    ("value", "code"),
    [(None, None), (b"x", None), (b"", None), (b"99", grpc.StatusCode.UNKNOWN), (b"0", grpc.StatusCode.OK)],
)
def test_a_missing_or_unreadable_status_is_none_and_an_unknown_number_is_unknown(value, code):
    headers = [(b"grpc-status", value)] if value is not None else [(b"grpc-message", b"m")]
    assert ResponseStatus.read(headers).code is code


def test_protocol_and_hop_fields_are_never_relayed():
    headers = [
        (b":status", b"200"), (b"content-type", b"application/grpc"), (b"grpc-encoding", b"gzip"),
        (b"grpc-accept-encoding", b"gzip"), (b"te", b"trailers"), (b"x-data-parallel-rank", b"5"),
        (b"grpc-status", b"0"), (b"x-custom", b"1"),
    ]  # fmt: skip
    assert relayed_metadata(headers) == encode_literal(b"x-custom", b"1")


@pytest.mark.parametrize(("encoding", "compress"), [(b"gzip", gzip.compress), (b"deflate", zlib.compress)])
def test_inflate_takes_whole_valid_streams_only(encoding, compress):
    payload = b"\x0a\x05hello" * 10
    assert inflate(compress(payload), encoding, 1000) == payload
    assert inflate(compress(payload)[:-2], encoding, 1000) is None  # cut short
    assert inflate(compress(payload) + b"x", encoding, 1000) is None  # trailing bytes
    assert inflate(b"garbage", encoding, 1000) is None


def test_inflate_stops_past_the_limit():
    bomb = gzip.compress(b"\x00" * 10_000_000)
    inflated = inflate(bomb, b"gzip", 1000)
    assert inflated is not None and len(inflated) == 1001


def stream_of(encoding: bytes | None, compress) -> bytes:
    flag = 0 if encoding is None else 1
    wrap = (lambda payload: payload) if encoding is None else compress
    prompt = b"\x0a\x04" + b"\x0a\x02ab"  # prompt_info (field 1)
    delta = b"\x12\x03\x0a\x01x"  # delta (field 2)
    return framed(wrap(prompt * 20), flag) + framed(wrap(delta + b"\x00" * 200), flag)


@pytest.mark.parametrize(
    ("encoding", "compress"), [(None, None), (b"gzip", gzip.compress), (b"deflate", zlib.compress)]
)
@pytest.mark.parametrize("cut", [1, 2, 5, 9, 64, 100_000])
def test_the_first_delta_is_seen_in_plain_and_compressed_streams_cut_anywhere(encoding, compress, cut):
    stream = stream_of(encoding, compress)
    first_message_end = 5 + int.from_bytes(stream[1:5], "big")
    scanner = MessageScanner(DELTA_TAG)
    scanner.encoding = encoding
    completed = 0
    for start in range(0, len(stream), cut):
        completed += scanner.feed(stream[start : start + cut])
        if start + cut <= first_message_end:
            assert not scanner.watch_seen  # the prompt info is no token
    assert scanner.watch_seen and completed == 2


@pytest.mark.parametrize("watch_byte", [-1, DELTA_TAG])
def test_messages_are_counted_and_measured_whether_frames_hold_them_whole_or_in_pieces(watch_byte):
    """Whole-message frames take a short path; mixed with cut ones, every count and length holds."""
    rng = random.Random(7)
    for _ in range(200):
        payloads = [bytes([rng.choice((0x0A, DELTA_TAG))]) * rng.randrange(0, 40) for _ in range(rng.randrange(1, 12))]
        messages = [framed(payload) for payload in payloads]
        frames: list[bytes] = []
        for message in messages:  # each message whole, or cut into pieces at random points
            if rng.random() < 0.5:
                frames.append(message)
            else:
                cuts = sorted(rng.sample(range(1, len(message)), min(2, len(message) - 1)))
                frames.extend(message[a:b] for a, b in zip([0, *cuts], [*cuts, len(message)], strict=True))
        scanner = MessageScanner(watch_byte)
        completed = [scanner.feed(frame) for frame in frames]
        assert sum(completed) == len(messages)
        assert scanner.max_length == max(len(payload) for payload in payloads)
        assert scanner.watch_seen == (watch_byte >= 0 and any(p[:1] == bytes([DELTA_TAG]) for p in payloads))


def test_compressed_messages_of_an_unknown_encoding_or_corrupt_are_not_guessed():
    stream = framed(b"\x12garbage", 1)
    for encoding in (None, b"snappy", b"gzip"):
        scanner = MessageScanner(DELTA_TAG)
        scanner.encoding = encoding
        assert scanner.feed(stream) == 1 and not scanner.watch_seen


REQUEST_TYPE = "dpgate.v1.GenerateRequest"


@pytest.mark.parametrize(
    ("body", "encoding", "expected"),
    [
        (framed(b"\x0a\x01x"), None, b"\x0a\x01x"),
        (framed(b"\x0a\x01x"), b"gzip", b"\x0a\x01x"),  # an uncompressed message in a gzip call is fine
        (framed(gzip.compress(b"\x0a\x01x"), 1), b"gzip", b"\x0a\x01x"),
        (framed(zlib.compress(b"\x0a\x01x"), 1), b"deflate", b"\x0a\x01x"),
        (b"", None, (grpc.StatusCode.INVALID_ARGUMENT, f"Generate takes exactly one {REQUEST_TYPE} message")),
        (framed(b"x" * 101), None, (grpc.StatusCode.RESOURCE_EXHAUSTED,
         "request message of 101 bytes is larger than the gateway's limit of 100 bytes")),
        (framed(gzip.compress(b"x" * 1000), 1), b"gzip", (grpc.StatusCode.RESOURCE_EXHAUSTED,
         "request message of 101 (or more, uncompressed) bytes is larger than the gateway's limit of 100 bytes")),
        (framed(b""), b"br", (grpc.StatusCode.UNIMPLEMENTED,
         "grpc-encoding 'br' is not supported; use identity, deflate or gzip")),
        (framed(b"x", 1), None, (grpc.StatusCode.INVALID_ARGUMENT,
         "request message has the compressed flag but no grpc-encoding")),
        (framed(b"x", 7), b"gzip", (grpc.StatusCode.INVALID_ARGUMENT,
         "request message has an unknown compressed flag")),
        (framed(b"x", 1), b"deflate", (grpc.StatusCode.INVALID_ARGUMENT,
         f"request body is not a valid deflate-compressed {REQUEST_TYPE} message")),
    ],
)  # fmt: skip
def test_read_request_returns_the_message_or_why_it_is_refused(body, encoding, expected):
    result = read_request(body, "Generate", REQUEST_TYPE, encoding, limit=100)
    if isinstance(expected, bytes):
        assert result == expected
    else:
        assert isinstance(result, Refusal) and (result.code, result.message) == expected
