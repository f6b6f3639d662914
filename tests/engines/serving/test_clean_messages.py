"""Bad JSON a client sends is INVALID_ARGUMENT with a sentence about JSON, never a Python type name
or the grammar library's internals (issue 22, items 2 and 10): NaN or Infinity in
chat_template_kwargs (it was INTERNAL, blamed on the engine), a json_schema that is null or an
array, a schema holding NaN."""

from __future__ import annotations

import math
import re

import pytest

from dpgate.chat.template import ChatTemplate
from dpgate.v1 import generate_pb2 as pb
from engines.chat.markers import ChatParsing
from engines.chat.template import chat_template_for
from engines.grammar.spec import json_schema_spec
from engines.sampling.params import InvalidRequestError
from engines.serving.chat_request import build_chat
from engines.serving.request_builder import ModelLimits

LIMITS = ModelLimits("smollm2", 49152, 2048, frozenset({2}))
PYTHON_NAMES = re.compile(r"NoneType|\blist\b|\bdict\b|\bfloat\b|\bint\b|\bstr\b|Check failed|Traceback")


@pytest.mark.parametrize(
    ("schema", "said"),
    [
        ("null", "not null"),
        ("[]", "not an array"),
        ('"x"', "not a string"),
        ("3", "not a number"),
        ('{"type": "number", "maximum": NaN}', "NaN is not a JSON value"),
        ('{"type": "number", "minimum": -Infinity}', "-Infinity is not a JSON value"),
    ],
)
def test_json_schema_refusals_speak_json(schema, said):
    with pytest.raises(InvalidRequestError) as refused:
        json_schema_spec(schema)
    message = str(refused.value)
    assert message.startswith("structured_output.json_schema") and said in message, message
    assert not PYTHON_NAMES.search(message), message


@pytest.fixture(scope="module")
def template(smollm2_tokenizer) -> ChatTemplate:
    return chat_template_for(smollm2_tokenizer, ChatParsing().markers)


@pytest.mark.parametrize(
    ("values", "field"),
    [
        ({"x": math.nan}, "chat_template_kwargs.x"),
        ({"deep": {"inner": [1, math.inf]}}, "chat_template_kwargs.deep.inner[1]"),
        ({"y": -math.inf}, "chat_template_kwargs.y"),
    ],
)
def test_chat_template_kwargs_with_nan_or_infinity_are_invalid_argument_naming_the_field(
    smollm2_tokenizer, template, values, field
):
    request = pb.ChatRequest(messages=[pb.ChatMessage(role=pb.CHAT_ROLE_USER, content="hi")])
    request.chat_template_kwargs.update(values)
    with pytest.raises(InvalidRequestError) as refused:
        build_chat(request, LIMITS, smollm2_tokenizer, template, ChatParsing())
    message = str(refused.value)
    assert message.startswith(field) and "NaN and Infinity are not JSON values" in message, message


def test_tool_call_arguments_with_nan_are_refused_too(smollm2_tokenizer, template):
    past = pb.ChatMessage(role=pb.CHAT_ROLE_ASSISTANT, tool_calls=[pb.ToolCall(name="f", arguments='{"a": NaN}')])
    request = pb.ChatRequest(messages=[pb.ChatMessage(role=pb.CHAT_ROLE_USER, content="hi"), past])
    with pytest.raises(InvalidRequestError, match=r"messages\[1\]\.tool_calls\[0\]\.arguments"):
        build_chat(request, LIMITS, smollm2_tokenizer, template, ChatParsing())
