"""JSON text that a request carries: read strictly, described in words, and bounded in size.

Shared by the engine's structured outputs (engines/grammar/spec.py) and the chat tools that both
the engine and the gateway read (dpgate/chat/tools.py), so a tool's parameters are parsed by one
rule wherever they are read.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

# A JSON schema of 26 KB with nested string patterns took xgrammar 8 s to compile on a 2-core
# AVX2 machine; the bound keeps a single request from occupying a compile thread for minutes.
# A chat request's tool parameters become one grammar too, so they share it.
MAX_GRAMMAR_BYTES = 32 * 1024


def strict_json_loads(text: str) -> Any:
    """JSON as RFC 8259 has it: Python's json takes NaN, Infinity and -Infinity, which are not JSON
    (and which the grammar library then fails on with its own internal check message)."""
    return json.loads(text, parse_constant=_refuse_constant)


def load_json_field(text: str, field: str, error: type[Exception]) -> Any:
    """A request field's JSON text, strictly read, or `error` naming the field and what is wrong
    (not JSON, with the parser's reason; nested past Python's recursion limit)."""
    try:
        return strict_json_loads(text)
    except ValueError as reason:  # json.JSONDecodeError, or NaN / Infinity
        raise error(f"{field} is not valid JSON: {reason}") from None
    except RecursionError:
        raise error(f"{field} is nested too deeply") from None


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON value")


def json_type_name(value: Any) -> str:
    """The JSON name of a value's type, for messages a client reads (never a Python type name):
    parsed JSON, or values read from a protobuf Struct (mappings, sequences)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, Mapping):
        return "an object"
    if isinstance(value, list | tuple):
        return "an array"
    return "an unsupported value"
