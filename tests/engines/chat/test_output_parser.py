"""ChatOutputParser: content, reasoning and Hermes tool calls out of a model's text, streamed or whole."""

from __future__ import annotations

import itertools
import json
import random

import pytest

from engines.chat.markers import ChatMarkers, ChatParsing
from engines.chat.output_parser import (
    ChatOutputParser,
    ChatPiece,
    ParsedChat,
    ParsedToolCall,
    collect,
    drop_tool_calls_after,
    parse_all,
)

WEATHER_CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
MARKERS = ChatMarkers()
ALL_MARKERS = ("<think>", "</think>", "<tool_call>", "</tool_call>")
ANY_CALL = ParsedToolCall("call_0", "get_weather", '{"city":"Paris"}')


def stream(text: str, cuts: list[int], thinking: bool, **options) -> list[ChatPiece]:
    """The pieces of `text` fed in chunks cut at `cuts`, merged by kind across feeds."""
    parser = ChatOutputParser(thinking, **options)
    bounds = [0, *cuts, len(text)]
    pieces: list[ChatPiece] = []
    for start, end in itertools.pairwise(bounds):
        pieces += parser.feed(text[start:end])
    pieces += parser.finish()
    return merged(pieces)


def whole(text: str, thinking: bool, **options) -> list[ChatPiece]:
    parser = ChatOutputParser(thinking, **options)
    return merged(parser.feed(text) + parser.finish())


def merged(pieces: list[ChatPiece]) -> list[ChatPiece]:
    out: list[ChatPiece] = []
    for piece in pieces:
        assert piece.kind == "tool_call" or piece.text, "a text piece is never empty"
        if out and piece.kind != "tool_call" and out[-1].kind == piece.kind:
            out[-1] = ChatPiece(piece.kind, out[-1].text + piece.text)
        else:
            out.append(piece)
    return out


# --- the must-show cases ----------------------------------------------------------------------


def test_reasoning_then_a_tool_call_gives_reasoning_no_content_and_one_call():
    chat = parse_all("reasoning text</think>\n" + WEATHER_CALL, thinking=True, request_id="req42")
    assert chat.reasoning == "reasoning text"
    assert chat.content == ""
    assert chat.tool_calls == [ParsedToolCall("call_req42_0", "get_weather", '{"city":"Paris"}')]


def test_the_same_output_with_thinking_opted_out_has_no_reasoning():
    chat = parse_all("reasoning text</think>\n" + WEATHER_CALL, thinking=False, request_id="req42")
    assert chat.reasoning == ""
    assert chat.content == "reasoning text"  # the stray </think> is markup: dropped, never shown
    assert [call.name for call in chat.tool_calls] == ["get_weather"]


# --- streaming equals whole-text parsing ----------------------------------------------------------

SAMPLES = [
    ("reasoning text</think>\n" + WEATHER_CALL, True),
    ("reasoning text</think>\n" + WEATHER_CALL, False),
    ("<think>\nI should call.\n</think>\n\nSure: " + WEATHER_CALL + "\n" + WEATHER_CALL + "\nDone.", True),
    ("plain answer with a < sign and </ and <tool and </thin in it", False),
    ("Hi <think>mid thought</think> back <tool_call>{bad json}</tool_call> after", False),
    ('<tool_call>{"name": "f", "arguments": {"s": "</think> <think>"}}</tool_call>', False),
    ('unclosed <tool_call>{"name": "f", "arguments": {}', False),
    ('thinking <tool_call>\n{"name": "g", "parameters": {"x": 1}}\n</tool_call>   ', True),
    ("a</tool_call>b<think><think>c</think></think>d  \n", True),
    ('é ü 雨 <tool_call>{"name": "天气", "arguments": "{\\"城市\\": \\"巴黎\\"}"}</tool_call> ✓', False),
]


@pytest.mark.parametrize("text, thinking", SAMPLES)
def test_every_single_split_point_gives_the_whole_texts_pieces(text, thinking):
    expected = whole(text, thinking)
    for cut in range(len(text) + 1):
        assert stream(text, [cut], thinking) == expected, f"cut at {cut}: {text[:cut]!r} | {text[cut:]!r}"


@pytest.mark.parametrize("text, thinking", SAMPLES[:4])
def test_every_pair_of_split_points_gives_the_whole_texts_pieces(text, thinking):
    expected = whole(text, thinking)
    for first in range(len(text) + 1):
        for second in range(first, len(text) + 1):
            assert stream(text, [first, second], thinking) == expected, (first, second)


@pytest.mark.parametrize("text, thinking", SAMPLES)
def test_one_character_at_a_time_gives_the_whole_texts_pieces(text, thinking):
    assert stream(text, list(range(1, len(text))), thinking) == whole(text, thinking)


@pytest.mark.parametrize("seed", range(200))
def test_random_chunkings_of_random_markup_give_the_whole_texts_pieces(seed):
    rng = random.Random(seed)
    words = [*ALL_MARKERS, "<", "</", "<th", "</tool", " ", "\n", "x", "hello", WEATHER_CALL, '{"name": "f"}', "}"]
    text = "".join(rng.choice(words) for _ in range(rng.randint(1, 25)))
    thinking = rng.random() < 0.5
    parse_tools, parse_reasoning = rng.random() < 0.8, rng.random() < 0.8
    options = {"parse_tools": parse_tools, "parse_reasoning": parse_reasoning}
    cuts = sorted(rng.sample(range(len(text) + 1), rng.randint(0, min(8, len(text)))))
    assert stream(text, cuts, thinking, **options) == whole(text, thinking, **options), (text, cuts)


@pytest.mark.parametrize("text, thinking", SAMPLES)
def test_parse_all_is_the_streaming_parsers_pieces_joined(text, thinking):
    assert parse_all(text, thinking) == collect(stream(text, list(range(1, len(text), 3)), thinking))


# --- markup never leaks -------------------------------------------------------------------------


@pytest.mark.parametrize("text, thinking", SAMPLES)
def test_no_marker_reaches_reasoning_or_content_outside_a_call_that_did_not_parse(text, thinking):
    chat = parse_all(text, thinking)
    assert not any(marker in chat.reasoning for marker in ALL_MARKERS)
    if "bad json" not in text and "unclosed" not in text:
        assert not any(marker in chat.content for marker in ALL_MARKERS)


def test_a_marker_split_across_chunks_is_held_back_and_never_shown():
    parser = ChatOutputParser(thinking=True)
    assert parser.feed("step one</th") == [ChatPiece("reasoning", "step one")]
    assert parser.feed("ink>\n\nanswer <tool") == [ChatPiece("content", "answer ")]
    assert parser.feed("_call>") == []
    assert parser.feed('{"name": "f", "arguments": {}}</tool_call>') == [
        ChatPiece("tool_call", tool_call=ParsedToolCall("call_0", "f", "{}"))
    ]
    assert parser.finish() == []


def test_only_a_possible_marker_start_is_held_back():
    parser = ChatOutputParser(thinking=False)
    assert parser.feed("a <b") == [ChatPiece("content", "a <b")]  # "<b" starts no marker
    assert parser.feed(" 1 </") == [ChatPiece("content", " 1 ")]  # "</" might be "</think>"
    assert parser.feed("x> y") == [ChatPiece("content", "</x> y")]
    assert parser.feed("<") == []
    assert parser.finish() == [ChatPiece("content", "<")]


def test_whitespace_waits_only_where_a_marker_would_drop_it():
    parser = ChatOutputParser(thinking=False)
    assert parser.feed("\n ") == []  # content that is whitespace so far: a first marker would drop it
    assert parser.feed(" OK \n") == [ChatPiece("content", "\n  OK \n")]  # kept exactly once text came
    assert parser.finish() == []
    parser = ChatOutputParser(thinking=False)
    assert parser.feed("\n\n") == [] and parser.feed(WEATHER_CALL) == [ChatPiece("tool_call", tool_call=ANY_CALL)]
    parser = ChatOutputParser(thinking=False)
    assert parser.feed(" ") == [] and parser.finish() == [ChatPiece("content", " ")]  # no marker followed
    parser = ChatOutputParser(thinking=True)
    assert parser.feed("\nidea \n") == [ChatPiece("reasoning", "idea")]  # `</think>` may follow
    assert parser.feed("more") == [ChatPiece("reasoning", " \nmore")]
    assert parser.feed("\n</think>\n\nanswer") == [ChatPiece("content", "answer")]


# --- reasoning ------------------------------------------------------------------------------------


def test_a_thinking_request_starts_in_reasoning_and_one_that_does_not_in_content():
    assert ChatOutputParser(thinking=True).starts_in_reasoning
    assert not ChatOutputParser(thinking=False).starts_in_reasoning
    assert not ChatOutputParser(thinking=True, parse_reasoning=False).starts_in_reasoning


def test_a_leading_think_from_the_model_is_swallowed():
    chat = parse_all("<think>\nLet me think.\n</think>\n\nThe answer is 4.", thinking=True)
    assert chat == ParsedChat(content="The answer is 4.", reasoning="Let me think.")


def test_reasoning_never_closed_is_all_reasoning():
    assert parse_all("still thinking when the tokens ran out", thinking=True) == ParsedChat(
        reasoning="still thinking when the tokens ran out"
    )


def test_a_model_that_thinks_unasked_has_its_thoughts_as_reasoning():
    chat = parse_all("<think>hmm</think>\n\nfour", thinking=False)
    assert chat == ParsedChat(content="four", reasoning="hmm")


def test_stray_reasoning_markers_are_dropped():
    assert parse_all("a</think>b</think>c", thinking=False) == ParsedChat(content="abc")
    assert parse_all("a<think>b</think>c</think>d", thinking=True) == ParsedChat(content="cd", reasoning="ab")


def test_without_a_reasoning_parser_think_markers_are_plain_content():
    text = "<think>x</think> y"
    assert parse_all(text, thinking=True, parse_reasoning=False) == ParsedChat(content=text)


def test_configured_reasoning_markers():
    markers = ChatMarkers(reasoning_start="<reason>", reasoning_end="</reason>")
    chat = parse_all("a</reason><think>b", thinking=True, markers=markers)
    assert chat == ParsedChat(content="<think>b", reasoning="a")


def test_a_tool_call_inside_reasoning_ends_the_reasoning():
    chat = parse_all("I will call it. " + WEATHER_CALL, thinking=True)
    assert chat.reasoning == "I will call it." and chat.content == "" and len(chat.tool_calls) == 1


# --- tool calls -----------------------------------------------------------------------------------


def test_several_calls_with_text_between_them_and_deterministic_ids():
    text = "Checking both.\n" + WEATHER_CALL + "\n\n" + WEATHER_CALL.replace("Paris", "Rome") + "\nThere."
    chat = parse_all(text, thinking=False, request_id="0123456789abcdefXYZ")
    assert chat.content == "Checking both.\nThere."
    assert [(c.id, c.arguments) for c in chat.tool_calls] == [
        ("call_0123456789abcdef_0", '{"city":"Paris"}'),
        ("call_0123456789abcdef_1", '{"city":"Rome"}'),
    ]
    assert parse_all(text, thinking=False, request_id="0123456789abcdefXYZ") == chat


def test_whitespace_only_content_between_calls_is_dropped():
    chat = parse_all(WEATHER_CALL + "\n  \n" + WEATHER_CALL + "\n", thinking=False)
    assert chat.content == "" and len(chat.tool_calls) == 2


@pytest.mark.parametrize(
    "body, name, arguments",
    [
        ('{"name": "f", "arguments": {"a": [1, 2], "b": null}}', "f", '{"a":[1,2],"b":null}'),
        ('{"name": "f", "arguments": "{\\"a\\": 1}"}', "f", '{"a":1}'),
        ('{"name": "f", "parameters": {"a": 1}}', "f", '{"a":1}'),
        ('{"name": "f"}', "f", "{}"),
        ('{"name": "f", "arguments": null}', "f", "{}"),
        ('  {"arguments": {"q": "雨"}, "name": "get-x_1"}  ', "get-x_1", '{"q":"雨"}'),
        ('{"name": "f", "arguments": {"s": "<think></tool_call"}}', "f", '{"s":"<think></tool_call"}'),
    ],
)
def test_the_accepted_tool_call_bodies(body, name, arguments):
    chat = parse_all(f"<tool_call>{body}</tool_call>", thinking=False)
    assert chat.content == ""
    assert [(c.name, c.arguments) for c in chat.tool_calls] == [(name, arguments)]
    assert isinstance(json.loads(chat.tool_calls[0].arguments), dict)


@pytest.mark.parametrize(
    "body",
    [
        "{bad json}",
        '{"name": "f", "arguments": {"a": 1}',
        '{"arguments": {"a": 1}}',
        '{"name": "", "arguments": {}}',
        '{"name": 3, "arguments": {}}',
        '{"name": "f", "arguments": [1]}',
        '{"name": "f", "arguments": "not json"}',
        '{"name": "f", "arguments": "[1]"}',
        '{"name": "f", "arguments": {"a": NaN}}',
        '["f", {}]',
        "",
    ],
)
def test_a_malformed_call_is_dropped_and_its_markup_never_reaches_content(body):
    text = f"<tool_call>\n{body}\n</tool_call>"
    parser = ChatOutputParser(thinking=False)
    chat = collect([*parser.feed("Before. " + text + " After."), *parser.finish()])
    assert chat.tool_calls == []
    assert chat.content == "Before. After." and parser.num_dropped_calls == 1


def test_a_call_left_open_at_finish_is_dropped():
    parser = ChatOutputParser(thinking=False)
    assert parser.feed('Calling <tool_call>\n{"name": "f", "argu') == [ChatPiece("content", "Calling ")]
    assert parser.finish() == [] and parser.num_dropped_calls == 1


def test_a_malformed_call_does_not_use_up_an_id():
    chat = parse_all("<tool_call>x</tool_call>" + WEATHER_CALL, thinking=False)
    assert [c.id for c in chat.tool_calls] == ["call_0"]


def test_without_a_tool_parser_tool_markup_is_plain_content():
    text = "a " + WEATHER_CALL + " </tool_call>"
    assert parse_all(text, thinking=False, parse_tools=False) == ParsedChat(content=text)


def test_for_parsing_takes_the_models_configuration():
    parser = ChatOutputParser.for_parsing(ChatParsing(parse_reasoning=False, parse_tools=False), thinking=True)
    assert parser.feed("<think>" + WEATHER_CALL) == [ChatPiece("content", "<think>" + WEATHER_CALL)]


def test_feed_after_finish_is_a_bug_and_finish_twice_gives_nothing():
    parser = ChatOutputParser(thinking=True)
    assert parser.feed("x ") == [ChatPiece("reasoning", "x")]
    assert parser.finish() == [ChatPiece("reasoning", " ")]
    assert parser.finish() == []
    with pytest.raises(RuntimeError):
        parser.feed("y")


def test_a_long_call_body_is_searched_once_not_again_per_chunk():
    parser = ChatOutputParser(thinking=False)
    parser.feed('<tool_call>{"name": "f", "arguments": {"s": "')
    for _ in range(2000):
        assert parser.feed("abcdefgh</tool_cal") == []  # never complete: "</tool_cal" + "abc..." is no end
    pieces = parser.feed('"}}</tool_call>')
    assert len(pieces) == 1 and pieces[0].tool_call is not None
    assert json.loads(pieces[0].tool_call.arguments)["s"].startswith("abcdefgh</tool_cal")


def test_calls_past_the_limit_are_dropped_across_steps_and_nothing_else_is():
    first = ChatPiece("tool_call", tool_call=ParsedToolCall("call_0", "a", "{}"))
    second = ChatPiece("tool_call", tool_call=ParsedToolCall("call_1", "b", "{}"))
    text = ChatPiece("content", "hi")
    kept, seen = drop_tool_calls_after([text, first], 0, 1)
    assert (kept, seen) == ([text, first], 1)
    kept, seen = drop_tool_calls_after([second, text], seen, 1)
    assert (kept, seen) == ([text], 2)
    assert drop_tool_calls_after([first, second], 0, None) == ([first, second], 2)
