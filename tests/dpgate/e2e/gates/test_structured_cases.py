"""The structured gate's validators on real outputs that break each rule (and ones that keep it):
a gate whose validators accept anything could never fail."""

from __future__ import annotations

import json

import pytest

from dpgate.e2e.gates import structured_cases as sc
from dpgate.e2e.gates.calls import Output
from dpgate.e2e.gates.structured import judge
from dpgate.v1 import generate_pb2 as pb

PERSON_OK = {"name": "Ada Lovelace", "age": 36, "job": "engineer", "address": {"city": "London", "zip": "12345"}}


@pytest.mark.parametrize(
    ("document", "why"),
    [
        ('{"name": "Ada", "age": 36', "not JSON"),
        ({**PERSON_OK, "age": 121}, "fails the schema at ['age']"),
        ({**PERSON_OK, "job": "pilot"}, "fails the schema at ['job']"),
        ({**PERSON_OK, "address": {"city": "London", "zip": "1234"}}, "fails the schema at ['address', 'zip']"),
        ({key: value for key, value in PERSON_OK.items() if key != "address"}, "'address' is a required property"),
        ({**PERSON_OK, "name": "Ada lovelace"}, "fails the schema at ['name']"),
        ({**PERSON_OK, "name": "Sustainablesplitceptbc"}, "fails the schema at ['name']"),
        ({**PERSON_OK, "name": "Ada\\nLovelace"}, "fails the schema at ['name']"),
    ],
)
def test_a_person_that_breaks_the_schema_is_invalid(document, why):
    text = document if isinstance(document, str) else json.dumps(document)
    reason = sc.check_json_schema(sc.PERSON)(text)
    assert reason is not None and why in reason


def test_valid_documents_pass_their_schemas():
    assert sc.check_json_schema(sc.PERSON)(json.dumps(PERSON_OK)) is None
    order = {"items": [{"sku": "ABC-123", "quantity": 2, "unit_price": 9.5}], "paid": False}
    assert sc.check_json_schema(sc.ORDER)(json.dumps(order)) is None
    assert sc.check_json_schema(sc.ORDER)(json.dumps({**order, "items": []})) is not None  # minItems 1
    assert sc.check_json_schema(sc.SCORES)("[1,100]") is None
    assert sc.check_json_schema(sc.SCORES)("[1,101]") is not None
    assert sc.check_json_schema(sc.WEATHER)('{"sky":"fog","hourly_celsius":[1],"wind":{"speed_kmh":1,"direction":"N"}}')


def test_regexes_must_match_the_whole_output():
    check = sc.check_regex(sc.PHONE_REGEX)
    assert check("+1-555-123-4567") is None
    assert check("+1-555-123-45678") is not None
    assert check("call +1-555-123-4567") is not None
    assert sc.check_regex(sc.MEASUREMENT_REGEX)("Height 180 cm") is None
    assert sc.check_regex(sc.MEASUREMENT_REGEX)("height 180 cm") is not None


@pytest.mark.parametrize(
    ("text", "valid"),
    [("2024-02-28", True), ("1999-12-01", True), ("2024-02-30", False), ("20240228", False), ("2024-2-28", False)],
)
def test_dates_are_parsed_by_the_standard_library(text, valid):
    assert (sc.check_date(text) is None) is valid


@pytest.mark.parametrize(
    ("text", "valid"),
    [
        ("12+(3*4)-7", True),
        ("999", True),
        ("1+*2", False),  # not an expression
        ("(1+2", False),
        ("1.5*2", False),  # a float literal
        ("07+1", False),  # a leading zero
        ("1 + 2", False),  # a space
        ("2**3", False),  # a power is not in the grammar
        ("1/2", False),
    ],
)
def test_arithmetic_is_read_by_pythons_parser(text, valid):
    assert (sc.check_arithmetic(text) is None) is valid


def test_a_choice_must_be_one_of_the_list_exactly():
    check = sc.check_choice(sc.COLOURS)
    assert check("blue") is None
    assert check("Blue") is not None and check("blue ") is not None


def test_an_output_cut_at_max_tokens_is_invalid_even_when_its_prefix_would_pass():
    case = next(case for case in sc.CASES if case.name == "scores")
    cut = Output(token_ids=(1, 2), text="[1,2", finish_reason=pb.FINISH_REASON_LENGTH, num_prompt_tokens=3)
    assert "cut at max_tokens" in judge(case, cut)
    whole = Output(token_ids=(1, 2), text="[1,2]", finish_reason=pb.FINISH_REASON_STOP, num_prompt_tokens=3)
    assert judge(case, whole) is None


@pytest.mark.parametrize("case", sc.CASES, ids=lambda case: case.name)
def test_each_cases_longest_output_is_valid_and_fits_its_max_tokens(case):
    assert case.check(case.longest) is None
    assert case.max_tokens == len(case.longest.encode()) + 1
