"""The template's inputs from a dpgate.v1 ChatRequest / ChatStreamRequest, and the prompt they render to.

Both the engine (the prompt it runs, engines/serving/chat_request.py) and the gateway (the prompt
it hashes to route on the cache) call `chat_inputs` and `render_chat`, so a message, a past tool
call, a tool definition and the template kwargs become the same template input on both sides.
Every rule a message or a kwarg can break is checked here, naming the field; the engine answers
a broken one with INVALID_ARGUMENT, the gateway routes such a call by load and lets the engine say so.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from google.protobuf import json_format, struct_pb2

from dpgate.chat.template import ChatTemplate, RenderedPrompt
from dpgate.chat.tools import ToolSpec, parse_tools
from dpgate.invalid_request import InvalidRequestError, require
from dpgate.json_text import strict_json_loads
from dpgate.v1 import generate_pb2

ChatLike = generate_pb2.ChatRequest | generate_pb2.ChatStreamRequest

_ROLES = {
    generate_pb2.CHAT_ROLE_SYSTEM: "system",
    generate_pb2.CHAT_ROLE_USER: "user",
    generate_pb2.CHAT_ROLE_ASSISTANT: "assistant",
    generate_pb2.CHAT_ROLE_TOOL: "tool",
}
# Names apply_chat_template takes itself; a kwarg of the same name would clash with them.
RESERVED_KWARGS = frozenset(
    {
        "messages",
        "conversation",
        "tools",
        "documents",
        "chat_template",
        "add_generation_prompt",
        "continue_final_message",
        "tokenize",
        "padding",
        "truncation",
        "max_length",
        "return_tensors",
        "return_dict",
        "return_assistant_tokens_mask",
        "tokenizer_kwargs",
    }
)


def chat_message(index: int, message: generate_pb2.ChatMessage) -> dict[str, Any]:
    """A message as transformers' templates expect it (OpenAI shape, arguments as an object)."""
    field = f"messages[{index}]"
    role = _ROLES.get(message.role)
    require(
        message.role != generate_pb2.CHAT_ROLE_UNSPECIFIED, f"{field}.role must be set: SYSTEM, USER, ASSISTANT or TOOL"
    )
    require(role is not None, f"{field}.role {message.role} is not a role: give SYSTEM, USER, ASSISTANT or TOOL")
    out: dict[str, Any] = {"role": role, "content": message.content}
    if message.tool_calls:
        require(role == "assistant", f"{field}.tool_calls is only allowed on an ASSISTANT message")
        out["tool_calls"] = [_past_call(f"{field}.tool_calls[{i}]", call) for i, call in enumerate(message.tool_calls)]
    if message.reasoning_content:
        require(role == "assistant", f"{field}.reasoning_content is only allowed on an ASSISTANT message")
        out["reasoning_content"] = message.reasoning_content
    if message.tool_call_id:
        require(role == "tool", f"{field}.tool_call_id is only allowed on a TOOL message")
        out["tool_call_id"] = message.tool_call_id
    if message.name:
        require(role == "tool", f"{field}.name is only allowed on a TOOL message")
        out["name"] = message.name
    return out


def _past_call(field: str, call: generate_pb2.ToolCall) -> dict[str, Any]:
    require(bool(call.name), f"{field}.name must not be empty")
    arguments = _json_object(call.arguments or "{}", f"{field}.arguments")
    return {"id": call.id, "type": "function", "function": {"name": call.name, "arguments": arguments}}


def _json_object(text: str, field: str) -> dict[str, Any]:
    try:
        value = strict_json_loads(text)
    except (ValueError, RecursionError):  # not JSON, or NaN / Infinity
        raise InvalidRequestError(f"{field} must be a JSON object, but it is not valid JSON") from None
    require(isinstance(value, dict), f"{field} must be a JSON object")
    return value


def template_kwargs(request: ChatLike) -> dict[str, Any] | None:
    if not request.HasField("chat_template_kwargs"):
        return None
    _require_finite(request.chat_template_kwargs, "chat_template_kwargs")
    kwargs = json_format.MessageToDict(request.chat_template_kwargs)
    for key in kwargs:
        require(
            key not in RESERVED_KWARGS,
            f"chat_template_kwargs.{key} is not allowed: the server sets {key!r} itself",
        )
    return kwargs


def _require_finite(value: struct_pb2.Struct | struct_pb2.ListValue | struct_pb2.Value, field: str) -> None:
    """A Struct may hold NaN or Infinity (protobuf's double), which JSON cannot: refuse it naming
    the place, rather than letting the conversion to JSON fail as an engine error."""
    if isinstance(value, struct_pb2.Struct):
        for key, item in value.fields.items():
            _require_finite(item, f"{field}.{key}")
    elif isinstance(value, struct_pb2.ListValue):
        for index, item in enumerate(value.values):
            _require_finite(item, f"{field}[{index}]")
    else:
        kind = value.WhichOneof("kind")
        if kind == "number_value":
            require(
                math.isfinite(value.number_value),
                f"{field} is {value.number_value}: NaN and Infinity are not JSON values",
            )
        elif kind == "struct_value":
            _require_finite(value.struct_value, field)
        elif kind == "list_value":
            _require_finite(value.list_value, field)


@dataclass(frozen=True, slots=True)
class ChatInputs:
    """A chat request's template inputs, validated: messages as templates expect them, tools, kwargs."""

    messages: list[dict[str, Any]]
    tools: list[ToolSpec]
    kwargs: dict[str, Any] | None  # chat_template_kwargs as plain JSON data; None when absent


def chat_inputs(request: ChatLike) -> ChatInputs:
    """The messages (at least one), tools and template kwargs of `request`; InvalidRequestError
    (or InvalidToolError) names the first field that breaks a rule."""
    messages = [chat_message(index, message) for index, message in enumerate(request.messages)]
    require(bool(messages), "messages must hold at least one message")
    tools = parse_tools(request.tools)
    return ChatInputs(messages, tools, template_kwargs(request))


def render_chat(template: ChatTemplate, inputs: ChatInputs) -> RenderedPrompt:
    """The prompt text (with a generation prompt) and the resolved thinking switch. The engine
    tokenizes the text without adding special tokens: the template wrote them."""
    wire_tools = [tool.as_template_tool() for tool in inputs.tools]
    return template.render(inputs.messages, wire_tools or None, inputs.kwargs)
