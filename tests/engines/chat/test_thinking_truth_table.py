"""The thinking truth table, checked where it matters: for every combination of `thinking`,
`enable_thinking` (absent / true / false / null) and `reasoning_effort` (absent, "none", "None",
null, "low", "high"), the prompt the real template renders opens reasoning exactly when the output
parser starts in reasoning, and the same model output lands in reasoning or content accordingly.

The templates are Qwen3-like test templates rendered by transformers (through ChatTemplate) with
SmolLM2's tokenizer: one thinks by default (it writes `<think>\\n` after the generation prompt
unless told not to, and an empty closed block when told not to), one only when asked."""

from __future__ import annotations

import itertools

import pytest

from dpgate.chat.template import ChatTemplate
from engines.chat.markers import ChatMarkers
from engines.chat.output_parser import ChatOutputParser, ParsedToolCall, collect, parse_all

ABSENT = object()
SWITCHES = {"absent": ABSENT, "true": True, "false": False, "null": None}
EFFORTS = {"absent": ABSENT, '"none"': "none", '"None"': "None", "null": None, '"low"': "low", '"high"': "high"}

_MESSAGES = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
)
DEFAULT_ON_TEMPLATE = (
    _MESSAGES + "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}"
    "{%- else %}{{- '<think>\\n' }}{%- endif %}{%- endif %}"
)
DEFAULT_OFF_TEMPLATE = (
    _MESSAGES + "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking %}{{- '<think>\\n' }}{%- endif %}{%- endif %}"
)
MESSAGES = [{"role": "user", "content": "What is the weather in Paris?"}]
OPENED = "<|im_start|>assistant\n<think>\n"
MODEL_OUTPUT = (
    'reasoning text</think>\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
)
WEATHER_CALL = ParsedToolCall("call_0", "get_weather", '{"city":"Paris"}')


@pytest.fixture(scope="module")
def templates(smollm2_tokenizer) -> dict[bool, ChatTemplate]:
    """By their default: True -> the template that thinks unless told not to."""
    made = {
        True: ChatTemplate(DEFAULT_ON_TEMPLATE, ChatMarkers()),
        False: ChatTemplate(DEFAULT_OFF_TEMPLATE, ChatMarkers()),
    }
    assert made[True].thinking_default is True and made[False].thinking_default is False
    return made


def expected_thinking(thinking, enable_thinking, effort, default: bool) -> bool:
    """The rule of the issue, written out row by row apart from the implementation."""
    if effort == "none":
        return False
    if True in (thinking, enable_thinking):
        return True
    if thinking is ABSENT and enable_thinking is ABSENT:
        return default
    return False  # an explicit false or null, and nothing true


ROWS = list(itertools.product(SWITCHES, SWITCHES, EFFORTS))


@pytest.mark.parametrize("default", [True, False], ids=["default-on", "default-off"])
@pytest.mark.parametrize("thinking, enable_thinking, effort", ROWS)
def test_the_rendered_prompt_and_the_parsers_starting_state_agree_on_every_row(
    templates, default, thinking, enable_thinking, effort
):
    values = (SWITCHES[thinking], SWITCHES[enable_thinking], EFFORTS[effort])
    keys = ("thinking", "enable_thinking", "reasoning_effort")
    kwargs = {key: value for key, value in zip(keys, values, strict=True) if value is not ABSENT}
    want = expected_thinking(*values, default=default)

    prompt = templates[default].render(MESSAGES, None, kwargs)
    parser = ChatOutputParser(prompt.thinking, ChatMarkers())

    assert prompt.thinking is want
    assert parser.starts_in_reasoning is want
    assert prompt.text.endswith(OPENED) is want  # the prompt opens reasoning exactly when the parser is in it
    if not want:
        closed = "<think>\n\n</think>\n\n" if default else ""
        assert prompt.text.endswith("<|im_start|>assistant\n" + closed)
    chat = collect(parser.feed(MODEL_OUTPUT) + parser.finish())
    assert (chat.reasoning, chat.content) == (("reasoning text", "") if want else ("", "reasoning text"))
    assert chat.tool_calls == [WEATHER_CALL]


def test_with_a_default_on_template_reasoning_then_a_call_gives_reasoning_no_content_and_one_call(templates):
    prompt = templates[True].render(MESSAGES, None, None)
    assert prompt.thinking and prompt.text.endswith(OPENED)
    chat = parse_all(MODEL_OUTPUT, prompt.thinking)
    assert chat.reasoning == "reasoning text"
    assert chat.content == ""
    assert chat.tool_calls == [WEATHER_CALL]


@pytest.mark.parametrize(
    "kwargs",
    [{"enable_thinking": False}, {"thinking": False}, {"thinking": None}, {"reasoning_effort": "none"}],
    ids=["enable_thinking-false", "thinking-false", "thinking-null", "reasoning_effort-none"],
)
def test_the_same_output_with_thinking_opted_out_has_no_reasoning(templates, kwargs):
    prompt = templates[True].render(MESSAGES, None, kwargs)
    assert not prompt.thinking and not prompt.text.endswith(OPENED)
    chat = parse_all(MODEL_OUTPUT, prompt.thinking)
    assert chat.reasoning == ""
    assert chat.tool_calls == [WEATHER_CALL]
