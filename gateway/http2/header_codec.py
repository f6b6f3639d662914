"""HPACK header blocks (RFC 7541): decoding with the `hpack` package, encoding without state.

Decoding needs the peer's dynamic table, so each connection keeps a `Decoder`: an `hpack.Decoder`
with a short path for the blocks gRPC repeats on every call. Encoding never adds to a dynamic
table: every field is either a static-table index or a literal "without indexing". The blocks
are a little larger, but they depend on nothing but their fields, so the gateway's constant
fields are encoded once and reused for every call.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from typing import Final

import hpack
from hpack import OversizedHeaderListError
from hpack.table import HeaderTable

__all__ = ["Decoder", "encode_block", "encode_field", "encode_literal"]

_STATIC_TABLE: Final = HeaderTable.STATIC_TABLE
_STATIC_LENGTH: Final = len(_STATIC_TABLE)
_ENTRY_OVERHEAD: Final = 32  # RFC 7541 section 4.1: an entry's size is its name, its value and 32
_STATIC_SIZES: Final = tuple(len(name) + len(value) + _ENTRY_OVERHEAD for name, value in _STATIC_TABLE)
_LITERAL_NEW_NAME: Final = (0x00, 0x10)  # literal without indexing / never indexed, name as a string
_MAX_REMEMBERED_BLOCK: Final = 256  # bytes: a gRPC call's blocks are 8 to 100
_MAX_REMEMBERED_BLOCKS: Final = 16


class Decoder(hpack.Decoder):
    """`hpack.Decoder`, with the blocks gRPC repeats on every call decoded on a short path.

    Once a gRPC client's dynamic table holds its fields, each later request's header block is
    one-byte table indexes (eight bytes for eight fields); an engine's response headers are the
    same, and its trailers add an unindexed literal or two (`grpc-message` with an empty value).
    The general decoder spends about 15 us on such a block: a log call per field, a tuple
    subclass per field, an integer decoder per byte, and it was a quarter of the gateway's CPU
    per unary call. Neither kind of field changes the dynamic table, so the short path reads
    them without touching decoder state, enforces the same header list limit, and hands any
    other block (Huffman strings, indexing literals, size updates, any error) to the general
    decoder, which decodes it from the start and raises its own errors. A plain block seen before
    (since the general decoder last ran) is not even read again: see `_plain_blocks`.
    """

    def __init__(self, max_header_list_size: int = hpack.hpack.DEFAULT_MAX_HEADER_LIST_SIZE) -> None:
        # Plain blocks decoded since the dynamic table last changed, by their bytes, with their
        # header list size: a gRPC peer sends the same few blocks on every call (a request's, a
        # response's, the trailers), and the fields a plain block stands for change only when
        # the table does, which only the general decoder changes. Small blocks only, and a few:
        # a peer sending new ones each time costs a lookup a block, never memory. A block is
        # remembered only while the table fits the size allowed (else the peer owes a size
        # update, which the general decoder reads), and forgotten when that allowance changes.
        # The third part is the block's `verdicts`.
        self._plain_blocks: dict[bytes, tuple[list[tuple[bytes, bytes]], int, dict[object, object]]] = {}
        # After a decode: where the caller may keep what it concluded from this block's fields
        # (the header rules' verdicts), for as long as the same bytes stand for the same fields;
        # None when the block was not a plain one. Each remembered block has its own.
        self.verdicts: dict[object, object] | None = None
        super().__init__(max_header_list_size)

    @property
    def max_allowed_table_size(self) -> int:
        """hpack's attribute (the table size this side advertised and the peer acknowledged)."""
        return self._max_allowed_table_size

    @max_allowed_table_size.setter
    def max_allowed_table_size(self, size: int) -> None:
        self._max_allowed_table_size = size
        self._plain_blocks.clear()

    def decode(self, data: bytes, raw: bool = False) -> list[tuple[bytes, bytes]]:  # type: ignore[override]
        self.verdicts = None
        if raw:
            plain = self._plain_blocks.get(data)
            # (`header_table_size` and `max_allowed_table_size` are properties: a remembered
            # block skips reading them, since neither changed since it was remembered.)
            if plain is None and self.header_table_size <= self.max_allowed_table_size:
                decoded = self._decode_plain(data)
                if decoded is not None:
                    plain = (decoded[0], decoded[1], {})
                    if len(data) <= _MAX_REMEMBERED_BLOCK:
                        if len(self._plain_blocks) >= _MAX_REMEMBERED_BLOCKS:
                            self._plain_blocks.clear()
                        self._plain_blocks[data] = plain
            if plain is not None:
                headers, size, verdicts = plain
                if size > self.max_header_list_size:
                    limit = self.max_header_list_size
                    raise OversizedHeaderListError(f"A header list larger than {limit} has been received")
                self.verdicts = verdicts
                return headers.copy()  # (the caller's to keep)
        self._plain_blocks.clear()  # whatever the block does to the dynamic table
        return super().decode(data, raw)  # type: ignore[return-value]

    def _decode_plain(self, data: bytes) -> tuple[list[tuple[bytes, bytes]], int] | None:
        """The fields and the header list's size, if the block is only one-byte indexes and plain
        unindexed literals; else None.

        The caller checks the header list limit: a block that is not plain after all goes to the
        general decoder, which finds the same excess at the same field."""
        dynamic = self.header_table.dynamic_entries
        table_length = _STATIC_LENGTH + len(dynamic)
        headers: list[tuple[bytes, bytes]] = []
        append = headers.append
        size = 0
        position = 0
        end = len(data)
        while position < end:
            byte = data[position]
            position += 1
            if 0x80 < byte < 0xFF:  # indexed field, index 1 to 126 (0x80 is index 0, 0xFF goes on)
                index = byte - 0x81
                if index < _STATIC_LENGTH:
                    append(_STATIC_TABLE[index])
                    size += _STATIC_SIZES[index]
                    continue
                if index >= table_length:
                    return None
                field = dynamic[index - _STATIC_LENGTH]
            elif byte in _LITERAL_NEW_NAME:
                name, position = _plain_string(data, position)
                if name is None:
                    return None
                value, position = _plain_string(data, position)
                if value is None:
                    return None
                field = (name, value)
            else:
                return None
            size += len(field[0]) + len(field[1]) + _ENTRY_OVERHEAD
            append(field)
        return headers, size


def _plain_string(data: bytes, position: int) -> tuple[bytes | None, int]:
    """A string literal without Huffman coding and under 127 bytes at `position`, and where it ends."""
    if position >= len(data):
        return None, position
    length = data[position]
    if length >= 0x7F:  # Huffman-coded (H bit) or a multi-byte length
        return None, position
    start = position + 1
    stop = start + length
    if stop > len(data):
        return None, position
    return data[start:stop], stop


_STATIC_FIELDS: Final[dict[tuple[bytes, bytes], int]] = {}
_STATIC_NAMES: Final[dict[bytes, int]] = {}
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
    if len(value) < 0x7F:  # each length fits its prefix's byte: no integer encoding (a call's x-request-id)
        if name_index is None and len(name) < 0x7F:
            return b"\x00" + bytes((len(name),)) + name + bytes((len(value),)) + value
        if name_index is not None and name_index < 0x0F:
            return bytes((name_index, len(value))) + value
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
