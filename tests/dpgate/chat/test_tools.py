"""Tool definitions validated where they enter (dpgate/chat/tools.py): every refusal names the field."""

from __future__ import annotations

import json

import pytest

from dpgate.chat.tools import MAX_TOOLS, InvalidToolError, ToolSpec, parse_tools
from dpgate.json_text import MAX_GRAMMAR_BYTES
from dpgate.v1 import generate_pb2 as pb
from engines.sampling.params import InvalidRequestError

WEATHER_SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}


def refusal(tools: list[pb.Tool]) -> str:
    with pytest.raises(InvalidToolError) as raised:
        parse_tools(tools)
    assert isinstance(raised.value, InvalidRequestError)  # INVALID_ARGUMENT through the servicer's table
    return str(raised.value)


def test_a_proto_tool_becomes_a_tool_spec():
    tool = pb.Tool(name="get_weather", description="Weather.", parameters=json.dumps(WEATHER_SCHEMA))
    assert parse_tools([tool]) == [ToolSpec("get_weather", "Weather.", WEATHER_SCHEMA)]


def test_empty_parameters_mean_an_object_with_no_properties():
    assert parse_tools([pb.Tool(name="now")])[0].parameters == {"type": "object", "properties": {}}
    assert parse_tools([pb.Tool(name="now", parameters="  \n")])[0].parameters == {"type": "object", "properties": {}}


def test_a_schema_without_a_type_is_taken_as_an_object_schema():
    assert parse_tools([pb.Tool(name="f", parameters='{"properties": {}}')])[0].parameters == {"properties": {}}


def test_the_template_entry_is_the_openai_function_shape():
    spec = ToolSpec("f", "does f", WEATHER_SCHEMA)
    assert spec.as_template_tool() == {
        "type": "function",
        "function": {"name": "f", "description": "does f", "parameters": WEATHER_SCHEMA},
    }


@pytest.mark.parametrize("name", ["a", "get_weather", "get-weather-2", "A" * 64, "_x", "9"])
def test_names_of_letters_digits_underscores_and_hyphens_up_to_64_are_accepted(name):
    assert parse_tools([pb.Tool(name=name)])[0].name == name


@pytest.mark.parametrize("name", ["", "get weather", "a.b", "A" * 65, "café", "f(x)", "a\n"])
def test_other_names_are_refused_naming_the_field_and_the_rule(name):
    message = refusal([pb.Tool(name="ok"), pb.Tool(name=name)])
    assert message == f"tools[1].name {name!r} must be 1 to 64 letters, digits, underscores or hyphens"


def test_two_tools_of_one_name_are_refused():
    message = refusal([pb.Tool(name="f"), pb.Tool(name="g"), pb.Tool(name="f")])
    assert message == "tools[2].name 'f' is already the name of tools[0]"


@pytest.mark.parametrize(
    "parameters, message",
    [
        ("{", "tools[1].parameters is not valid JSON: Expecting property name enclosed in double quotes"),
        ('{"type": "object"} x', "tools[1].parameters is not valid JSON: Extra data"),
        ('{"a": NaN}', "tools[1].parameters is not valid JSON: NaN is not a JSON value"),
        ("[1]", "tools[1].parameters must be a JSON schema (a JSON object), not an array"),
        ('"object"', "tools[1].parameters must be a JSON schema (a JSON object), not a string"),
        ("null", "tools[1].parameters must be a JSON schema (a JSON object), not null"),
        ("3", "tools[1].parameters must be a JSON schema (a JSON object), not a number"),
        ('{"type": "string"}', 'tools[1].parameters must describe an object ("type": "object")'),
        ("[" * 30_000, "tools[1].parameters is nested too deeply"),
    ],
)
def test_parameters_that_are_not_an_object_schema_are_refused_naming_the_field(parameters, message):
    assert refusal([pb.Tool(name="ok"), pb.Tool(name="bad", parameters=parameters)]).startswith(message)


def test_too_many_tools_or_too_large_parameters_are_refused():
    assert refusal([pb.Tool(name=f"t{i}") for i in range(MAX_TOOLS + 1)]) == (
        f"tools holds {MAX_TOOLS + 1} tools; at most {MAX_TOOLS} are allowed"
    )
    big = json.dumps({"type": "object", "description": "x" * MAX_GRAMMAR_BYTES})
    assert refusal([pb.Tool(name="f", parameters=big)]).startswith("tools[0].parameters is ")
    half = json.dumps({"type": "object", "description": "x" * (MAX_GRAMMAR_BYTES // 2)})
    message = refusal([pb.Tool(name="f", parameters=half), pb.Tool(name="g", parameters=half)])
    assert message.startswith("tools' parameters are ") and f"at most {MAX_GRAMMAR_BYTES}" in message
