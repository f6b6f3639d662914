"""How `dpgate chat` writes an answer to the terminal: reasoning apart, tool calls as calls.

An answer arrives as items of three kinds (dpgate/client/chat_results.py); this view keeps each kind
visually apart so a reader never mistakes the model's thinking for its answer:

- reasoning: every line prefixed `thinking: `, and on a styled terminal dim (SGR 2);
- content: the answer's text as it is, flowing as it arrives;
- a tool call: its own line, `tool call NAME(ARGUMENTS)` with the arguments as readable JSON.

Each switch of kind starts a fresh line, and blank lines at a section's edges are dropped (a model
writes `\\n\\n` around `</think>`), so the screen shows sections, not the model's spacing. Every
styled write carries its own reset, so an answer cut off by Ctrl-C never leaves the terminal dim.
Plain data in, text out: the view is tested against a StringIO.
"""

from __future__ import annotations

import json
import re
from typing import TextIO

from dpgate.client.chat_messages import ToolCall
from dpgate.client.chat_results import ChatItem, ContentDelta, ReasoningDelta, ToolCallItem
from dpgate.client.results import Finish, FinishReason

REASONING_PREFIX = "thinking: "
TOOL_CALL_PREFIX = "tool call "
CANCELLED_LINE = "[answer cancelled]"
LENGTH_LINE = "[answer cut short: --max-tokens reached]"
DIM = "\x1b[2m"
BOLD = "\x1b[1m"
RESET = "\x1b[0m"
_LINE_PIECES = re.compile(r"[^\n]*\n|[^\n]+")


def tool_call_text(call: ToolCall) -> str:
    """`NAME(ARGUMENTS)`, the arguments re-spaced as readable JSON when they parse, else as sent."""
    try:
        arguments = json.dumps(json.loads(call.arguments), ensure_ascii=False)
    except ValueError:
        arguments = call.arguments
    return f"{call.name}({arguments})"


class AnswerView:
    """Writes one answer after another to `out`; `styled` adds SGR dim and bold (a terminal)."""

    def __init__(self, out: TextIO, styled: bool) -> None:
        self._out = out
        self._styled = styled
        self._section: type | None = None
        self._is_fresh = True  # nothing written yet in this section
        self._pending = ""  # trailing newlines held back until more text of the section comes
        self._at_line_start = True

    def show(self, item: ChatItem) -> None:
        if isinstance(item, ReasoningDelta):
            self._section_text(ReasoningDelta, item.text, REASONING_PREFIX, DIM)
        elif isinstance(item, ContentDelta):
            self._section_text(ContentDelta, item.text, "", "")
        elif isinstance(item, ToolCallItem):
            self._break()
            self._write(TOOL_CALL_PREFIX + tool_call_text(item.tool_call), BOLD)
            self._write("\n", "")
            self._at_line_start = True
        self._out.flush()

    def end(self, finish: Finish | None) -> None:
        """Close the answer's last line; say so when max_tokens cut it short."""
        self._break()
        if finish is not None and finish.reason == FinishReason.LENGTH:
            self.note(LENGTH_LINE)
        self._out.flush()

    def cancelled(self) -> None:
        self._break()
        self.note(CANCELLED_LINE)
        self._out.flush()

    def note(self, text: str) -> None:
        """One line of the command's own (not the model's), dim on a terminal."""
        self._break()
        self._write(text, DIM)
        self._write("\n", "")

    def _section_text(self, section: type, text: str, prefix: str, style: str) -> None:
        if self._section is not section:
            self._break()
            self._section = section
        text = self._pending + text
        if self._is_fresh:
            text = text.lstrip("\n")
        body = text.rstrip("\n")
        self._pending = text[len(body) :]
        if not body:
            return
        self._is_fresh = False
        for piece in _LINE_PIECES.findall(body):
            if self._at_line_start and prefix and piece != "\n":
                piece = prefix + piece
            self._write(piece.removesuffix("\n"), style)
            if piece.endswith("\n"):
                self._write("\n", "")
            self._at_line_start = piece.endswith("\n")

    def _break(self) -> None:
        """End the current section: its held-back blank lines are dropped, its last line closed."""
        if not self._at_line_start:
            self._write("\n", "")
            self._at_line_start = True
        self._section = None
        self._is_fresh = True
        self._pending = ""

    def _write(self, text: str, style: str) -> None:
        if not text:
            return
        self._out.write(f"{style}{text}{RESET}" if self._styled and style else text)
