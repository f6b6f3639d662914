"""The live status line of `dpgate generate`: time to first token and tokens/s, on the terminal only.

`GenerationClock` is the arithmetic (plain numbers in, text out). `TerminalStatus` draws its text on
stderr, and only when stderr is a terminal, so that stdout stays exactly the generated text when it
is piped or redirected. Two layouts, because the text and the status may share one screen:

- stdout elsewhere (piped, a file): the status is the terminal's only output, redrawn in place
  with `\\r` and erase-line.
- stdout on the same terminal: the status is a footer on the row below the text. After each chunk
  of text it moves down one row with IND (ESC D, which scrolls at the bottom and keeps the column),
  back up with RI (ESC M), saves the cursor, draws the footer on the row below and restores the
  cursor at the end of the text. Before the next chunk it erases the footer the same way, so text
  that wraps onto that row never mixes with stale status characters. One state cannot survive
  those moves: a row filled to its last column leaves the cursor there with the wrap pending,
  and any cursor movement cancels the wrap, so the next character would overwrite the row's last
  one (tmux showed exactly that). `CursorColumn` follows the text's column (character widths as
  terminals count them) and the footer waits out that state.

At the end the footer is erased and the final line printed below the text with a newline.
"""

from __future__ import annotations

import os
import unicodedata
from dataclasses import dataclass
from typing import TextIO

from dpgate.client.results import Finish

SAVE, RESTORE, INDEX, REVERSE_INDEX = "\x1b7", "\x1b8", "\x1bD", "\x1bM"
ERASE_LINE = "\r\x1b[2K"


@dataclass(slots=True)
class GenerationClock:
    """Times of one generation in seconds on one monotonic clock; counts of tokens received."""

    started: float
    first_token: float | None = None
    last_token: float | None = None
    num_tokens: int = 0
    num_first_tokens: int = 0

    def on_tokens(self, num_tokens: int, now: float) -> None:
        if num_tokens <= 0:
            return
        if self.first_token is None:
            self.first_token, self.num_first_tokens = now, num_tokens
        self.last_token = now
        self.num_tokens += num_tokens

    def tokens_per_second(self) -> float | None:
        """The decode rate: tokens after the first step over the time since it (None before two steps)."""
        if self.first_token is None or self.last_token is None or self.last_token <= self.first_token:
            return None
        return (self.num_tokens - self.num_first_tokens) / (self.last_token - self.first_token)

    def live_text(self, now: float) -> str:
        if self.first_token is None:
            return f"waiting for the first token ({now - self.started:.1f} s)"
        parts = [f"TTFT {self.first_token - self.started:.3f} s"]
        rate = self.tokens_per_second()
        if rate is not None:
            parts.append(f"{rate:.1f} tok/s")
        parts.append(f"{self.num_tokens} token{'s' if self.num_tokens != 1 else ''}")
        return ", ".join(parts)

    def final_text(self, finish: Finish, now: float) -> str:
        parts = []
        if self.first_token is not None:
            parts.append(f"TTFT {self.first_token - self.started:.3f} s")
        rate = self.tokens_per_second()
        if rate is not None:
            parts.append(f"{rate:.1f} tok/s")
        usage = finish.usage
        parts.append(
            f"{usage.prompt_tokens} prompt + {usage.completion_tokens} generated tokens in {now - self.started:.2f} s"
        )
        parts.append(f"finish: {finish.reason}")
        return ", ".join(parts)


def char_width(char: str) -> int:
    """Columns a terminal gives `char`: 0 for controls and combining marks, 2 for wide East Asian forms."""
    if char < " " or "\x7f" <= char < "\xa0":
        return 0
    if unicodedata.combining(char) or unicodedata.category(char) in ("Mn", "Me", "Cf"):
        return 0
    return 2 if unicodedata.east_asian_width(char) in ("W", "F") else 1


class CursorColumn:
    """The cursor's column after the text written so far; `width` columns means a wrap is pending."""

    __slots__ = ("column",)

    def __init__(self) -> None:
        self.column = 0

    def advance(self, text: str, width: int) -> None:
        for char in text:
            if char in "\r\n":
                self.column = 0
            elif char == "\t":
                if self.column < width:
                    self.column = min((self.column // 8 + 1) * 8, width - 1)
            elif char == "\b":
                self.column = max(0, min(self.column, width - 1) - 1)
            else:
                columns = char_width(char)
                if columns:
                    # A character that does not fit on the row (or one after a pending wrap) starts the next.
                    self.column = columns if self.column + columns > width else self.column + columns

    def is_wrap_pending(self, width: int) -> bool:
        return self.column >= width


def shares_terminal(first: TextIO, second: TextIO) -> bool:
    """True when both streams are the same terminal device (so their output shares one screen)."""
    try:
        if not (first.isatty() and second.isatty()):
            return False
        a, b = os.fstat(first.fileno()), os.fstat(second.fileno())
    except (OSError, ValueError):
        return False
    return (a.st_rdev, a.st_dev) == (b.st_rdev, b.st_dev)


class TerminalStatus:
    """Draws the status text on `stream` (stderr); `is_footer` when the generated text shares the screen."""

    def __init__(self, stream: TextIO, *, is_footer: bool) -> None:
        self.stream = stream
        self.is_footer = is_footer
        self._is_shown = False
        self._cursor = CursorColumn()

    def wrote(self, text: str) -> None:
        """Tell the footer what the generated text put on the screen since the last call."""
        if self.is_footer:
            self._cursor.advance(text, self._width())

    def _width(self) -> int:
        try:
            return os.get_terminal_size(self.stream.fileno()).columns
        except (OSError, ValueError):
            return 80

    def _fit(self, text: str) -> str:
        # One column short of the width: a full row would leave the cursor pending a wrap.
        return text[: max(1, self._width() - 1)]

    def show(self, text: str) -> None:
        if self.is_footer:
            if self._cursor.is_wrap_pending(self._width()):
                return  # moving the cursor now would cancel the wrap; the next chunk redraws
            body = INDEX + REVERSE_INDEX + SAVE + INDEX + ERASE_LINE + self._fit(text) + RESTORE
        else:
            body = ERASE_LINE + self._fit(text)
        self.stream.write(body)
        self.stream.flush()
        self._is_shown = True

    def clear(self) -> None:
        if not self._is_shown:
            return
        self.stream.write(SAVE + INDEX + ERASE_LINE + RESTORE if self.is_footer else ERASE_LINE)
        self.stream.flush()
        self._is_shown = False

    def finish(self, text: str) -> None:
        """Erase the live line and print `text` whole as the last line (the caller ended the text's line)."""
        self.clear()
        self.stream.write(text + "\n")
        self.stream.flush()
