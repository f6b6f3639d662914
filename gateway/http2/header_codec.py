"""HPACK header blocks (RFC 7541): decoding with the `hpack` package, encoding without state.

Decoding needs the peer's dynamic table, so each connection keeps an `hpack.Decoder`. Encoding
never adds to a dynamic table: every field is either a static-table index or a literal "without
indexing". The blocks are a little larger, but they depend on nothing but their fields, so the
gateway's constant fields are encoded once and reused for every call.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable

from hpack import Decoder
from hpack.table import HeaderTable

__all__ = ["Decoder", "encode_block", "encode_field", "encode_literal"]

_STATIC_FIELDS: dict[tuple[bytes, bytes], int] = {}
_STATIC_NAMES: dict[bytes, int] = {}
for _index, (_name, _value) in enumerate(HeaderTable.STATIC_TABLE, start=1):
    _STATIC_FIELDS.setdefault((_name, _value), _index)
    _STATIC_NAMES.setdefault(_name, _index)


def _integer(value: int, prefix_bits: int, first_byte: int) -> bytes:
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes((first_byte | value,))
    out = bytearray((first_byte | limit,))
    value -= limit
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _string(value: bytes) -> bytes:
    return _integer(len(value), 7, 0x00) + value  # no Huffman coding: the H bit stays 0


def encode_literal(name: bytes, value: bytes) -> bytes:
    """One field as a literal without indexing (for values that change from call to call)."""
    name_index = _STATIC_NAMES.get(name)
    if name_index is not None:
        return _integer(name_index, 4, 0x00) + _string(value)
    return b"\x00" + _string(name) + _string(value)


@functools.lru_cache(maxsize=512)
def encode_field(name: bytes, value: bytes) -> bytes:
    """One field, cached: for the fields that repeat on every call."""
    index = _STATIC_FIELDS.get((name, value))
    if index is not None:
        return _integer(index, 7, 0x80)
    return encode_literal(name, value)


def encode_block(fields: Iterable[tuple[bytes, bytes]]) -> bytes:
    return b"".join(encode_field(name, value) for name, value in fields)
