"""The gateway's HPACK decoder: its short path agrees with hpack's decoder, errors included."""

from __future__ import annotations

import random

import hpack
import pytest

from gateway.http2.header_codec import Decoder, encode_literal

FIELDS = [
    (b":method", b"POST"),
    (b":path", b"/dpgate.v1.InferenceService/Generate"),
    (b"content-type", b"application/grpc"),
    (b"te", b"trailers"),
    (b"user-agent", b"grpc-python-asyncio/1.76.0"),
    (b"x-tenant", b"a" * 40),
    (b"grpc-status", b"0"),
]


def warmed_pair() -> tuple[hpack.Encoder, Decoder, hpack.Decoder]:
    """An encoder and two decoders that have seen the same block, so the dynamic table holds FIELDS."""
    encoder = hpack.Encoder()
    block = encoder.encode(FIELDS)
    fast, general = Decoder(), hpack.Decoder()
    assert fast.decode(block, raw=True) == general.decode(block, raw=True)
    return encoder, fast, general


def assert_decodes_like_hpack(fast: Decoder, general: hpack.Decoder, block: bytes) -> None:
    """`fast` decodes `block` to what `general` (hpack's own decoder) does, or raises the same error type."""
    try:
        expected = general.decode(block, raw=True)
    except hpack.HPACKError as error:
        with pytest.raises(type(error)):
            fast.decode(block, raw=True)
    else:
        assert fast.decode(block, raw=True) == expected


def test_a_repeated_block_is_one_byte_indexes_and_decodes_like_hpack():
    encoder, fast, general = warmed_pair()
    block = encoder.encode(FIELDS)
    assert all(0x81 <= byte <= 0xFE for byte in block)
    assert fast.decode(block, raw=True) == general.decode(block, raw=True) == FIELDS


def test_random_index_blocks_decode_like_hpack_or_fail_like_it():
    _, fast, general = warmed_pair()
    rng = random.Random(7)
    for _ in range(3000):
        block = bytes(
            rng.choice([rng.randint(0x80, 0xFF), rng.randint(0x81, 0x81 + 61 + 8)]) for _ in range(rng.randint(0, 12))
        )
        assert_decodes_like_hpack(fast, general, block)


def random_representation(rng: random.Random) -> bytes:
    """One field representation, mostly of the kinds the short path reads, sometimes broken."""
    kind = rng.randrange(8)
    if kind < 3:
        return bytes((rng.randint(0x81, 0x81 + 61 + 8),))  # an index, sometimes past the table
    if kind < 6:
        first = rng.choice((0x00, 0x10))
        return bytes((first,)) + random_string(rng) + random_string(rng)
    return rng.choice((b"\x80", b"\xff\x05", b"\x3f\xe1\x1f", b"\x20", b"\x44\x01a", b"\x0f\x0d\x01x", b"\x00"))


def random_string(rng: random.Random) -> bytes:
    length = rng.choice((0, 1, 5, 40, 126))
    if rng.random() < 0.1:
        return bytes((0x80 | length,)) + bytes(rng.randrange(256) for _ in range(length))  # Huffman
    if rng.random() < 0.05:
        return b"\x7f\x00" + b"x" * 127
    if rng.random() < 0.05:
        return bytes((length + 3,)) + b"x" * length  # runs past the block
    return bytes((length,)) + bytes(rng.randrange(32, 127) for _ in range(length))


def test_random_blocks_of_indexes_and_literals_decode_like_hpack_or_fail_like_it():
    _, fast, general = warmed_pair()
    rng = random.Random(11)
    fast_paths = 0
    for _ in range(5000):
        block = b"".join(random_representation(rng) for _ in range(rng.randint(0, 6)))
        fast_paths += fast._decode_plain(block) is not None
        assert_decodes_like_hpack(fast, general, block)
        assert list(fast.header_table.dynamic_entries) == list(general.header_table.dynamic_entries)
    assert fast_paths > 1000  # the comparison covers the short path, not only the fallback


def test_the_header_list_limit_holds_on_the_fast_path():
    encoder, fast, _ = warmed_pair()
    block = encoder.encode(FIELDS)
    fast.max_header_list_size = sum(len(name) + len(value) + 32 for name, value in FIELDS) - 1
    with pytest.raises(hpack.OversizedHeaderListError):
        fast.decode(block, raw=True)


@pytest.mark.parametrize("remembered", [False, True])
def test_a_table_the_peer_has_not_shrunk_is_refused_on_the_fast_path_too(remembered):
    encoder, fast, _ = warmed_pair()
    block = encoder.encode(FIELDS)
    if remembered:  # decoded (and remembered) while the table still fit the allowed size
        assert fast.decode(block, raw=True) == FIELDS
    fast.max_allowed_table_size = 0
    with pytest.raises(hpack.InvalidTableSizeError):
        fast.decode(block, raw=True)


@pytest.mark.parametrize("length", [126, 127, 128, 300])
def test_lengths_around_the_one_byte_prefix_decode_like_hpack(length):
    _, fast, general = warmed_pair()
    value = b"x" * (length - 1) + b"\x82"  # a last byte that would also read as an index
    block = encode_literal(b"x-long", value)  # without indexing, no Huffman: the short path's kind
    assert fast.decode(block, raw=True) == general.decode(block, raw=True) == [(b"x-long", value)]


NAMES = [b"x-request-id", b"x" * 126, b"x" * 127, b"x" * 200, b":authority", b":path", b"www-authenticate"]


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("length", [0, 1, 126, 127, 128, 300])
def test_literals_decode_to_their_field_whatever_the_lengths_and_name_index(name, length):
    """Short and long names and values, a name of the static table below index 15 and above it."""
    value = b"v" * length
    assert hpack.Decoder().decode(encode_literal(name, value), raw=True) == [(name, value)]


def test_repeated_blocks_decode_like_hpack_while_the_table_changes_under_them():
    """Blocks repeat (the remembered plain ones are looked up, not read) while new values are
    indexed into a small table that evicts old ones, so a repeated block's indexes come to mean
    other fields: each decode must still equal the general decoder's."""
    encoder, fast, general = hpack.Encoder(), Decoder(), hpack.Decoder()
    for codec in (encoder, fast, general):
        codec.header_table_size = 512  # FIELDS (409 bytes) and two or three x-values
    rng = random.Random(5)
    seen: list[bytes] = []
    remembered = 0
    for _ in range(3000):
        if seen and rng.random() < 0.6:
            block = rng.choice(seen)  # a block sent before, decoded against today's table
        else:
            fields = rng.sample(FIELDS, rng.randint(1, len(FIELDS)))
            if rng.random() < 0.1:
                fields.append((b"x-value", str(rng.randrange(50)).encode()))  # indexed: the table changes
            block = encoder.encode(fields)
            seen = [*seen, block][-12:]
        remembered += block in fast._plain_blocks
        assert_decodes_like_hpack(fast, general, block)
        assert list(fast.header_table.dynamic_entries) == list(general.header_table.dynamic_entries)
    assert remembered > 300  # the comparison covers remembered blocks, not only fresh ones


def test_a_remembered_block_still_meets_the_header_list_limit_and_is_the_callers_to_keep():
    encoder, fast, _ = warmed_pair()
    block = encoder.encode(FIELDS)
    first = fast.decode(block, raw=True)
    first.append((b"x-added", b"by the caller"))
    assert fast.decode(block, raw=True) == FIELDS  # remembered, and not changed by the caller
    fast.max_header_list_size = sum(len(name) + len(value) + 32 for name, value in FIELDS) - 1
    with pytest.raises(hpack.OversizedHeaderListError):
        fast.decode(block, raw=True)
