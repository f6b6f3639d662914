"""A request's tool definitions, validated where they enter.

A `dpgate.v1.Tool` carries its parameters as JSON text; here it becomes a `ToolSpec` whose
parameters are a parsed JSON schema of an object (a call's arguments are always a JSON object),
or the empty object schema when the text is empty. Every refusal names the field, e.g.
`tools[1].parameters is not valid JSON: ...`.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from dpgate.invalid_request import InvalidRequestError
from dpgate.json_text import MAX_GRAMMAR_BYTES, json_type_name, load_json_field

MAX_TOOLS = 128
MAX_NAME_CHARS = 64
_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
EMPTY_PARAMETERS: dict[str, Any] = {"type": "object", "properties": {}}


class InvalidToolError(InvalidRequestError):
    """A tool definition breaks a rule (INVALID_ARGUMENT); the message names the field."""


@dataclass(frozen=True, slots=True)
class ToolSpec:
    name: str
    description: str
    parameters: dict[str, Any]  # a JSON schema of the arguments object

    def as_template_tool(self) -> dict[str, Any]:
        """The OpenAI-style entry chat templates iterate over (`tools` of apply_chat_template)."""
        function = {"name": self.name, "description": self.description, "parameters": self.parameters}
        return {"type": "function", "function": function}


def parse_tools(tools: Sequence[Any]) -> list[ToolSpec]:
    """`tools` (proto `Tool`s, or anything with name/description/parameters) -> ToolSpecs, names unique."""
    if len(tools) > MAX_TOOLS:
        raise InvalidToolError(f"tools holds {len(tools)} tools; at most {MAX_TOOLS} are allowed")
    specs: list[ToolSpec] = []
    first_index: dict[str, int] = {}
    total_bytes = 0
    for index, tool in enumerate(tools):
        spec = parse_tool(tool, index)
        if spec.name in first_index:
            raise InvalidToolError(
                f"tools[{index}].name {spec.name!r} is already the name of tools[{first_index[spec.name]}]"
            )
        first_index[spec.name] = index
        total_bytes += len(tool.parameters.encode())
        specs.append(spec)
    if total_bytes > MAX_GRAMMAR_BYTES:
        # The parameters become one grammar for tool_choice required; the bound is structured_output's.
        raise InvalidToolError(
            f"tools' parameters are {total_bytes} bytes together; at most {MAX_GRAMMAR_BYTES} are allowed"
        )
    return specs


def parse_tool(tool: Any, index: int) -> ToolSpec:
    field = f"tools[{index}]"
    name = tool.name
    if not _NAME.fullmatch(name):
        raise InvalidToolError(
            f"{field}.name {name!r} must be 1 to {MAX_NAME_CHARS} letters, digits, underscores or hyphens"
        )
    return ToolSpec(name, tool.description, parse_parameters(tool.parameters, f"{field}.parameters"))


def parse_parameters(text: str, field: str) -> dict[str, Any]:
    """A tool's parameters JSON text -> a JSON schema of an object; empty text -> no parameters."""
    if text.strip() == "":
        return dict(EMPTY_PARAMETERS)
    if len(text.encode()) > MAX_GRAMMAR_BYTES:
        raise InvalidToolError(f"{field} is {len(text.encode())} bytes; at most {MAX_GRAMMAR_BYTES} are allowed")
    schema = load_json_field(text, field, InvalidToolError)
    if not isinstance(schema, dict):
        raise InvalidToolError(f"{field} must be a JSON schema (a JSON object), not {json_type_name(schema)}")
    kind = schema.get("type", "object")
    if kind != "object":
        raise InvalidToolError(f'{field} must describe an object ("type": "object"): arguments are a JSON object')
    return schema
