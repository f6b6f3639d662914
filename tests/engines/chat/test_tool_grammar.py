"""The tool-call grammar on the real SmolLM2 vocabulary, driven token by token through the same
matcher a request uses: valid calls are accepted and parse, a wrong name or argument is refused,
and whatever the grammar lets a model write, the output parser reads as tool calls."""

from __future__ import annotations

import json
import random

import jsonschema
import pytest
import torch

from dpgate.chat.tools import InvalidToolError, ToolSpec
from engines.chat.markers import ChatMarkers
from engines.chat.output_parser import parse_all
from engines.chat.tool_grammar import tool_call_grammar
from engines.grammar.bits import allowed_token_ids
from engines.grammar.compiler import GrammarCompiler
from engines.grammar.matcher import RequestGrammar
from engines.grammar.spec import GrammarKind

VOCAB_SIZE = 49152
EOS = 2  # <|im_end|>
MARKERS = ChatMarkers()
WEATHER = ToolSpec(
    "get_weather",
    "The weather in a city.",
    {
        "type": "object",
        "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
        "required": ["city"],
    },
)
TIME = ToolSpec("get-time", "", {"type": "object", "properties": {}})
FLAGS = ToolSpec(
    "set_flags",
    "",
    {
        "type": "object",
        "properties": {"on": {"type": "boolean"}, "mode": {"enum": ["a", "b"]}, "level": {"enum": [1, 2, 3]}},
        "required": ["on", "mode"],
        "additionalProperties": False,
    },
)
TOOLS = [WEATHER, TIME, FLAGS]


@pytest.fixture(scope="module")
def compiler(smollm2_tokenizer):
    compiler = GrammarCompiler(smollm2_tokenizer, VOCAB_SIZE, frozenset({EOS}))
    yield compiler
    compiler.shutdown()


def matcher(compiler, choice="required", tools=TOOLS, thinking=False, parallel=True) -> RequestGrammar:
    spec = tool_call_grammar(tools, choice, MARKERS, thinking=thinking, parallel=parallel)
    return RequestGrammar(compiler.submit(spec).result(), frozenset({EOS}), VOCAB_SIZE)


def allowed(grammar: RequestGrammar) -> list[int]:
    bitmask = torch.zeros(1, VOCAB_SIZE // 32, dtype=torch.int32)
    grammar.fill(bitmask, 0)
    return allowed_token_ids(bitmask[0], VOCAB_SIZE)


def accepts(grammar: RequestGrammar, tokenizer, text: str) -> bool:
    """Whether the grammar takes every token of `text` (SmolLM2's own tokenization) and can then end."""
    for token_id in tokenizer.encode(text, add_special_tokens=False):
        if not grammar.matcher.accept_token(token_id):
            return False
    return grammar.can_end and grammar.matcher.accept_token(EOS)


def call(name: str, arguments: dict) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


def test_the_spec_is_ebnf_text_for_the_ordinary_compiler():
    spec = tool_call_grammar(TOOLS, "required", MARKERS)
    assert spec.kind is GrammarKind.EBNF and "get_weather" in spec.text and "get-time" in spec.text


@pytest.mark.parametrize(
    "text",
    [
        call("get_weather", {"city": "Paris"}),
        call("get_weather", {"city": "Rio de Janeiro", "unit": "celsius"}),
        call("get-time", {}),
        call("set_flags", {"on": True, "mode": "b", "level": 3}),
        call("get_weather", {"city": "Paris"}) + "\n" + call("get-time", {}),
        '<tool_call>\n{"name": "get_weather", "arguments": {"city":"Nice"}}\n</tool_call>',  # compact JSON too
    ],
)
@pytest.mark.e2e  # compiles in the grammar compiler's child process
def test_a_valid_call_is_accepted_token_by_token_and_parses(compiler, smollm2_tokenizer, text):
    assert accepts(matcher(compiler), smollm2_tokenizer, text)
    chat = parse_all(text, thinking=False)
    assert chat.content == "" and chat.tool_calls
    for parsed in chat.tool_calls:
        tool = next(tool for tool in TOOLS if tool.name == parsed.name)
        jsonschema.validate(json.loads(parsed.arguments), tool.parameters)


@pytest.mark.parametrize(
    "text",
    [
        call("get_wether", {"city": "Paris"}),  # not a tool
        call("get_weather", {"city": 3}),  # not a string
        call("get_weather", {"town": "Paris"}),  # not a parameter, and city missing
        call("get_weather", {}),  # city is required
        call("get_weather", {"city": "Paris", "unit": "kelvin"}),  # not in the enum
        call("set_flags", {"on": "yes", "mode": "a"}),
        call("set_flags", {"on": True, "mode": "a", "extra": 1}),  # additionalProperties false
        call("get_weather", {"city": "a</tool_call>b"}),  # the end marker cannot hide in a string
        "Sure! " + call("get_weather", {"city": "Paris"}),  # nothing but calls
        call("get_weather", {"city": "Paris"}) + " Done.",
        '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>',  # the lines are fixed
        '<tool_call>\n{"arguments": {"city": "Paris"}, "name": "get_weather"}\n</tool_call>',
    ],
)
@pytest.mark.e2e  # compiles in the grammar compiler's child process
def test_a_wrong_name_argument_or_shape_is_refused(compiler, smollm2_tokenizer, text):
    assert not accepts(matcher(compiler), smollm2_tokenizer, text)


@pytest.mark.e2e  # compiles in the grammar compiler's child process
def test_the_output_cannot_end_before_a_call_nor_start_with_anything_else(compiler, smollm2_tokenizer):
    first = allowed(matcher(compiler))
    assert first and EOS not in first
    begin = '<tool_call>\n{"name": "'
    for token_id in first:
        text = smollm2_tokenizer.decode([token_id])
        assert text and (begin.startswith(text) or text.startswith(begin)), text


@pytest.mark.e2e  # compiles in the grammar compiler's child process
def test_a_named_choice_allows_only_that_tool(compiler, smollm2_tokenizer):
    assert accepts(matcher(compiler, "get-time"), smollm2_tokenizer, call("get-time", {}))
    assert not accepts(matcher(compiler, "get-time"), smollm2_tokenizer, call("get_weather", {"city": "Paris"}))


@pytest.mark.e2e  # compiles in the grammar compiler's child process
def test_a_named_choice_is_one_call_and_then_the_grammar_ends(compiler, smollm2_tokenizer):
    named = matcher(compiler, "get-time")
    for token_id in smollm2_tokenizer.encode(call("get-time", {}), add_special_tokens=False):
        assert named.matcher.accept_token(token_id)
    assert named.matcher.is_terminated() or allowed(named) == [EOS]
    twice = call("get-time", {}) + "\n" + call("get-time", {})
    assert not accepts(matcher(compiler, "get-time"), smollm2_tokenizer, twice)
    assert accepts(matcher(compiler), smollm2_tokenizer, twice)  # required: one or more


@pytest.mark.e2e  # compiles in the grammar compiler's child process
def test_with_thinking_the_reasoning_comes_first_then_the_calls(compiler, smollm2_tokenizer):
    text = "The user wants Paris.\n</think>\n" + call("get_weather", {"city": "Paris"})
    assert accepts(matcher(compiler, thinking=True), smollm2_tokenizer, text)
    chat = parse_all(text, thinking=True)
    assert chat.reasoning == "The user wants Paris." and chat.content == ""
    assert [(c.name, c.arguments) for c in chat.tool_calls] == [("get_weather", '{"city":"Paris"}')]
    assert not accepts(matcher(compiler, thinking=True), smollm2_tokenizer, "no end of thought " + call("x", {}))


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.e2e  # compiles in the grammar compiler's child process
def test_whatever_the_grammar_lets_a_model_write_parses_into_valid_calls(compiler, smollm2_tokenizer, seed):
    """A random model: any allowed token but eos, uniformly, ending at random once the grammar may end. The
    tools' arguments are finite (booleans, enums), so every walk ends."""
    rng = random.Random(seed)
    tools = [TIME, FLAGS]
    grammar = matcher(compiler, tools=tools)
    output: list[int] = []
    while not (grammar.can_end and rng.random() < 0.5):
        assert len(output) < 2000
        choices = [token_id for token_id in allowed(grammar) if token_id != EOS]
        if not choices:
            break
        token_id = rng.choice(choices)
        grammar.accept(token_id)
        output.append(token_id)
    text = smollm2_tokenizer.decode(output)
    chat = parse_all(text, thinking=False)
    assert chat.content == "" and chat.reasoning == "" and chat.tool_calls, text
    assert len(chat.tool_calls) == text.count("<tool_call>")
    for parsed in chat.tool_calls:
        tool = next(tool for tool in tools if tool.name == parsed.name)
        jsonschema.validate(json.loads(parsed.arguments), tool.parameters)


def test_a_choice_that_names_no_tool_is_refused_naming_the_field():
    with pytest.raises(InvalidToolError, match=r"tool_choice.tool_name 'get_wether' is not one of the tools: "):
        tool_call_grammar(TOOLS, "get_wether", MARKERS)
    with pytest.raises(InvalidToolError, match="tool_choice required needs at least one tool"):
        tool_call_grammar([], "required", MARKERS)


@pytest.mark.parametrize(
    "parameters, reason",
    [
        ({"type": "object", "properties": {"x": {"type": "string", "pattern": "("}}}, "Regex"),
        ({"type": "object", "$ref": "#/definitions/missing"}, "missing"),
    ],
)
def test_a_schema_the_grammar_cannot_follow_is_refused_naming_its_tool(parameters, reason):
    with pytest.raises(InvalidToolError) as raised:
        tool_call_grammar([WEATHER, ToolSpec("bad", "", parameters)], "required", MARKERS)
    message = str(raised.value)
    assert message.startswith("tools[1].parameters is not a JSON schema the tool-call grammar can follow: ")
    assert reason in message and ".cc:" not in message


@pytest.mark.e2e  # compiles in the grammar compiler's child process
def test_required_without_parallel_calls_is_exactly_one_call_of_any_tool(compiler, smollm2_tokenizer):
    for name, arguments in (("get_weather", {"city": "Paris"}), ("get-time", {})):
        assert accepts(matcher(compiler, parallel=False), smollm2_tokenizer, call(name, arguments))
    two = call("get_weather", {"city": "Paris"}) + "\n" + call("get-time", {})
    assert not accepts(matcher(compiler, parallel=False), smollm2_tokenizer, two)
    assert accepts(matcher(compiler, parallel=True), smollm2_tokenizer, two)
