"""The status line's arithmetic and the bytes it writes (the tmux test shows what a screen makes of them)."""

from __future__ import annotations

import io

from dpgate.cli.generate_status import CursorColumn, GenerationClock, TerminalStatus, shares_terminal
from dpgate.client.results import Finish, FinishReason, Usage


def test_the_clock_reports_ttft_and_the_decode_rate():
    clock = GenerationClock(started=10.0)
    assert clock.live_text(10.25) == "waiting for the first token (0.2 s)"
    clock.on_tokens(0, 10.3)  # a delta holding back half a character carries no token
    clock.on_tokens(1, 10.5)
    assert clock.tokens_per_second() is None
    assert clock.live_text(10.5) == "TTFT 0.500 s, 1 token"
    for step in range(1, 11):
        clock.on_tokens(2, 10.5 + step * 0.1)
    # 20 tokens after the first step, in 1.0 s: the first step's token and the prompt time are not in it.
    assert clock.tokens_per_second() == 20.0
    assert clock.live_text(11.5) == "TTFT 0.500 s, 20.0 tok/s, 21 tokens"
    finish = Finish(FinishReason.LENGTH, None, Usage(prompt_tokens=5, completion_tokens=21))
    assert clock.final_text(finish, 11.75) == (
        "TTFT 0.500 s, 20.0 tok/s, 5 prompt + 21 generated tokens in 1.75 s, finish: length"
    )


def test_a_call_that_generated_nothing_still_gets_a_final_line():
    finish = Finish(FinishReason.STOP, 2, Usage(prompt_tokens=3, completion_tokens=0))
    assert (
        GenerationClock(started=0.0).final_text(finish, 0.5) == "3 prompt + 0 generated tokens in 0.50 s, finish: stop"
    )


def test_without_stdout_on_screen_the_line_is_redrawn_in_place():
    stream = io.StringIO()
    status = TerminalStatus(stream, is_footer=False)
    status.clear()  # nothing shown yet: nothing written
    status.show("a")
    status.show("b")
    status.finish("done")
    assert stream.getvalue() == "\r\x1b[2Ka\r\x1b[2Kb\r\x1b[2Kdone\n"


def test_beside_the_text_the_line_is_a_footer_one_row_below_the_cursor():
    stream = io.StringIO()
    status = TerminalStatus(stream, is_footer=True)
    status.show("a")
    status.clear()
    status.show("y" * 100)  # cut to the fallback width of 80, less one column
    status.finish("z" * 100)  # printed whole: it may wrap, nothing redraws it
    draw = "\x1bD\x1bM" + "\x1b7\x1bD\r\x1b[2Ka\x1b8"  # make room below (scrolls at the bottom), draw there
    erase = "\x1b7\x1bD\r\x1b[2K\x1b8"
    long_draw = draw.replace("a", "y" * 79)
    assert stream.getvalue() == draw + erase + long_draw + erase + "z" * 100 + "\n"


def test_streams_that_are_no_terminal_do_not_share_one():
    assert not shares_terminal(io.StringIO(), io.StringIO())


def test_the_column_follows_wrapping_wide_characters_and_controls():
    cursor = CursorColumn()
    cursor.advance("x" * 10, width=10)
    assert cursor.is_wrap_pending(10)  # the row is full: the next character starts the next row
    cursor.advance("y", width=10)
    assert cursor.column == 1
    cursor.advance("日本", width=10)  # two columns each
    assert cursor.column == 5
    cursor.advance("e\u0301\u200b", width=10)  # a combining accent and a zero-width space take none
    assert cursor.column == 6
    cursor.advance("\t", width=10)
    assert cursor.column == 8
    cursor.advance("x日", width=10)  # two columns do not fit in the row's last one: it starts the next row
    assert cursor.column == 2
    cursor.advance("ab\nc", width=10)
    assert cursor.column == 1


def test_the_footer_waits_while_a_wrap_is_pending():
    stream = io.StringIO()
    status = TerminalStatus(stream, is_footer=True)
    status.wrote("x" * 80)  # a full row at the fallback width of 80
    status.show("a")
    assert stream.getvalue() == ""
    status.wrote("x")
    status.show("a")
    assert stream.getvalue().endswith("a\x1b8")
