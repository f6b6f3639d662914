"""Grammar specs are plain data, validated where they enter; a choice list becomes exact EBNF."""

from __future__ import annotations

import pytest

from engines.grammar.spec import (
    MAX_CHOICES,
    MAX_GRAMMAR_BYTES,
    GrammarKind,
    choice_spec,
    ebnf_literal,
    json_schema_spec,
)
from engines.sampling.params import InvalidRequestError


def test_a_schema_is_kept_as_the_client_wrote_it_because_key_order_is_output_order():
    text = '{"type": "object", "properties": {"b": {}, "a": {}}}'
    assert json_schema_spec(text).text == text
    assert json_schema_spec("true").kind is GrammarKind.JSON_SCHEMA


def test_a_schema_at_the_size_bound_passes_and_one_byte_more_is_refused():
    padded = "{" + " " * (MAX_GRAMMAR_BYTES - 2) + "}"
    assert json_schema_spec(padded).text == padded
    with pytest.raises(InvalidRequestError, match=f"is {MAX_GRAMMAR_BYTES + 1} bytes; at most {MAX_GRAMMAR_BYTES}"):
        json_schema_spec(padded + " ")


def test_a_schema_nested_past_the_parser_is_refused_not_crashed():
    with pytest.raises(InvalidRequestError, match=r"structured_output\.json_schema is nested too deeply"):
        json_schema_spec('{"a":' * 5000 + "1" + "}" * 5000)


def test_choices_are_escaped_so_no_character_is_read_as_syntax():
    assert ebnf_literal('a"b\\c') == '"a\\"b\\\\c"'
    assert ebnf_literal("e\nf\t") == '"e\\u000af\\u0009"'
    assert ebnf_literal("été 😀") == '"\\u00e9t\\u00e9 \\U0001f600"'
    assert choice_spec(["yes", "no", ""]).text == 'root ::= "yes" | "no" | ""'


def test_too_many_choices_are_refused():
    with pytest.raises(InvalidRequestError, match=f"at most {MAX_CHOICES} are allowed"):
        choice_spec(["x"] * (MAX_CHOICES + 1))
