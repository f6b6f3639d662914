"""`dpgate generate` on a real terminal (tmux), as a new user first meets it.

The first test is the README's quick start: `dpgate serve` with no model flag (SmolLM2, the packaged
default; only the port is chosen free), then `dpgate generate` typed into a shell. The screen must
show the generated text, exactly as the client receives it, and below it the final status line;
the bytes the pane received must show the live status redrawn as tokens arrived. The second test
drives the footer through wrapped rows and a scrolling screen in a small pane.
"""

from __future__ import annotations

import re

import pytest

from dpgate.client import DpgateClient, GenerationOptions
from tests.support.processes import free_port, running
from tests.support.tmux_session import TmuxSession

PROMPT = "The capital of France is"
FINAL_LINE = re.compile(
    r"TTFT \d+\.\d{3} s, \d+\.\d tok/s, (\d+) prompt \+ (\d+) generated tokens in \d+\.\d\d s, finish: (\w+)"
)
LIVE_LINE = re.compile(r"TTFT \d+\.\d{3} s, \d+\.\d tok/s, (\d+) tokens\x1b8")


@pytest.fixture
def tmux_factory(tmp_path):
    sessions: list[TmuxSession] = []

    def start(width: int, height: int) -> TmuxSession:
        sessions.append(TmuxSession(tmp_path, width, height))
        return sessions[-1]

    try:
        yield start
    finally:
        for session in sessions:
            session.kill()


@pytest.fixture
def quick_start_server(log_dir):
    """`dpgate serve --port P`: the README's quick start on a free port, awaited until SERVING."""
    port = free_port()
    flags = ["serve", "--port", str(port), "--http-port", "0"]
    with running(flags, port, timeout=120, log_path=str(log_dir / "quick-start-serve.log")) as serve:
        yield serve.address


def is_finished(history: str) -> bool:
    return FINAL_LINE.search(history) is not None and history.rstrip().endswith("$")


def test_the_quick_start_on_a_terminal(quick_start_server, tmux_factory):
    with DpgateClient(quick_start_server, timeout=60) as client:
        expected = client.generate(PROMPT, GenerationOptions(max_tokens=32, temperature=0.0)).text
    terminal = tmux_factory(120, 30)
    command = f'dpgate generate "{PROMPT}" --max-tokens 32 --temperature 0 --address {quick_start_server}'
    terminal.type_line(command)
    history = terminal.wait_for(is_finished, timeout=60)
    print(f"The terminal showed:\n{terminal.screen()}")  # the README's "Try it" section quotes this screen

    rows = [row.rstrip() for row in history.rstrip().split("\n")]
    start = rows.index(f"$ {command}")
    # The text exactly as the client received it, its line ended, then the final status line and the prompt.
    assert rows[start + 1 : -2] == [line.rstrip() for line in expected.split("\n")]
    final = FINAL_LINE.fullmatch(rows[-2])
    assert final is not None, rows[-2]
    assert final.groups() == ("5", "32", "length")
    assert rows[-1] == "$"
    # While the tokens came, the status was redrawn with a growing count.
    received = terminal.received()
    assert "waiting for the first token" in received
    counts = [int(count) for count in LIVE_LINE.findall(received)]
    assert len(counts) >= 10 and counts == sorted(counts) and counts[-1] == 32


def test_the_footer_survives_wrapped_rows_and_scrolling(plain_gateway, tmux_factory):
    """130 one-column tokens in a 40 x 6 pane: rows fill exactly (a pending wrap) three times, the screen scrolls."""
    terminal = tmux_factory(40, 6)
    command = f"dpgate generate hi --address {plain_gateway.address} --max-tokens 130"
    terminal.type_line(command)
    history = terminal.wait_for(is_finished, timeout=30)
    lines = [line.rstrip() for line in history.rstrip().split("\n")]
    start = lines.index(f"$ {command}")
    assert lines[start + 1] == "x" * 130  # the rows joined: not one character lost or overwritten
    assert FINAL_LINE.fullmatch(lines[start + 2]).groups() == ("0", "130", "length")
    assert lines[start + 3 :] == ["$"]
    assert terminal.screen().rstrip().split("\n")[-1] == "$"  # the screen scrolled: the prompt is on its last row
