"""What the structured-output gate asks for, and how each output is checked by a validator that
knows nothing of the grammar engine: `jsonschema` for schemas, `re.fullmatch` for regexes, the
standard library's own parsers for the EBNF grammars, membership for choices.

Every grammar here bounds its output's length (strings by a pattern or an enum, so no escapes
either; arrays by maxItems; numbers by a minimum and maximum, for which xgrammar allows at most six
decimals). Each case names the longest output its grammar derives, and its max_tokens is that
many bytes plus one for the stop token: a token that advances a grammar spells at least one byte,
so a complete output always fits, and an output cut at max_tokens is a failure, never an excuse.
`json_object` is left out for that reason: it bounds nothing, and gemma3-270m, greedy, repeats an
"isbn" key until any max_tokens runs out.
"""

from __future__ import annotations

import ast
import datetime
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jsonschema

from dpgate.v1 import generate_pb2 as pb

PERSON = {
    "type": "object",
    "properties": {
        # Not "( [A-Z][a-z]{1,11})?" for an optional surname: xgrammar 0.2.9 then lets a JSON-schema
        # pattern accept strings it rejects (see docs/accuracy.md, "Structured outputs").
        "name": {"type": "string", "pattern": "^[A-Z][a-z]{1,11} [A-Z][a-z]{1,11}$"},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "job": {"type": "string", "enum": ["engineer", "doctor", "teacher", "artist"]},
        "address": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "pattern": "^[A-Z][a-z]{1,19}$"},
                "zip": {"type": "string", "pattern": "^[0-9]{5}$"},
            },
            "required": ["city", "zip"],
        },
    },
    "required": ["name", "age", "job", "address"],
}
ORDER = {
    "type": "object",
    "properties": {
        "items": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "sku": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{3}$"},
                    "quantity": {"type": "integer", "minimum": 1, "maximum": 99},
                    "unit_price": {"type": "number", "minimum": 0, "maximum": 1000},
                },
                "required": ["sku", "quantity", "unit_price"],
            },
            "minItems": 1,
            "maxItems": 3,
        },
        "paid": {"type": "boolean"},
    },
    "required": ["items", "paid"],
}
WEATHER = {
    "type": "object",
    "properties": {
        "sky": {"enum": ["sunny", "cloudy", "rain", "snow"]},
        "hourly_celsius": {
            "type": "array",
            "items": {"type": "integer", "minimum": -50, "maximum": 60},
            "minItems": 1,
            "maxItems": 4,
        },
        "wind": {
            "type": "object",
            "properties": {
                "speed_kmh": {"type": "integer", "minimum": 0, "maximum": 300},
                "direction": {"enum": ["N", "E", "S", "W"]},
            },
            "required": ["speed_kmh", "direction"],
        },
    },
    "required": ["sky", "hourly_celsius", "wind"],
}
SCORES = {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 100}, "minItems": 2, "maxItems": 5}

MEASUREMENT_REGEX = r"[A-Z][a-z]{2,9} [0-9]{1,3} (cm|kg|km)"
PHONE_REGEX = r"\+1-[0-9]{3}-[0-9]{3}-[0-9]{4}"
# Months 01-12 and days 01-28, so every derivation is a real calendar date.
DATE_EBNF = """root ::= year "-" month "-" day
year ::= [12] [0-9] [0-9] [0-9]
month ::= "0" [1-9] | "1" [0-2]
day ::= "0" [1-9] | "1" [0-9] | "2" [0-8]
"""
# One to three terms, each a 1-3 digit number or one parenthesised pair, no spaces: bounded length.
ARITHMETIC_EBNF = """root ::= term | term op term | term op term op term
term ::= number | "(" number op number ")"
op ::= "+" | "-" | "*"
number ::= [1-9] | [1-9] [0-9] | [1-9] [0-9] [0-9]
"""
COLOURS = ("red", "green", "blue", "yellow")
# Choices that are prefixes of each other: the grammar must let the output end after "agree".
AGREEMENT = ("agree", "strongly agree", "disagree", "strongly disagree")


def check_json_schema(schema: dict[str, Any]) -> Callable[[str], str | None]:
    validator = jsonschema.Draft202012Validator(schema, format_checker=jsonschema.FormatChecker())

    def check(text: str) -> str | None:
        try:
            document = json.loads(text)
        except json.JSONDecodeError as error:
            return f"not JSON: {error}"
        failure = jsonschema.exceptions.best_match(validator.iter_errors(document))
        return None if failure is None else f"fails the schema at {list(failure.absolute_path)}: {failure.message}"

    return check


def check_regex(pattern: str) -> Callable[[str], str | None]:
    compiled = re.compile(pattern)
    return lambda text: None if compiled.fullmatch(text) else f"does not fully match {pattern!r}"


def check_date(text: str) -> str | None:
    """A date in exactly the YYYY-MM-DD shape: parsed by the standard library and written back equal."""
    try:
        date = datetime.date.fromisoformat(text)
    except ValueError as error:
        return f"not a date: {error}"
    return None if date.isoformat() == text else f"a date, but not written as YYYY-MM-DD: {text!r}"


_ARITHMETIC_NODES = (ast.Expression, ast.BinOp, ast.Add, ast.Sub, ast.Mult, ast.Constant)


def check_arithmetic(text: str) -> str | None:
    """Python's parser reads it as one expression of only +, -, * over integer literals, with no
    spaces and no leading zeros (what the grammar derives; its nesting depth is not rechecked)."""
    if not re.fullmatch(r"[0-9+*()-]+", text) or re.search(r"(?<![0-9])0", text):
        return f"characters outside the grammar's: {text!r}"
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError as error:
        return f"not an expression: {error.msg}"
    for node in ast.walk(tree):
        if not isinstance(node, _ARITHMETIC_NODES) or (isinstance(node, ast.Constant) and type(node.value) is not int):
            return f"{type(node).__name__} is not integer arithmetic: {text!r}"
    return None


def check_choice(choices: tuple[str, ...]) -> Callable[[str], str | None]:
    return lambda text: None if text in choices else f"{text!r} is not one of {list(choices)}"


@dataclass(frozen=True, slots=True)
class Case:
    """One structured-output request (kind = the StructuredOutput oneof it sets), its validator, and
    the longest output its grammar derives (JSON as xgrammar writes it: `", "` and `": "`)."""

    name: str
    kind: str
    prompt: str
    structured_output: pb.StructuredOutput
    check: Callable[[str], str | None]
    longest: str

    @property
    def max_tokens(self) -> int:
        return len(self.longest.encode()) + 1


def _schema_case(name: str, prompt: str, schema: dict[str, Any], longest: str) -> Case:
    return Case(
        name,
        "json_schema",
        prompt,
        pb.StructuredOutput(json_schema=json.dumps(schema)),
        check_json_schema(schema),
        longest,
    )


_ITEM = '{"sku": "ABC-123", "quantity": 99, "unit_price": 1000.000000}'
CASES = (
    _schema_case(
        "person",
        "A record of a fictional person, in JSON:\n",
        PERSON,
        '{"name": "Abcdefghijkl Abcdefghijkl", "age": 120, "job": "engineer", '
        '"address": {"city": "Abcdefghijklmnopqrst", "zip": "12345"}}',
    ),
    _schema_case(
        "order", "An online shop's order, in JSON:\n", ORDER, f'{{"items": [{_ITEM}, {_ITEM}, {_ITEM}], "paid": false}}'
    ),
    _schema_case(
        "weather",
        "Today's weather report, in JSON:\n",
        WEATHER,
        '{"sky": "cloudy", "hourly_celsius": [-50, -50, -50, -50], "wind": {"speed_kmh": 300, "direction": "N"}}',
    ),
    _schema_case("scores", "Test scores of a few students, as a JSON list:\n", SCORES, "[100, 100, 100, 100, 100]"),
    Case(
        "measurement",
        "regex",
        "A named measurement:",
        pb.StructuredOutput(regex=MEASUREMENT_REGEX),
        check_regex(MEASUREMENT_REGEX),
        "Abcdefghij 999 cm",
    ),
    Case(
        "phone",
        "regex",
        "A US phone number:",
        pb.StructuredOutput(regex=PHONE_REGEX),
        check_regex(PHONE_REGEX),
        "+1-555-123-4567",
    ),
    Case("date", "ebnf", "The date of a famous event:", pb.StructuredOutput(ebnf=DATE_EBNF), check_date, "1999-12-28"),
    Case(
        "arithmetic",
        "ebnf",
        "An arithmetic expression:",
        pb.StructuredOutput(ebnf=ARITHMETIC_EBNF),
        check_arithmetic,
        "(999*999)*(999*999)*(999*999)",
    ),
    Case(
        "colour",
        "choice",
        "My favourite colour is",
        pb.StructuredOutput(choice=pb.ChoiceList(choices=COLOURS)),
        check_choice(COLOURS),
        "yellow",
    ),
    Case(
        "agreement",
        "choice",
        "Asked whether cats are better than dogs, I",
        pb.StructuredOutput(choice=pb.ChoiceList(choices=AGREEMENT)),
        check_choice(AGREEMENT),
        "strongly disagree",
    ),
)
