"""Chat markers and the per-model choice of parsers (engines/chat/markers.py)."""

from __future__ import annotations

import pytest

from engines.chat.markers import ChatMarkers, ChatParsing, MarkerConfigError, chat_parsing, parse_reasoning_markers


def test_the_defaults_are_the_think_and_hermes_markers():
    assert ChatMarkers() == ChatMarkers("<think>", "</think>", "<tool_call>", "</tool_call>")


@pytest.mark.parametrize("architecture", ["llama", "gemma3", "some-new-arch"])
def test_every_architecture_parses_reasoning_and_hermes_tool_calls_by_default(architecture):
    assert chat_parsing(architecture) == ChatParsing(ChatMarkers(), parse_reasoning=True, parse_tools=True)


def test_the_flags_override_the_table():
    parsing = chat_parsing("llama", reasoning_parser="none", tool_call_parser="none")
    assert not parsing.parse_reasoning and not parsing.parse_tools
    assert chat_parsing("llama", tool_call_parser="hermes").parse_tools


def test_reasoning_markers_flag_replaces_only_the_reasoning_markers():
    parsing = chat_parsing("llama", reasoning_markers="<reason>, </reason>")
    assert parsing.markers == ChatMarkers("<reason>", "</reason>", "<tool_call>", "</tool_call>")


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"reasoning_parser": "deepseek"}, "--reasoning-parser deepseek must be one of none, think"),
        ({"tool_call_parser": "mistral"}, "--tool-call-parser mistral must be one of none, hermes"),
        ({"reasoning_markers": "<a>"}, "--reasoning-markers <a> must be START,END (two non-empty markers)"),
        ({"reasoning_markers": "<a>,"}, "--reasoning-markers <a>, must be START,END (two non-empty markers)"),
        ({"reasoning_markers": "<a>,<b>,<c>"}, "must be START,END"),
        ({"reasoning_markers": "<a>,<a>"}, "must name two different markers"),
        ({"reasoning_markers": "<tool_call>,</x>"}, "--reasoning-markers <tool_call>,</x>: chat markers must differ"),
        ({"reasoning_markers": "<t,</t>"}, "must not occur inside"),
    ],
)
def test_bad_flags_are_refused_naming_the_flag(kwargs, message):
    with pytest.raises(MarkerConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        chat_parsing("llama", **kwargs)


def test_a_marker_inside_another_is_refused():
    # The parser takes the first complete marker; `<tool` inside `<tool_call>` would cut calls short.
    with pytest.raises(MarkerConfigError, match="must not occur inside"):
        ChatMarkers(reasoning_start="<tool")


@pytest.mark.parametrize("bad", ["", " <think>", "<think>\n"])
def test_empty_or_padded_markers_are_refused(bad):
    with pytest.raises(MarkerConfigError, match="non-empty with no surrounding whitespace"):
        ChatMarkers(reasoning_start=bad)


def test_parse_reasoning_markers_strips_around_the_comma():
    assert parse_reasoning_markers(" <r> , </r> ") == ("<r>", "</r>")
