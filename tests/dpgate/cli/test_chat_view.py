"""The chat screen: reasoning prefixed and apart, tool calls as calls, sections on their own lines."""

from __future__ import annotations

import io

from dpgate.cli.chat_view import AnswerView, tool_call_text
from dpgate.client.chat_messages import ToolCall
from dpgate.client.chat_results import ContentDelta, ReasoningDelta, ToolCallItem
from dpgate.client.results import Finish, FinishReason, Usage


def render(items, styled: bool = False, finish: Finish | None = None) -> str:
    out = io.StringIO()
    view = AnswerView(out, styled)
    for item in items:
        view.show(item)
    view.end(finish)
    return out.getvalue()


def test_reasoning_lines_are_prefixed_and_the_answer_starts_on_its_own_line() -> None:
    items = [
        ReasoningDelta("\nThe user", ()), ReasoningDelta(" asks.\nSo", ()), ReasoningDelta(" 4.\n\n", ()),
        ContentDelta("\n\nIt is", ()), ContentDelta(" 4.", ()),
    ]  # fmt: skip
    assert render(items) == "thinking: The user asks.\nthinking: So 4.\nIt is 4.\n"


def test_a_tool_call_is_printed_as_a_call_with_readable_arguments() -> None:
    call = ToolCall("call_1", "get_weather", '{"city":"Paris","days":[1,2]}')
    text = render([ContentDelta("Let me look.", ()), ToolCallItem(call, ())])
    assert text == 'Let me look.\ntool call get_weather({"city": "Paris", "days": [1, 2]})\n'


def test_arguments_that_are_not_json_are_shown_as_sent() -> None:
    assert tool_call_text(ToolCall("c", "f", "{oops")) == "f({oops)"


def test_blank_lines_inside_a_section_are_kept_and_only_its_edges_are_trimmed() -> None:
    text = render([ContentDelta("one\n\n", ()), ContentDelta("two\n", ())])
    assert text == "one\n\ntwo\n"


def test_on_a_terminal_reasoning_is_dim_and_every_styled_write_resets() -> None:
    text = render([ReasoningDelta("hmm", ()), ContentDelta("yes", ())], styled=True)
    assert text == "\x1b[2mthinking: hmm\x1b[0m\nyes\n"
    assert "\x1b" not in render([ReasoningDelta("hmm", ())], styled=False)


def test_an_answer_cut_by_max_tokens_says_so_and_a_cancelled_one_is_marked() -> None:
    finish = Finish(FinishReason.LENGTH, None, Usage(3, 8))
    assert render([ContentDelta("half", ())], finish=finish) == "half\n[answer cut short: --max-tokens reached]\n"
    out = io.StringIO()
    view = AnswerView(out, styled=False)
    view.show(ContentDelta("partial", ()))
    view.cancelled()
    view.show(ContentDelta("next", ()))
    view.end(Finish(FinishReason.STOP, 2, Usage(3, 1)))
    assert out.getvalue() == "partial\n[answer cancelled]\nnext\n"
