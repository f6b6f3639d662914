"""ChatTemplate: where the template comes from (GGUF metadata, tokenizer files, --chat-template FILE),
rendering (dpgate/chat/jinja_env.py) equal to transformers' apply_chat_template, the thinking
default, tools for a template that ignores them, and the refusal of a model without a template."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dpgate.chat.jinja_env import render_template
from dpgate.chat.template import (
    NO_TEMPLATE_MESSAGE,
    ChatTemplateError,
    NoChatTemplateError,
    read_template_file,
)
from engines.chat.markers import ChatMarkers
from engines.chat.template import chat_template_for, load_chat_template
from engines.config import ConfigError, EngineConfig
from engines.sampling.params import InvalidRequestError
from tests.support.chat_templates import GEMMA_STYLE_TEMPLATE
from tests.tiny_model import make_tiny_llama_dir

MARKERS = ChatMarkers()
USER = [{"role": "user", "content": "hi"}]
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
# A Qwen3-like template: thinking unless enable_thinking is false; it reads tools itself.
THINKING_TEMPLATE = (
    "{% if tools %}<tools>{{ tools | tojson }}</tools>\n{% endif %}"
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "<|im_start|>assistant\n"
    "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n"
    "{% else %}<think>\n{% endif %}"
    "[t={{ thinking }}]"
)


def test_the_gguf_template_of_smollm2_renders_as_transformers_renders_it(smollm2_tokenizer):
    template = chat_template_for(smollm2_tokenizer, MARKERS)
    assert template.source == smollm2_tokenizer.chat_template  # from GGUF metadata tokenizer.chat_template
    rendered = template.render(USER, None, None)
    expected = smollm2_tokenizer.apply_chat_template(USER, tokenize=False, add_generation_prompt=True)
    assert rendered.text == expected
    assert rendered.text.startswith("<|im_start|>system\n") and rendered.text.endswith("<|im_start|>assistant\n")
    # SmolLM2's template has no thinking switch: a request asking to think still does not.
    assert (template.supports_thinking, template.thinking_default, template.handles_tools) == (False, False, False)
    assert template.render(USER, None, {"thinking": True}).thinking is False


CALL = {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Zürich"}}}
CONVERSATIONS = [
    [{"role": "user", "content": "hi"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "  東京 の天気は？ 🙂 "}],
    [
        {"role": "user", "content": "Weather in Zürich?"},
        {"role": "assistant", "content": "", "tool_calls": [CALL, CALL]},
        {"role": "tool", "content": '{"temp": -3}', "tool_call_id": "c1", "name": "get_weather"},
        {"role": "assistant", "content": "It is cold.", "reasoning_content": "the tool said -3"},
        {"role": "user", "content": "<start_of_turn>and tomorrow?<|im_end|>"},
    ],
]


@pytest.fixture(scope="module")
def gemma3_tokenizer():
    from engines.model.source import resolve_model
    from engines.model.tokenizer import load_tokenizer

    return load_tokenizer(resolve_model("gemma3-270m")).tokenizer


@pytest.mark.parametrize("model", ["smollm2", "gemma3"])
@pytest.mark.parametrize("conversation", range(len(CONVERSATIONS)))
@pytest.mark.parametrize(
    "kwargs", [{}, {"enable_thinking": False, "thinking": False}, {"bos_token": "[B]", "extra": [1.0, "é"]}]
)
def test_rendering_equals_transformers_apply_chat_template(
    request, smollm2_tokenizer, model, conversation, kwargs
):
    """The engine no longer renders through transformers; its own environment must give the same text
    for the packaged SmolLM2 template and for a template using every convention (tests/support/)."""
    tokenizer = smollm2_tokenizer if model == "smollm2" else request.getfixturevalue("gemma3_tokenizer")
    template = chat_template_for(tokenizer, MARKERS, None if model == "smollm2" else GEMMA_STYLE_TEMPLATE)
    messages = CONVERSATIONS[conversation]
    if model == "smollm2":  # its template reads content only
        messages = [{"role": m["role"], "content": m["content"]} for m in messages]
    tools = [WEATHER] if model == "gemma3" else None
    ours = render_template(template.source, messages, tools, {**template.special_tokens, **kwargs})
    expected = tokenizer.apply_chat_template(
        messages, tools=tools, chat_template=template.source, tokenize=False, add_generation_prompt=True, **kwargs
    )
    assert ours == expected
    assert template.special_tokens["bos_token"] == ("<|im_start|>" if model == "smollm2" else "<bos>")


def test_the_sandbox_and_the_namespace_guard_hold():
    from jinja2.exceptions import SecurityError

    with pytest.raises(SecurityError):
        render_template("{% set ns = namespace(_x=1) %}", USER, None, {})
    with pytest.raises(SecurityError):
        render_template("{{ messages.__class__.__mro__ }}", USER, None, {})
    with pytest.raises(SecurityError):  # immutable: a template may not edit what it is given
        render_template("{{ messages.append(1) }}", USER, None, {})


def test_a_template_that_ignores_tools_gets_them_in_a_hermes_system_block(smollm2_tokenizer):
    template = chat_template_for(smollm2_tokenizer, MARKERS)
    text = template.render(USER, [WEATHER], None).text
    system = text.split("<|im_end|>", 1)[0]
    assert system.startswith("<|im_start|>system\n")
    assert json.dumps(WEATHER) in system and "<tool_call>" in system and "</tool_call>" in system
    # An earlier call and its result are written as the markup the model reads and writes.
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Oslo"}}}
    history = [
        *USER,
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "content": "-3 C", "tool_call_id": "call_1"},
    ]
    text = template.render(history, [WEATHER], None).text
    call_text = '{"name": "get_weather", "arguments": {"city": "Oslo"}}'
    assert f"<|im_start|>assistant\n<tool_call>\n{call_text}\n</tool_call>" in text
    assert "<|im_start|>user\n<tool_response>\n-3 C\n</tool_response><|im_end|>" in text


def test_a_system_message_keeps_its_text_before_the_tool_block(smollm2_tokenizer):
    template = chat_template_for(smollm2_tokenizer, MARKERS)
    text = template.render([{"role": "system", "content": "Be brief."}, *USER], [WEATHER], None).text
    assert text.startswith("<|im_start|>system\nBe brief.\n\nYou are a function calling AI model.")


def test_chat_template_file_replaces_the_models_template(tmp_path: Path, smollm2_tokenizer):
    path = tmp_path / "chat.jinja"
    path.write_text(THINKING_TEMPLATE)
    template = load_chat_template(smollm2_tokenizer, MARKERS, read_template_file(str(path)))
    assert template is not None and template.source == THINKING_TEMPLATE
    assert template.handles_tools and template.supports_thinking and template.thinking_default
    rendered = template.render(USER, [WEATHER], None)
    assert rendered.thinking is True
    assert rendered.text.endswith("<|im_start|>assistant\n<think>\n[t=True]")
    assert rendered.text.startswith("<tools>") and '"get_weather"' in rendered.text  # the template's own tools


@pytest.mark.parametrize(
    ("kwargs", "thinking", "tail"),
    [
        (None, True, "<think>\n[t=True]"),
        ({"enable_thinking": False}, False, "<think>\n\n</think>\n\n[t=False]"),
        ({"thinking": None}, False, "<think>\n\n</think>\n\n[t=False]"),  # null opts out
        ({"thinking": True, "enable_thinking": False}, True, "<think>\n[t=True]"),  # OR of the two keys
        ({"reasoning_effort": "none"}, False, "<think>\n\n</think>\n\n[t=False]"),
        ({"reasoning_effort": "high"}, True, "<think>\n[t=True]"),
    ],
)
def test_the_resolved_thinking_reaches_the_template_as_both_keys(smollm2_tokenizer, kwargs, thinking, tail):
    template = chat_template_for(smollm2_tokenizer, MARKERS, THINKING_TEMPLATE)
    rendered = template.render(USER, None, kwargs)
    assert rendered.thinking is thinking
    assert rendered.text.endswith(tail)


def test_a_template_whose_default_is_off_is_detected(smollm2_tokenizer):
    switch = "enable_thinking is defined and enable_thinking is false"
    source = THINKING_TEMPLATE.replace(switch, "not (enable_thinking is defined and enable_thinking)")
    template = chat_template_for(smollm2_tokenizer, MARKERS, source)
    assert template.supports_thinking and not template.thinking_default
    assert template.render(USER, None, {"enable_thinking": True}).thinking is True


def test_template_files_may_be_json_wrapped(tmp_path: Path):
    as_string = tmp_path / "template.json"
    as_string.write_text(json.dumps(THINKING_TEMPLATE))
    as_config = tmp_path / "tokenizer_config.json"
    as_config.write_text(json.dumps({"chat_template": THINKING_TEMPLATE, "eos_token": "<|im_end|>"}))
    assert read_template_file(str(as_string)) == THINKING_TEMPLATE
    assert read_template_file(str(as_config)) == THINKING_TEMPLATE


def test_a_template_refusing_the_conversation_is_an_invalid_request(smollm2_tokenizer):
    refusal = "{{ raise_exception('the first message must be a user message') }}"
    source = "{% if messages[0].role != 'user' %}" + refusal + "{% endif %}"
    template = chat_template_for(smollm2_tokenizer, MARKERS, source + THINKING_TEMPLATE)
    with pytest.raises(ChatTemplateError, match="the first message must be a user message") as info:
        template.render([{"role": "assistant", "content": "x"}], None, None)
    assert isinstance(info.value, InvalidRequestError)


def test_a_model_without_a_template_is_refused_with_how_to_pass_one(tmp_path: Path):
    from transformers import AutoTokenizer

    model_dir = make_tiny_llama_dir(tmp_path / "tiny")
    with_template = AutoTokenizer.from_pretrained(str(model_dir))
    assert with_template.chat_template  # the tiny model keeps SmolLM2's template
    config_path = model_dir / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config.pop("chat_template", None)
    config_path.write_text(json.dumps(config))
    (model_dir / "chat_template.jinja").unlink(missing_ok=True)
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    assert not tokenizer.chat_template
    with pytest.raises(NoChatTemplateError) as info:
        chat_template_for(tokenizer, MARKERS)
    assert str(info.value) == NO_TEMPLATE_MESSAGE
    assert NO_TEMPLATE_MESSAGE == "the model has no chat template; pass one with --chat-template FILE"
    assert load_chat_template(tokenizer, MARKERS, None) is None  # the engine starts; Chat refuses
    assert load_chat_template(tokenizer, MARKERS, THINKING_TEMPLATE) is not None  # --chat-template fixes it


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"chat_template": "/nonexistent/chat.jinja"}, "--chat-template /nonexistent/chat.jinja cannot be read"),
        ({"reasoning_parser": "r1"}, "--reasoning-parser r1 must be one of none, think"),
        ({"tool_call_parser": "json"}, "--tool-call-parser json must be one of none, hermes"),
        ({"reasoning_markers": "<a>,<a>"}, "--reasoning-markers <a>,<a> must name two different markers"),
    ],
)
def test_chat_flags_are_checked_with_one_sentence(fields, message):
    with pytest.raises(ConfigError, match="^" + message.replace("(", r"\(")):
        EngineConfig(**fields).validate()


def test_an_empty_template_file_is_refused(tmp_path: Path):
    path = tmp_path / "empty.jinja"
    path.write_text("  \n")
    with pytest.raises(ConfigError, match=f"^--chat-template {path} cannot be read \\(the file is empty\\)$"):
        EngineConfig(chat_template=str(path)).validate()
