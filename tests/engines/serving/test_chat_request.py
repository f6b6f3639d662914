"""build_chat: every rule a chat request can break is INVALID_ARGUMENT naming the field, and a valid
one runs the rendered prompt with exactly the generation fields Generate would use."""

from __future__ import annotations

import json

import pytest

from dpgate.chat.template import ChatTemplate
from dpgate.v1 import generate_pb2 as pb
from engines.chat.markers import ChatParsing
from engines.chat.template import chat_template_for
from engines.sampling.params import InvalidRequestError
from engines.serving.chat_request import ToolCallsOffError, build_chat
from engines.serving.request_builder import ModelLimits, UnknownModelError

LIMITS = ModelLimits("smollm2", 49152, 2048, frozenset({2}))
PARSING = ChatParsing()
WEATHER = pb.Tool(
    name="get_weather",
    description="Weather in a city",
    parameters=json.dumps({"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}),
)
HI = pb.ChatMessage(role=pb.CHAT_ROLE_USER, content="hi")
REQUIRED = pb.ToolChoice(mode=pb.TOOL_CHOICE_MODE_REQUIRED)
JSON_OUTPUT = pb.StructuredOutput(json_object=pb.JsonObject())


@pytest.fixture(scope="module")
def template(smollm2_tokenizer) -> ChatTemplate:
    return chat_template_for(smollm2_tokenizer, PARSING.markers)


def build(tokenizer, template, **fields):
    return build_chat(pb.ChatRequest(**fields), LIMITS, tokenizer, template, PARSING)


def kwargs(**values) -> dict:
    request = pb.ChatRequest()
    request.chat_template_kwargs.update(values)
    return {"chat_template_kwargs": request.chat_template_kwargs}


BAD_REQUESTS = [
    ({}, "messages must hold at least one message"),
    ({"messages": [pb.ChatMessage(content="hi")]}, "messages[0].role must be set: SYSTEM, USER, ASSISTANT or TOOL"),
    (
        {"messages": [HI, pb.ChatMessage(role=pb.CHAT_ROLE_USER, tool_calls=[pb.ToolCall(name="f")])]},
        "messages[1].tool_calls is only allowed on an ASSISTANT message",
    ),
    (
        {
            "messages": [
                HI,
                pb.ChatMessage(role=pb.CHAT_ROLE_ASSISTANT, tool_calls=[pb.ToolCall(name="f", arguments="[")]),
            ]
        },
        "messages[1].tool_calls[0].arguments must be a JSON object, but it is not valid JSON",
    ),
    (
        {"messages": [HI, pb.ChatMessage(role=pb.CHAT_ROLE_USER, tool_call_id="c")]},
        "messages[1].tool_call_id is only allowed on a TOOL message",
    ),
    (
        {"messages": [HI], "tools": [pb.Tool(name="get weather")]},
        "tools[0].name 'get weather' must be 1 to 64 letters, digits, underscores or hyphens",
    ),
    ({"messages": [HI], "tools": [pb.Tool(name="f" * 65)]}, "tools[0].name"),
    ({"messages": [HI], "tools": [pb.Tool(name="")]}, "tools[0].name '' must be 1 to 64"),
    (
        {"messages": [HI], "tools": [WEATHER, WEATHER]},
        "tools[1].name 'get_weather' is already the name of tools[0]",
    ),
    (
        {"messages": [HI], "tools": [pb.Tool(name="f", parameters="{oops")]},
        "tools[0].parameters is not valid JSON",
    ),
    (
        {"messages": [HI], "tools": [pb.Tool(name="f", parameters="[1]")]},
        "tools[0].parameters must be a JSON schema (a JSON object), not an array",
    ),
    ({"messages": [HI], "tool_choice": REQUIRED}, "tool_choice REQUIRED needs at least one tool in tools"),
    (
        {"messages": [HI], "tool_choice": pb.ToolChoice(tool_name="get_weather")},
        "tool_choice names tool 'get_weather' but the request gives no tools",
    ),
    (
        {"messages": [HI], "tools": [WEATHER], "tool_choice": pb.ToolChoice(tool_name="get_time")},
        "tool_choice names tool 'get_time', which is not one of the request's tools",
    ),
    (
        {"messages": [HI], "tools": [WEATHER], "tool_choice": REQUIRED, "structured_output": JSON_OUTPUT},
        "structured_output cannot be given with a tool_choice of REQUIRED or a named tool",
    ),
    (
        {
            "messages": [HI],
            "tools": [WEATHER],
            "tool_choice": pb.ToolChoice(tool_name="get_weather"),
            "structured_output": JSON_OUTPUT,
        },
        "structured_output cannot be given with a tool_choice of REQUIRED or a named tool",
    ),
    (
        {
            "messages": [HI],
            "tools": [WEATHER],
            "tool_choice": REQUIRED,
            "stopping": pb.StoppingCriteria(ignore_eos=True),
        },
        "tool_choice REQUIRED or a named tool needs a token that ends the output",
    ),
    ({"messages": [HI], **kwargs(tokenize=True)}, "chat_template_kwargs.tokenize is not allowed"),
    ({"messages": [HI], **kwargs(thinking="yes")}, "chat_template_kwargs.thinking must be true, false or null"),
    ({"messages": [HI], "stopping": pb.StoppingCriteria(max_tokens=0)}, "stopping.max_tokens"),
    ({"messages": [HI], "sampling": pb.SamplingParams(temperature=-1)}, "sampling.temperature"),
]


@pytest.mark.parametrize(("fields", "message"), BAD_REQUESTS)
def test_a_bad_chat_request_names_the_field_and_the_rule(smollm2_tokenizer, template, fields, message):
    with pytest.raises(InvalidRequestError) as info:
        build(smollm2_tokenizer, template, **fields)
    assert str(info.value).startswith(message), str(info.value)


def test_an_unknown_role_is_refused(smollm2_tokenizer, template):
    with pytest.raises(InvalidRequestError, match=r"^messages\[0\]\.role 9 is not a role"):
        build(smollm2_tokenizer, template, messages=[pb.ChatMessage(role=9, content="hi")])


def test_a_required_tool_call_is_refused_when_the_engine_parses_no_tool_calls(smollm2_tokenizer, template):
    request = pb.ChatRequest(messages=[HI], tools=[WEATHER], tool_choice=REQUIRED)
    with pytest.raises(ToolCallsOffError, match="--tool-call-parser none"):
        build_chat(request, LIMITS, smollm2_tokenizer, template, ChatParsing(parse_tools=False))


def test_an_unknown_model_is_not_found(smollm2_tokenizer, template):
    with pytest.raises(UnknownModelError, match="model 'other' is not served here"):
        build(smollm2_tokenizer, template, model="other", messages=[HI])


def test_the_rendered_prompt_is_tokenized_without_special_tokens_added_twice(smollm2_tokenizer, template):
    run = build(smollm2_tokenizer, template, messages=[HI])
    text = template.render([{"role": "user", "content": "hi"}], None, None).text
    assert run.sequence.prompt_ids == smollm2_tokenizer(text, add_special_tokens=False).input_ids
    assert smollm2_tokenizer.decode(run.sequence.prompt_ids) == text
    assert run.thinking is False and run.sequence.grammar_spec is None


def test_chat_without_max_tokens_may_use_the_rest_of_the_context(smollm2_tokenizer, template):
    """OpenAI's and vLLM's chat default, where Generate's 16 cut tool calls and answers short."""
    run = build(smollm2_tokenizer, template, messages=[HI])
    assert run.sequence.stopping.max_tokens == LIMITS.max_model_len - len(run.sequence.prompt_ids)
    given = build(smollm2_tokenizer, template, messages=[HI], stopping=pb.StoppingCriteria(max_tokens=5))
    assert given.sequence.stopping.max_tokens == 5


def test_a_prompt_that_fills_the_context_is_still_refused_with_the_prompt_rule(smollm2_tokenizer, template):
    long = pb.ChatMessage(role=pb.CHAT_ROLE_USER, content="hi " * 3000)
    with pytest.raises(InvalidRequestError, match="must be shorter than the model's context"):
        build(smollm2_tokenizer, template, messages=[long])


def test_generation_fields_mean_what_they_mean_for_generate(smollm2_tokenizer, template):
    run = build(
        smollm2_tokenizer,
        template,
        request_id="chat-1",
        messages=[HI],
        sampling=pb.SamplingParams(temperature=0.5, seed=9, top_k=4),
        stopping=pb.StoppingCriteria(max_tokens=7, stop=["\n"], stop_token_ids=[5]),
        structured_output=JSON_OUTPUT,
        logprobs=pb.LogprobsOptions(top_n=2),
    )
    seq = run.sequence
    assert seq.request_id == "chat-1"
    assert (seq.sampling.temperature, seq.sampling.seed, seq.sampling.top_k, seq.sampling.top_logprobs) == (
        0.5,
        9,
        4,
        2,
    )
    assert (seq.stopping.max_tokens, seq.stopping.stop) == (7, ("\n",))
    assert seq.stop_token_ids == {2, 5}
    assert seq.grammar_spec is not None and seq.grammar_spec.field == "structured_output.json_object"


@pytest.mark.parametrize(
    ("fields", "parse_tools", "constrained"),
    [
        ({}, False, False),  # no tools: tool markup is content
        ({"tools": [WEATHER]}, True, False),  # AUTO by default
        ({"tools": [WEATHER], "tool_choice": pb.ToolChoice(mode=pb.TOOL_CHOICE_MODE_NONE)}, False, False),
        ({"tools": [WEATHER], "tool_choice": pb.ToolChoice(mode=pb.TOOL_CHOICE_MODE_AUTO)}, True, False),
        ({"tools": [WEATHER], "tool_choice": REQUIRED}, True, True),
        ({"tools": [WEATHER], "tool_choice": pb.ToolChoice(tool_name="get_weather")}, True, True),
    ],
)
def test_tool_choice_sets_the_parser_and_the_grammar(smollm2_tokenizer, template, fields, parse_tools, constrained):
    run = build(smollm2_tokenizer, template, messages=[HI], **fields)
    assert run.parsing.parse_tools is parse_tools
    assert (run.sequence.grammar_spec is not None) is constrained
    if fields.get("tools"):  # the tools reach the prompt even though SmolLM2's template ignores them
        assert '"name": "get_weather"' in smollm2_tokenizer.decode(run.sequence.prompt_ids)


def test_a_conversation_with_a_tool_round_trip_renders(smollm2_tokenizer, template):
    call = pb.ToolCall(id="call_1", name="get_weather", arguments='{"city": "Oslo"}')
    messages = [
        HI,
        pb.ChatMessage(role=pb.CHAT_ROLE_ASSISTANT, tool_calls=[call]),
        pb.ChatMessage(role=pb.CHAT_ROLE_TOOL, content="-3 C", tool_call_id="call_1", name="get_weather"),
    ]
    prompt = smollm2_tokenizer.decode(
        build(smollm2_tokenizer, template, messages=messages, tools=[WEATHER]).sequence.prompt_ids
    )
    assert '{"name": "get_weather", "arguments": {"city": "Oslo"}}' in prompt and "-3 C" in prompt
