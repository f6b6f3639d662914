"""What a request asks its output to follow, validated where it enters: plain data, no xgrammar.

A `GrammarSpec` is the kind of grammar and the text the compiler gets; together with the
tokenizer it is the key of a compiled grammar. A choice list becomes an EBNF grammar here, so
every kind reaches the compiler as one string.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from dpgate.json_text import MAX_GRAMMAR_BYTES, json_type_name, load_json_field
from engines.sampling.params import InvalidRequestError, require

# MAX_GRAMMAR_BYTES (dpgate/json_text.py, shared with chat tools) bounds every grammar's source text.
MAX_CHOICES = 1024


class GrammarKind(enum.Enum):
    """The structured-output kinds of dpgate.v1 (the `StructuredOutput.kind` oneof)."""

    JSON_SCHEMA = "json_schema"
    JSON_OBJECT = "json_object"
    REGEX = "regex"
    EBNF = "ebnf"
    CHOICE = "choice"


@dataclass(frozen=True, slots=True)
class GrammarSpec:
    """`text` is what the compiler reads: a JSON schema, a regex, or an EBNF grammar (a choice list
    has been turned into one); empty for JSON_OBJECT."""

    kind: GrammarKind
    text: str

    @property
    def field(self) -> str:
        return f"structured_output.{self.kind.value}"


def json_schema_spec(schema: str) -> GrammarSpec:
    field = "structured_output.json_schema"
    _require_size(schema, field)
    document = load_json_field(schema, field, InvalidRequestError)
    require(
        isinstance(document, dict | bool),
        f"{field} must be a JSON object (or true/false), not {json_type_name(document)}",
    )
    return GrammarSpec(GrammarKind.JSON_SCHEMA, schema)


def json_object_spec() -> GrammarSpec:
    return GrammarSpec(GrammarKind.JSON_OBJECT, "")


def regex_spec(regex: str) -> GrammarSpec:
    field = "structured_output.regex"
    require(regex != "", f"{field} must not be empty")
    _require_size(regex, field)
    return GrammarSpec(GrammarKind.REGEX, regex)


def ebnf_spec(grammar: str) -> GrammarSpec:
    field = "structured_output.ebnf"
    require(grammar.strip() != "", f"{field} must not be empty")
    _require_size(grammar, field)
    return GrammarSpec(GrammarKind.EBNF, grammar)


def choice_spec(choices: list[str] | tuple[str, ...]) -> GrammarSpec:
    """One EBNF alternative per choice, each an exact string literal."""
    field = "structured_output.choice.choices"
    require(len(choices) > 0, f"{field} must hold at least one string")
    require(len(choices) <= MAX_CHOICES, f"{field} holds {len(choices)} strings; at most {MAX_CHOICES} are allowed")
    grammar = "root ::= " + " | ".join(ebnf_literal(choice) for choice in choices)
    _require_size(grammar, field)
    return GrammarSpec(GrammarKind.CHOICE, grammar)


def ebnf_literal(text: str) -> str:
    """`text` as an EBNF string literal: printable ASCII as is, `"` and `\\` escaped, everything else
    as a \\u or \\U escape, so no character of a choice can end the literal or be read as syntax."""
    out = ['"']
    for char in text:
        code = ord(char)
        if char in '"\\':
            out.append("\\" + char)
        elif 0x20 <= code < 0x7F:
            out.append(char)
        elif code <= 0xFFFF:
            out.append(f"\\u{code:04x}")
        else:
            out.append(f"\\U{code:08x}")
    out.append('"')
    return "".join(out)


def _require_size(text: str, field: str) -> None:
    size = len(text.encode())
    require(size <= MAX_GRAMMAR_BYTES, f"{field} is {size} bytes; at most {MAX_GRAMMAR_BYTES} are allowed")
