"""What a chat call sends: dataclasses and dicts give the same request; bad input names its field."""

from __future__ import annotations

import json
import re

import pytest
from google.protobuf import struct_pb2

from dpgate.cli.chat_conversation import Conversation
from dpgate.client.chat_messages import ChatInput, ChatMessage, ChatTool, ToolCall
from dpgate.client.options import GenerationOptions
from dpgate.v1 import generate_pb2

PARIS = {"city": "Paris"}  # a dict of arguments is sent as its compact JSON text
DESCRIPTION = "Current weather"
WEATHER = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}


def test_dataclasses_and_dicts_build_the_same_request() -> None:
    from_classes = ChatInput.build(
        [
            ChatMessage("system", "Be brief."),
            ChatMessage("user", "Weather in Paris?"),
            ChatMessage("assistant", "", tool_calls=[ToolCall("call_1", "get_weather", '{"city":"Paris"}')]),
            ChatMessage("tool", "18 C", tool_call_id="call_1", name="get_weather"),
        ],
        [ChatTool("get_weather", "Current weather", WEATHER)],
        "get_weather",
    ).chat_request(GenerationOptions(max_tokens=8, seed=3))
    from_dicts = ChatInput.build(
        [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "tool_calls": [{"id": "call_1", "name": "get_weather", "arguments": PARIS}]},
            {"role": "tool", "content": "18 C", "tool_call_id": "call_1", "name": "get_weather"},
        ],
        [{"type": "function", "function": {"name": "get_weather", "description": DESCRIPTION, "parameters": WEATHER}}],
        "get_weather",
    ).chat_request(GenerationOptions(max_tokens=8, seed=3))  # fmt: skip
    assert from_classes == from_dicts
    assert [m.role for m in from_classes.messages] == [
        generate_pb2.CHAT_ROLE_SYSTEM, generate_pb2.CHAT_ROLE_USER,
        generate_pb2.CHAT_ROLE_ASSISTANT, generate_pb2.CHAT_ROLE_TOOL,
    ]  # fmt: skip
    assert json.loads(from_classes.tools[0].parameters) == WEATHER
    assert from_classes.tool_choice.tool_name == "get_weather"
    assert from_classes.stopping.max_tokens == 8 and from_classes.sampling.seed == 3


@pytest.mark.parametrize(
    ("choice", "expected"),
    [
        ("none", generate_pb2.ToolChoice(mode=generate_pb2.TOOL_CHOICE_MODE_NONE)),
        ("auto", generate_pb2.ToolChoice(mode=generate_pb2.TOOL_CHOICE_MODE_AUTO)),
        ("required", generate_pb2.ToolChoice(mode=generate_pb2.TOOL_CHOICE_MODE_REQUIRED)),
        ("get_weather", generate_pb2.ToolChoice(tool_name="get_weather")),
    ],
)
def test_tool_choice(choice: str, expected: generate_pb2.ToolChoice) -> None:
    request = ChatInput.build([{"role": "user", "content": "hi"}], [ChatTool("get_weather")], choice).stream_request(
        GenerationOptions()
    )
    assert request.tool_choice == expected


def test_no_tool_choice_and_no_kwargs_leave_the_fields_absent() -> None:
    request = ChatInput.build([{"role": "user", "content": "hi"}]).chat_request(GenerationOptions())
    assert not request.HasField("tool_choice") and not request.HasField("chat_template_kwargs")


def test_chat_template_kwargs_keep_none_as_json_null_and_other_values_as_json() -> None:
    kwargs = {"thinking": None, "enable_thinking": False, "reasoning_effort": "low", "budget": 2, "tags": ["a"]}
    request = ChatInput.build([{"role": "user", "content": "hi"}], chat_template_kwargs=kwargs).chat_request(
        GenerationOptions()
    )
    fields = request.chat_template_kwargs.fields
    assert fields["thinking"].WhichOneof("kind") == "null_value"
    assert fields["thinking"].null_value == struct_pb2.NULL_VALUE
    assert fields["enable_thinking"].bool_value is False and fields["enable_thinking"].HasField("bool_value")
    assert fields["reasoning_effort"].string_value == "low"
    assert fields["budget"].number_value == 2
    assert fields["tags"].list_value.values[0].string_value == "a"
    assert "absent" not in fields


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (([],), "messages must hold at least one message"),
        (([{"role": "robot", "content": "x"}],), "messages[0].role must be one of system, user, assistant, tool"),
        (([{"role": "user", "content": 3}],), "messages[0].content must be a string"),
        (([{"role": "user", "text": "x"}],), "messages[0] has unknown keys: text"),
        (([{"role": "user"}], [{"name": ""}]), "tools[0].name must be a non-empty string"),
        (([{"role": "user"}], [{"name": "f", "parameters": "{}"}]), "tools[0].parameters must be a JSON schema"),
        (([{"role": "user"}], [], ""), "tool_choice must be none, auto, required or a tool's name"),
        (([{"role": "user"}], [], None, {"x": float("nan")}), "chat_template_kwargs.x must be a finite number"),
        (([{"role": "user"}], [], None, {"x": object()}), "chat_template_kwargs.x must be a JSON value"),
    ],
)
def test_bad_input_is_refused_naming_the_field(arguments: tuple, message: str) -> None:
    with pytest.raises(ValueError, match="^" + re.escape(message)):
        ChatInput.build(*arguments)


def test_the_conversation_keeps_completed_turns_only_and_not_the_reasoning() -> None:
    conversation = Conversation("Be brief.")
    assert [(m.role, m.content) for m in conversation.messages_with("Hi")] == [("system", "Be brief."), ("user", "Hi")]
    call = ToolCall("call_1", "get_weather", '{"city":"Paris"}')
    conversation.record("Weather?", "Let me check.", [call])
    # A question whose answer was cancelled is never recorded: the next request does not carry it.
    sent = conversation.messages_with("And tomorrow?")
    assert [(m.role, m.content) for m in sent] == [
        ("system", "Be brief."), ("user", "Weather?"), ("assistant", "Let me check."), ("user", "And tomorrow?"),
    ]  # fmt: skip
    assert sent[2].tool_calls == (call,) and sent[2].reasoning_content == ""
    assert conversation.num_turns == 1
    conversation.reset()
    assert [m.role for m in conversation.messages_with("Hi")] == ["system", "user"]
