"""What a chat call sends: messages, tools, tool_choice and chat_template_kwargs, as request messages.

Callers write plain dataclasses or dicts (`{"role": "user", "content": "Hi"}`); both clients build
the ChatRequest / ChatStreamRequest here, so the blocking and the asyncio client send the same
bytes. Every input is checked where it enters, with a ValueError naming the argument and the rule,
because a wrong role or a tool whose parameters are not JSON reads better before a round trip.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from google.protobuf import struct_pb2

from dpgate.client.options import GenerationOptions
from dpgate.v1 import generate_pb2

_ROLES = {
    "system": generate_pb2.CHAT_ROLE_SYSTEM,
    "user": generate_pb2.CHAT_ROLE_USER,
    "assistant": generate_pb2.CHAT_ROLE_ASSISTANT,
    "tool": generate_pb2.CHAT_ROLE_TOOL,
}
_MODES = {
    "none": generate_pb2.TOOL_CHOICE_MODE_NONE,
    "auto": generate_pb2.TOOL_CHOICE_MODE_AUTO,
    "required": generate_pb2.TOOL_CHOICE_MODE_REQUIRED,
}


@dataclass(frozen=True, slots=True)
class ToolCall:
    """One call of a tool by the model: `arguments` is a JSON object as JSON text."""

    id: str
    name: str
    arguments: str

    @classmethod
    def from_message(cls, message: generate_pb2.ToolCall) -> ToolCall:
        return cls(message.id, message.name, message.arguments)

    def to_message(self) -> generate_pb2.ToolCall:
        return generate_pb2.ToolCall(id=self.id, name=self.name, arguments=self.arguments)


@dataclass(frozen=True, slots=True)
class ChatMessage:
    """One message of a conversation; `role` is system, user, assistant or tool.

    An assistant message carries the tool calls it made; a tool message names the call it answers
    (`tool_call_id`) and, optionally, the tool (`name`). `reasoning_content` is only sent when a
    caller chooses to resend an earlier answer's reasoning.
    """

    role: str
    content: str = ""
    tool_calls: Sequence[ToolCall] = ()
    tool_call_id: str = ""
    name: str = ""
    reasoning_content: str = ""


@dataclass(frozen=True, slots=True)
class ChatTool:
    """A function the model may call; `parameters` is its JSON schema as a dict (None: no parameters)."""

    name: str
    description: str = ""
    parameters: Mapping[str, Any] | None = field(default=None)


MessageInput = ChatMessage | Mapping[str, Any]
ToolInput = ChatTool | Mapping[str, Any]


def _text(value: Any, argument: str) -> str:
    if value is None:
        return ""
    if not isinstance(value, str):
        raise ValueError(f"{argument} must be a string, got {type(value).__name__}")
    return value


def _tool_call(value: ToolCall | Mapping[str, Any], argument: str) -> generate_pb2.ToolCall:
    if isinstance(value, ToolCall):
        return value.to_message()
    if not isinstance(value, Mapping):
        raise ValueError(f"{argument} must be a ToolCall or a dict with id, name and arguments")
    arguments = value.get("arguments", "")
    if not isinstance(arguments, str):
        # A dict of arguments is accepted and sent as the JSON text the schema asks for.
        arguments = _json(arguments, f"{argument}.arguments")
    return generate_pb2.ToolCall(
        id=_text(value.get("id"), f"{argument}.id"), name=_text(value.get("name"), f"{argument}.name"),
        arguments=arguments,
    )  # fmt: skip


def _message(value: MessageInput, index: int) -> generate_pb2.ChatMessage:
    argument = f"messages[{index}]"
    if isinstance(value, ChatMessage):
        fields: Mapping[str, Any] = {
            "role": value.role, "content": value.content, "tool_calls": value.tool_calls,
            "tool_call_id": value.tool_call_id, "name": value.name, "reasoning_content": value.reasoning_content,
        }  # fmt: skip
    elif isinstance(value, Mapping):
        fields = value
    else:
        raise ValueError(f"{argument} must be a ChatMessage or a dict with role and content")
    unknown = set(fields) - {"role", "content", "tool_calls", "tool_call_id", "name", "reasoning_content"}
    if unknown:
        raise ValueError(f"{argument} has unknown keys: {', '.join(sorted(unknown))}")
    role = fields.get("role")
    if role not in _ROLES:
        raise ValueError(f"{argument}.role must be one of system, user, assistant, tool; got {role!r}")
    tool_calls = fields.get("tool_calls") or ()
    if isinstance(tool_calls, str | bytes | Mapping) or not isinstance(tool_calls, Sequence):
        raise ValueError(f"{argument}.tool_calls must be a list of tool calls")
    return generate_pb2.ChatMessage(
        role=_ROLES[role],
        content=_text(fields.get("content"), f"{argument}.content"),
        reasoning_content=_text(fields.get("reasoning_content"), f"{argument}.reasoning_content"),
        tool_calls=[_tool_call(call, f"{argument}.tool_calls[{i}]") for i, call in enumerate(tool_calls)],
        tool_call_id=_text(fields.get("tool_call_id"), f"{argument}.tool_call_id"),
        name=_text(fields.get("name"), f"{argument}.name"),
    )


def _json(value: Any, argument: str) -> str:
    try:
        return json.dumps(value, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as error:
        raise ValueError(f"{argument} must be JSON-serialisable ({error})") from None


def _tool(value: ToolInput, index: int) -> generate_pb2.Tool:
    argument = f"tools[{index}]"
    if isinstance(value, ChatTool):
        name, description, parameters = value.name, value.description, value.parameters
    elif isinstance(value, Mapping):
        # The OpenAI shape {"type": "function", "function": {...}} is accepted as well as the flat one.
        body = value.get("function", value) if value.get("type", "function") == "function" else None
        if not isinstance(body, Mapping):
            raise ValueError(f"{argument} must be a function tool: a dict with name, description, parameters")
        name, description, parameters = body.get("name"), body.get("description", ""), body.get("parameters")
    else:
        raise ValueError(f"{argument} must be a ChatTool or a dict with name, description and parameters")
    if not isinstance(name, str) or not name:
        raise ValueError(f"{argument}.name must be a non-empty string")
    if parameters is not None and not isinstance(parameters, Mapping):
        raise ValueError(f"{argument}.parameters must be a JSON schema object (a dict)")
    return generate_pb2.Tool(
        name=name,
        description=_text(description, f"{argument}.description"),
        parameters="" if parameters is None else _json(dict(parameters), f"{argument}.parameters"),
    )


def _tool_choice(value: str | None) -> generate_pb2.ToolChoice | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        raise ValueError(f"tool_choice must be none, auto, required or a tool's name; got {value!r}")
    if value in _MODES:
        return generate_pb2.ToolChoice(mode=_MODES[value])
    return generate_pb2.ToolChoice(tool_name=value)


def _struct_value(value: Any, argument: str) -> struct_pb2.Value:
    """A JSON value as a Struct Value; None becomes NullValue so a key set to null stays present."""
    if value is None:
        return struct_pb2.Value(null_value=struct_pb2.NULL_VALUE)
    if isinstance(value, bool):
        return struct_pb2.Value(bool_value=value)
    if isinstance(value, int | float):
        if not math.isfinite(value):
            raise ValueError(f"{argument} must be a finite number, got {value!r}")
        return struct_pb2.Value(number_value=float(value))
    if isinstance(value, str):
        return struct_pb2.Value(string_value=value)
    if isinstance(value, Mapping):
        return struct_pb2.Value(struct_value=_struct(value, argument))
    if isinstance(value, Sequence):
        items = [_struct_value(item, f"{argument}[{i}]") for i, item in enumerate(value)]
        return struct_pb2.Value(list_value=struct_pb2.ListValue(values=items))
    raise ValueError(f"{argument} must be a JSON value, got {type(value).__name__}")


def _struct(values: Mapping[str, Any], argument: str) -> struct_pb2.Struct:
    struct = struct_pb2.Struct()
    for key, value in values.items():
        if not isinstance(key, str):
            raise ValueError(f"{argument} keys must be strings, got {key!r}")
        struct.fields[key].CopyFrom(_struct_value(value, f"{argument}.{key}"))
    return struct


@dataclass(frozen=True, slots=True)
class ChatInput:
    """One chat call's conversation and tool settings, checked and converted once."""

    messages: tuple[generate_pb2.ChatMessage, ...]
    tools: tuple[generate_pb2.Tool, ...]
    tool_choice: generate_pb2.ToolChoice | None
    chat_template_kwargs: struct_pb2.Struct | None

    @classmethod
    def build(
        cls,
        messages: Sequence[MessageInput],
        tools: Sequence[ToolInput] = (),
        tool_choice: str | None = None,
        chat_template_kwargs: Mapping[str, Any] | None = None,
    ) -> ChatInput:
        if isinstance(messages, str | bytes | Mapping) or not isinstance(messages, Sequence):
            raise ValueError("messages must be a list of messages")
        if not messages:
            raise ValueError("messages must hold at least one message")
        if isinstance(tools, str | bytes | Mapping) or not isinstance(tools, Sequence):
            raise ValueError("tools must be a list of tools")
        if chat_template_kwargs is not None and not isinstance(chat_template_kwargs, Mapping):
            raise ValueError("chat_template_kwargs must be a dict")
        return cls(
            messages=tuple(_message(message, i) for i, message in enumerate(messages)),
            tools=tuple(_tool(tool, i) for i, tool in enumerate(tools)),
            tool_choice=_tool_choice(tool_choice),
            chat_template_kwargs=None
            if chat_template_kwargs is None
            else _struct(chat_template_kwargs, "chat_template_kwargs"),
        )

    def _fields(self, options: GenerationOptions) -> dict[str, Any]:
        fields: dict[str, Any] = {
            "messages": self.messages, "tools": self.tools,
            "sampling": options.sampling(), "stopping": options.stopping(), "cache_salt": options.cache_salt,
        }  # fmt: skip
        if self.tool_choice is not None:
            fields["tool_choice"] = self.tool_choice
        if self.chat_template_kwargs is not None:
            fields["chat_template_kwargs"] = self.chat_template_kwargs
        return fields

    def chat_request(self, options: GenerationOptions) -> generate_pb2.ChatRequest:
        return generate_pb2.ChatRequest(**self._fields(options))

    def stream_request(self, options: GenerationOptions) -> generate_pb2.ChatStreamRequest:
        return generate_pb2.ChatStreamRequest(**self._fields(options))
