"""Bad and good `x-data-parallel-rank` values, shared by the unit and end-to-end tests.

Each bad entry is (id, metadata pairs). `SENDABLE_BAD` are those a gRPC client can put on the
wire (gRPC refuses control characters and non-ASCII in text metadata on the client side, so
those are proven against the parser directly).
"""

from __future__ import annotations

KEY = "x-data-parallel-rank"

_BAD_TEXT_VALUES: dict[str, str] = {
    "empty": "",
    "spaces only": "   ",
    "minus one": "-1",
    "minus zero": "-0",
    "plus only": "+",
    "double plus": "++1",
    "plus minus": "+-1",
    "minus plus": "-+1",
    "inner space": "1 2",
    "plus then space": "+ 1",
    "decimal": "1.0",
    "trailing dot": "1.",
    "leading dot": ".5",
    "hex": "0x1",
    "hex upper": "0X1F",
    "octal prefix": "0o7",
    "binary prefix": "0b1",
    "exponent": "1e3",
    "exponent upper": "1E0",
    "nan": "nan",
    "inf": "inf",
    "word": "one",
    "underscore": "1_000",
    "comma list": "1,2",
    "semicolon list": "1;2",
    "two to the 32": "4294967296",
    "far too large": "99999999999999999999999",
    "trailing letter": "1a",
    "leading letter": "a1",
    "json": '{"rank":1}',
    "quoted": '"1"',
    "brackets": "[1]",
    "fraction": "1/2",
    "percent encoded": "%31",
}

SENDABLE_BAD: list[tuple[str, list[tuple[str, str | bytes]]]] = [
    (name, [(KEY, value)]) for name, value in _BAD_TEXT_VALUES.items()
] + [
    ("two values", [(KEY, "1"), (KEY, "1")]),
    ("two different values", [(KEY, "0"), (KEY, "1")]),
    ("binary key", [(KEY + "-bin", b"\x01")]),
    ("binary key beside text", [(KEY, "1"), (KEY + "-bin", b"\x01")]),
]

# Values no gRPC client will send (it rejects them before the call), checked on the parser alone.
UNSENDABLE_BAD: list[tuple[str, list[tuple[str, str | bytes]]]] = [
    ("tab inside", [(KEY, "1\t2")]),
    ("non-ascii digit", [(KEY, "١")]),
    ("fullwidth digit", [(KEY, "１")]),
    ("superscript", [(KEY, "¹")]),
    ("nbsp padded", [(KEY, "\u00a01")]),
    ("non-ascii bytes", [(KEY, b"\xff")]),
    ("utf8 bytes", [(KEY, "é".encode())]),
    ("nul", [(KEY, "1\x00")]),
]

# (value, rank) pairs that must be accepted.
GOOD: list[tuple[str, int]] = [
    ("0", 0),
    ("1", 1),
    ("+1", 1),
    ("007", 7),
    ("+0", 0),
    ("00", 0),
    (" 1", 1),
    ("1 ", 1),
    ("  +3  ", 3),
    ("4294967295", 2**32 - 1),
    ("0004294967295", 2**32 - 1),
]
