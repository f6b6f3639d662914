"""The status line's arithmetic and the bytes it writes (the tmux test shows what a screen makes of them)."""

from __future__ import annotations

import io

from gateway.client_results import Finish, FinishReason, Usage
from gateway.generate_status import GenerationClock, TerminalStatus, shares_terminal


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
    status.finish("x" * 100)  # cut to the fallback width of 80, less one column
    draw = "\x1bD\x1bM" + "\x1b7\x1bD\r\x1b[2Ka\x1b8"  # make room below (scrolls at the bottom), draw there
    erase = "\x1b7\x1bD\r\x1b[2K\x1b8"
    assert stream.getvalue() == draw + erase + "x" * 79 + "\n"


def test_streams_that_are_no_terminal_do_not_share_one():
    assert not shares_terminal(io.StringIO(), io.StringIO())
