"""The OpenAI request translation, without processes: each field lands where docs/http-api.md says,
and each field that breaks a rule (or that this server does not support) is a 400 naming it."""

from __future__ import annotations

import json

import pytest

from dpgate.v1 import generate_pb2 as pb
from gateway.openai.errors import RequestError
from gateway.openai.translate import chat_plan, completion_plan

HI = {"role": "user", "content": "hi"}
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        "strict": True,
    },
}


def chat(**fields) -> pb.ChatRequest:
    plan = chat_plan({"model": "m", "messages": [HI], **fields})
    kind = pb.ChatStreamRequest if plan.stream else pb.ChatRequest
    return kind.FromString(plan.requests[0])


def test_a_plain_chat_is_one_unary_chat_call():
    plan = chat_plan({"model": "smollm2", "messages": [HI]})
    assert plan.path == b"/dpgate.v1.InferenceService/Chat" and not plan.stream and plan.n == 1
    request = pb.ChatRequest.FromString(plan.requests[0])
    assert request.model == "smollm2"
    assert [(m.role, m.content) for m in request.messages] == [(pb.CHAT_ROLE_USER, "hi")]
    assert not request.stopping.HasField("max_tokens")  # the engine's chat default: the rest of the context


def test_sampling_and_stopping_fields_map_one_to_one():
    request = chat(
        temperature=0.5, top_p=0.9, top_k=-1, min_p=0.1, seed=7, presence_penalty=0.5, frequency_penalty=-0.5,
        repetition_penalty=1.1, logit_bias={"42": -100}, max_completion_tokens=9, stop="\n", min_tokens=2,
        stop_token_ids=[5], ignore_eos=True,
    )  # fmt: skip
    sampling, stopping = request.sampling, request.stopping
    assert (sampling.temperature, round(sampling.top_p, 5), sampling.top_k, round(sampling.min_p, 5)) == (
        0.5, 0.9, 0, 0.1,
    )  # fmt: skip
    assert (sampling.seed, sampling.presence_penalty, sampling.frequency_penalty) == (7, 0.5, -0.5)
    assert round(sampling.repetition_penalty, 5) == 1.1 and dict(sampling.logit_bias) == {42: -100.0}
    assert (stopping.max_tokens, list(stopping.stop), stopping.min_tokens) == (9, ["\n"], 2)
    assert list(stopping.stop_token_ids) == [5] and stopping.ignore_eos


def test_messages_of_every_role_with_text_parts_and_past_tool_calls():
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'}}
    messages = [
        {"role": "developer", "content": [{"type": "text", "text": "be"}, {"type": "text", "text": "brief"}]},
        HI,
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
    ]
    request = pb.ChatRequest.FromString(chat_plan({"messages": messages}).requests[0])
    system, _, assistant, tool = request.messages
    assert (system.role, system.content) == (pb.CHAT_ROLE_SYSTEM, "be\nbrief")
    assert assistant.content == "" and assistant.tool_calls[0].arguments == '{"city":"Paris"}'
    assert (tool.role, tool.tool_call_id, tool.content) == (pb.CHAT_ROLE_TOOL, "call_1", "sunny")


@pytest.mark.parametrize(
    ("choice", "expected"),
    [
        ("required", pb.ToolChoice(mode=pb.TOOL_CHOICE_MODE_REQUIRED)),
        ("none", pb.ToolChoice(mode=pb.TOOL_CHOICE_MODE_NONE)),
        ({"type": "function", "function": {"name": "get_weather"}}, pb.ToolChoice(tool_name="get_weather")),
    ],
)
def test_tools_and_tool_choice(choice, expected):
    request = chat(tools=[WEATHER], tool_choice=choice, parallel_tool_calls=False)
    assert request.tool_choice == expected and request.parallel_tool_calls is False
    assert request.tools[0].name == "get_weather"
    assert json.loads(request.tools[0].parameters) == WEATHER["function"]["parameters"]


def test_structured_outputs_by_openai_and_vllm_names():
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema, "strict": True}}
    assert json.loads(chat(response_format=fmt).structured_output.json_schema) == schema
    assert chat(response_format={"type": "json_object"}).structured_output.HasField("json_object")
    assert not chat(response_format={"type": "text"}).HasField("structured_output")
    assert chat(guided_regex="a+").structured_output.regex == "a+"
    assert list(chat(guided_choice=["y", "n"]).structured_output.choice.choices) == ["y", "n"]
    assert chat(guided_grammar='root ::= "a"').structured_output.ebnf == 'root ::= "a"'
    assert chat(structured_outputs={"regex": "b"}).structured_output.regex == "b"


def test_reasoning_effort_and_template_kwargs_travel_as_template_variables():
    request = chat(reasoning_effort="low", chat_template_kwargs={"enable_thinking": False})
    assert dict(request.chat_template_kwargs) == {"reasoning_effort": "low", "enable_thinking": False}


def test_logprobs_n_and_streaming_options():
    plan = chat_plan({"messages": [HI], "logprobs": True, "top_logprobs": 3, "n": 2, "stream": True,
                      "stream_options": {"include_usage": True}})  # fmt: skip
    assert plan.path.endswith(b"/ChatStream") and plan.n == 2 and len(plan.requests) == 2
    assert plan.include_usage and plan.logprobs
    assert pb.ChatStreamRequest.FromString(plan.requests[1]).logprobs.top_n == 3


def test_completions_take_text_token_ids_and_batches_with_n_choices_each():
    plan = completion_plan({"prompt": ["a", "b"], "n": 2, "logprobs": 1, "max_tokens": 3})
    requests = [pb.GenerateRequest.FromString(r) for r in plan.requests]
    assert [r.text for r in requests] == ["a", "a", "b", "b"]
    assert all(r.logprobs.top_n == 1 and r.stopping.max_tokens == 3 for r in requests)
    ids = completion_plan({"prompt": [1, 2, 3], "stream": True})
    assert pb.GenerateStreamRequest.FromString(ids.requests[0]).token_ids.ids == [1, 2, 3]
    assert len(completion_plan({"prompt": [[1], [2, 3]]}).requests) == 2


@pytest.mark.parametrize(
    ("body", "param", "words"),
    [
        ({"messages": [HI], "user": "u"}, "user", "not supported"),
        ({"messages": [HI], "temperature": "hot"}, "temperature", "finite number"),
        ({"messages": []}, "messages", "non-empty"),
        ({"messages": [{"role": "robot", "content": "x"}]}, "messages[0].role", "must be one of"),
        ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, "messages[0].content[0].type", "text"),
        ({"messages": [{"role": "user", "content": "x", "name": "bob"}]}, "messages[0].name", "not supported"),
        ({"messages": [{"role": "tool", "content": "x"}]}, "messages[0].tool_call_id", "required"),
        ({"messages": [HI], "top_logprobs": 2}, "top_logprobs", "needs logprobs"),
        ({"messages": [HI], "n": 0}, "n", "at least 1"),
        ({"messages": [HI], "stream_options": {"include_usage": True}}, "stream_options", "only allowed"),
        ({"messages": [HI], "guided_regex": "a", "guided_choice": ["b"]}, "guided_choice", "together"),
        ({"messages": [HI], "logit_bias": {"x": 1}}, "logit_bias", "token ids"),
        ({"messages": [HI], "tool_choice": "always"}, "tool_choice", "none, auto, required"),
        ({"messages": [HI], "reasoning_effort": "max"}, "reasoning_effort", "one of"),
        ({"messages": [HI], "max_tokens": 3, "max_completion_tokens": 4}, "max_tokens", "disagree"),
        ({"messages": [HI], "response_format": {"type": "xml"}}, "response_format.type", "json_schema"),
        ({"messages": [HI], "seed": -1}, "seed", "at least 0"),
    ],
)
def test_a_bad_chat_field_is_named_with_its_rule(body, param, words):
    with pytest.raises(RequestError) as info:
        chat_plan(body)
    assert info.value.param == param and words in info.value.message


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"prompt": "a", "echo": True}, "echo"),
        ({"prompt": "a", "suffix": "b"}, "suffix"),
        ({"prompt": "a", "best_of": 3}, "best_of"),
        ({"prompt": []}, "prompt"),
        ({"prompt": [1, "a"]}, "prompt"),
        ({"prompt": "a", "logprobs": 21}, "logprobs"),
    ],
)
def test_a_bad_completion_field_is_named(body, param):
    with pytest.raises(RequestError) as info:
        completion_plan(body)
    assert info.value.param == param


def test_a_body_that_is_not_an_object_is_refused():
    with pytest.raises(RequestError, match="must be a JSON object, not an array"):
        chat_plan([1])


def test_explicit_nulls_count_as_absent():
    request = chat(temperature=None, stop=None, tools=None, user=None)
    assert not request.sampling.HasField("temperature") and not request.stopping.stop


def test_vllms_continuous_usage_stats_is_taken_with_streams():
    plan = chat_plan({"messages": [HI], "stream": True, "stream_options": {"include_usage": True,
                      "continuous_usage_stats": True}})  # fmt: skip
    assert plan.continuous_usage and plan.include_usage
