"""`dpgate chat` on a real terminal (tmux): a conversation with SmolLM2 behind a gateway.

Typed like a user would: a first question answered in full, a second one whose long answer is
cancelled with Ctrl-C while it streams, then a third question answered. The screen must show the
first answer (as the client receives it for the same greedy request), the cancellation and the
prompt back; the engine must have stopped the cancelled request (nothing running, its request
log line CANCELLED with fewer tokens than asked); the third request must carry the first exchange
but not the cancelled one; Ctrl-C on a typed line must discard it and stay, and Ctrl-C at the
empty prompt must leave with status 0.
"""

from __future__ import annotations

import re
import time

import pytest

from dpgate.cli.chat_view import CANCELLED_LINE
from dpgate.client import DpgateClient, GenerationOptions
from tests.dpgate.client.test_chat_client_e2e import wait_nothing_running
from tests.support.tmux_session import open_terminal

FIRST = "What is the capital of France? Answer in one sentence."
SECOND = "Write a very long story about a dragon who learns to bake bread."
THIRD = "Thank you. Name one famous museum there."
MAX_TOKENS = 1500
OK_LINE = re.compile(r"ChatStream OK: (\d+) prompt tokens")


def _after(history: str, marker: str) -> str:
    return history.rsplit(marker, 1)[1] if marker in history else ""


def _prompt_is_back(history: str, marker: str) -> bool:
    """The answer to the line typed at `> {marker}` has ended and `> ` waits again."""
    return _after(history, f"> {marker}").rstrip().endswith("\n>")


@pytest.fixture
def terminal(tmp_path):
    with open_terminal(tmp_path, 120, 30) as session:
        yield session


def test_two_turns_one_cancelled_with_ctrl_c(smollm2_chat_server, terminal, request) -> None:
    address = smollm2_chat_server.gateway.address
    greedy = GenerationOptions(max_tokens=MAX_TOKENS, temperature=0.0)
    with DpgateClient(address, timeout=120) as client:
        first_content = client.chat([{"role": "user", "content": FIRST}], greedy).content
    first_answer = first_content.strip()
    assert first_answer

    terminal.type_line(f"dpgate chat --address {address} --max-tokens {MAX_TOKENS} --temperature 0")
    terminal.wait_for(lambda history: history.rstrip().endswith("\n>"), timeout=30)
    terminal.type_line(FIRST)
    terminal.wait_for(lambda history: _prompt_is_back(history, FIRST), timeout=120)

    terminal.type_line(SECOND)
    # Cancel while it streams: once a few words of the story are on the screen.
    terminal.wait_for(lambda history: len(_after(history, f"> {SECOND}").split()) >= 6, timeout=60)
    terminal._tmux("send-keys", "C-c")
    cancelled_at = time.monotonic()
    screen = terminal.wait_for(lambda history: _prompt_is_back(history, SECOND), timeout=15)
    assert CANCELLED_LINE in _after(screen, f"> {SECOND}")
    wait_nothing_running(smollm2_chat_server.engine, timeout=15 - (time.monotonic() - cancelled_at))

    terminal.type_line(THIRD)
    screen = terminal.wait_for(lambda history: _prompt_is_back(history, THIRD), timeout=120)
    third_answer = _after(screen, f"> {THIRD}").rsplit("\n>", 1)[0].strip()
    assert third_answer and "dpgate chat:" not in third_answer

    terminal._tmux("send-keys", "-l", "a line typed but not sent")
    terminal._tmux("send-keys", "C-c")  # on a typed line: the line is discarded, the chat goes on
    terminal.wait_for(lambda history: _after(history, "not sent").rstrip().endswith("\n>"), timeout=15)
    terminal._tmux("send-keys", "C-c")  # at the empty prompt: leave
    terminal.wait_for(lambda history: history.rstrip().endswith("$"), timeout=15)
    terminal.type_line('echo "exit=$?"')
    screen = terminal.wait_for(lambda history: "\nexit=" in history, timeout=15)
    request.node.user_properties.append(("screen", screen))
    print(f"--- the terminal ---\n{screen}--- end ---")

    assert "exit=0" in screen
    assert first_answer.splitlines()[0] in _after(screen, f"> {FIRST}")
    log = smollm2_chat_server.engine.log_path.read_text().splitlines()
    cancelled = [line for line in log if "ChatStream CANCELLED" in line]
    assert cancelled and int(cancelled[-1].split(" prompt tokens, ", 1)[1].split(" generated", 1)[0]) < MAX_TOKENS

    # The third request carried the first exchange and not the cancelled one: same prompt size as
    # the conversation rebuilt here without it.
    history = [
        {"role": "user", "content": FIRST},
        {"role": "assistant", "content": first_content},
        {"role": "user", "content": THIRD},
    ]
    with DpgateClient(address, timeout=120) as client:
        expected = client.chat(history, GenerationOptions(max_tokens=1)).usage.prompt_tokens
    third_request = [int(match[1]) for line in log if (match := OK_LINE.search(line))][-1]
    assert third_request == expected
